// The driver API subset that nvcc's static runtime fetches for memory, streams
// and events, over the same simulated device as the runtime API. The library
// is also installed as libcuda.so.1, so a program that opens the driver the
// way the static runtime does (dlopen, then dlsym of cuGetProcAddress_v2, then
// every entry point through it) runs here. Each function calls the runtime
// function of the same meaning inside this library (linked with
// -Bsymbolic-functions: a preloaded cudaMalloc does not catch these calls).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <span>
#include <vector>

#include "sim/driver_caller.hpp"
#include "sim/ptsz.h"
#include "sim/runtime_state.hpp"
#include "sim/vmm.hpp"

namespace {

// The runtime's error codes are the driver's numbers for every code used here.
CUresult cu(cudaError_t err) { return static_cast<CUresult>(err); }
void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
cudaStream_t rt(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t rt(CUevent e) { return reinterpret_cast<cudaEvent_t>(e); }

// A context is its device, plus one (never null).
CUcontext context_of(int device) { return reinterpret_cast<CUcontext>(static_cast<uintptr_t>(device) + 1); }

CUresult init(unsigned int) { return CUDA_SUCCESS; }
CUresult driver_version(int* v) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult device_count(int* n) { return cu(cudaGetDeviceCount(n)); }
CUresult ctx_get_device(CUdevice* d) { return cu(cudaGetDevice(d)); }
CUresult primary_ctx_retain(CUcontext* ctx, CUdevice d) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (ctx == nullptr || d < 0 || d >= n) return CUDA_ERROR_INVALID_VALUE;
  *ctx = context_of(d);
  return CUDA_SUCCESS;
}
CUresult ctx_set_current(CUcontext ctx) {
  if (ctx == nullptr) return CUDA_SUCCESS;
  return cu(cudaSetDevice(static_cast<int>(reinterpret_cast<uintptr_t>(ctx) - 1)));
}
CUresult ctx_get_current(CUcontext* ctx) {
  int d = 0;
  cudaGetDevice(&d);
  *ctx = context_of(d);
  return CUDA_SUCCESS;
}
CUresult ctx_synchronize() {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaDeviceSynchronize());
}
// The context stack of this thread, below the current one.
thread_local std::vector<int> t_pushed;
CUresult ctx_push_current(CUcontext ctx) {
  int current = 0;
  cudaGetDevice(&current);
  if (const CUresult r = ctx_set_current(ctx); r != CUDA_SUCCESS) return r;
  t_pushed.push_back(current);
  return CUDA_SUCCESS;
}
CUresult ctx_pop_current(CUcontext* popped) {
  if (t_pushed.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (popped != nullptr) ctx_get_current(popped);
  cudaSetDevice(t_pushed.back());
  t_pushed.pop_back();
  return CUDA_SUCCESS;
}
CUresult ctx_enable_peer_access(CUcontext peer, unsigned int flags) {
  if (peer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cu(cudaDeviceEnablePeerAccess(static_cast<int>(reinterpret_cast<uintptr_t>(peer) - 1), flags));
}
CUresult ctx_disable_peer_access(CUcontext peer) {
  if (peer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cu(cudaDeviceDisablePeerAccess(static_cast<int>(reinterpret_cast<uintptr_t>(peer) - 1)));
}
CUresult primary_ctx_reset(CUdevice d) {
  int current = 0;
  cudaGetDevice(&current);
  if (const cudaError_t err = cudaSetDevice(d); err != cudaSuccess) return cu(err);
  const cudaError_t err = cudaDeviceReset();
  cudaSetDevice(current);
  return cu(err);
}

CUresult mem_alloc(CUdeviceptr* p, size_t n) { return cu(cudaMalloc(reinterpret_cast<void**>(p), n)); }
// A driver call leaves the runtime's last error as it was (its answer is its
// CUresult); the runtime's call behind it would set it on failure. Only the
// frees, the IPC handle and the captures' begins and ends so far: the other
// calls still pass theirs on.
template <typename Call>
CUresult keeping_last_error(Call&& call) {
  const cudaError_t kept = simcuda::rt::t_last_error;
  const CUresult r = cu(call());
  simcuda::rt::t_last_error = kept;
  return r;
}
CUresult mem_free(CUdeviceptr p) {
  return keeping_last_error([p] { return cudaFree(ptr(p)); });
}
CUresult mem_alloc_pitch(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned int element_bytes) {
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) return CUDA_ERROR_INVALID_VALUE;
  return cu(cudaMallocPitch(reinterpret_cast<void**>(p), pitch, width, height));
}
CUresult mem_alloc_async(CUdeviceptr* p, size_t n, CUstream s) {
  return cu(cudaMallocAsync(reinterpret_cast<void**>(p), n, rt(s)));
}
CUresult mem_alloc_async_ptsz(CUdeviceptr* p, size_t n, CUstream s) {
  return cu(cudaMallocAsync_ptsz(reinterpret_cast<void**>(p), n, rt(s)));
}
CUresult mem_alloc_from_pool_async(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) {
  return cu(cudaMallocFromPoolAsync(reinterpret_cast<void**>(p), n, reinterpret_cast<cudaMemPool_t>(pool), rt(s)));
}
CUresult mem_alloc_from_pool_async_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) {
  return cu(cudaMallocFromPoolAsync_ptsz(reinterpret_cast<void**>(p), n, reinterpret_cast<cudaMemPool_t>(pool), rt(s)));
}
CUresult mem_free_async(CUdeviceptr p, CUstream s) {
  return keeping_last_error([=] { return cudaFreeAsync(ptr(p), rt(s)); });
}
CUresult mem_free_async_ptsz(CUdeviceptr p, CUstream s) {
  return keeping_last_error([=] { return cudaFreeAsync_ptsz(ptr(p), rt(s)); });
}
CUresult mem_get_info(size_t* free_bytes, size_t* total) { return cu(cudaMemGetInfo(free_bytes, total)); }
CUresult mem_pool_trim_to(CUmemoryPool pool, size_t keep) {
  return cu(cudaMemPoolTrimTo(reinterpret_cast<cudaMemPool_t>(pool), keep));
}
CUresult mem_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return cu(cudaMemPoolGetAttribute(reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return cu(cudaMemPoolSetAttribute(reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult mem_pool_create(CUmemoryPool* pool, const CUmemPoolProps* props) {
  static_assert(sizeof(CUmemPoolProps) == sizeof(cudaMemPoolProps));
  return cu(cudaMemPoolCreate(reinterpret_cast<cudaMemPool_t*>(pool), reinterpret_cast<const cudaMemPoolProps*>(props)));
}
CUresult mem_pool_destroy(CUmemoryPool pool) { return cu(cudaMemPoolDestroy(reinterpret_cast<cudaMemPool_t>(pool))); }
CUresult device_set_mem_pool(CUdevice device, CUmemoryPool pool) {
  return cu(cudaDeviceSetMemPool(device, reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult device_get_default_mem_pool(CUmemoryPool* pool, CUdevice device) {
  return cu(cudaDeviceGetDefaultMemPool(reinterpret_cast<cudaMemPool_t*>(pool), device));
}
CUresult device_get_mem_pool(CUmemoryPool* pool, CUdevice device) {
  return cu(cudaDeviceGetMemPool(reinterpret_cast<cudaMemPool_t*>(pool), device));
}
CUresult mem_pool_set_access(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  static_assert(sizeof(CUmemAccessDesc) == sizeof(cudaMemAccessDesc));
  return cu(cudaMemPoolSetAccess(reinterpret_cast<cudaMemPool_t>(pool), reinterpret_cast<const cudaMemAccessDesc*>(map),
                                 count));
}
CUresult mem_pool_get_access(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  return cu(cudaMemPoolGetAccess(reinterpret_cast<cudaMemAccessFlags*>(flags), reinterpret_cast<cudaMemPool_t>(pool),
                                 reinterpret_cast<cudaMemLocation*>(location)));
}
// CUDA 13's pools by location.
static_assert(sizeof(CUmemLocation) == sizeof(cudaMemLocation));
static_assert(static_cast<int>(CU_MEM_ALLOCATION_TYPE_PINNED) == static_cast<int>(cudaMemAllocationTypePinned));
CUresult mem_set_mem_pool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  return cu(cudaMemSetMemPool(reinterpret_cast<cudaMemLocation*>(location), static_cast<cudaMemAllocationType>(type),
                              reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult mem_get_mem_pool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  return cu(cudaMemGetMemPool(reinterpret_cast<cudaMemPool_t*>(pool), reinterpret_cast<cudaMemLocation*>(location),
                              static_cast<cudaMemAllocationType>(type)));
}
CUresult mem_get_default_mem_pool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  return cu(cudaMemGetDefaultMemPool(reinterpret_cast<cudaMemPool_t*>(pool),
                                     reinterpret_cast<cudaMemLocation*>(location),
                                     static_cast<cudaMemAllocationType>(type)));
}
CUresult memcpy_htod(CUdeviceptr dst, const void* src, size_t n) {
  return cu(cudaMemcpy(ptr(dst), src, n, cudaMemcpyHostToDevice));
}
CUresult memcpy_htod_async(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return cu(cudaMemcpyAsync(ptr(dst), src, n, cudaMemcpyHostToDevice, rt(s)));
}
CUresult memcpy_htod_async_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return cu(cudaMemcpyAsync_ptsz(ptr(dst), src, n, cudaMemcpyHostToDevice, rt(s)));
}
CUresult memcpy_dtoh(void* dst, CUdeviceptr src, size_t n) {
  return cu(cudaMemcpy(dst, ptr(src), n, cudaMemcpyDeviceToHost));
}
CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  static_assert(sizeof(CUipcMemHandle) == sizeof(cudaIpcMemHandle_t));
  return keeping_last_error([=] { return cudaIpcGetMemHandle(reinterpret_cast<cudaIpcMemHandle_t*>(handle), ptr(p)); });
}

CUresult stream_create(CUstream* s, unsigned int flags) {
  return cu(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(s), flags));
}
CUresult stream_create_with_priority(CUstream* s, unsigned int flags, int priority) {
  return cu(cudaStreamCreateWithPriority(reinterpret_cast<cudaStream_t*>(s), flags, priority));
}
CUresult stream_destroy(CUstream s) { return cu(cudaStreamDestroy(rt(s))); }
// The stream's device's context (each device has one here).
CUresult stream_ctx_through(cudaError_t (*get_device)(cudaStream_t, int*), CUstream s, CUcontext* ctx) {
  int device = -1;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (const cudaError_t err = get_device(rt(s), &device); err != cudaSuccess) return cu(err);
  *ctx = context_of(device);
  return CUDA_SUCCESS;
}
CUresult stream_get_ctx(CUstream s, CUcontext* ctx) { return stream_ctx_through(cudaStreamGetDevice, s, ctx); }
CUresult stream_get_ctx_ptsz(CUstream s, CUcontext* ctx) { return stream_ctx_through(cudaStreamGetDevice_ptsz, s, ctx); }
CUresult stream_get_flags(CUstream s, unsigned int* flags) { return cu(cudaStreamGetFlags(rt(s), flags)); }
CUresult stream_get_flags_ptsz(CUstream s, unsigned int* flags) { return cu(cudaStreamGetFlags_ptsz(rt(s), flags)); }
CUresult stream_synchronize(CUstream s) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaStreamSynchronize(rt(s)));
}
CUresult stream_synchronize_ptsz(CUstream s) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaStreamSynchronize_ptsz(rt(s)));
}
CUresult stream_query(CUstream s) { return cu(cudaStreamQuery(rt(s))); }
CUresult stream_query_ptsz(CUstream s) { return cu(cudaStreamQuery_ptsz(rt(s))); }
CUresult stream_wait_event(CUstream s, CUevent e, unsigned int flags) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaStreamWaitEvent(rt(s), rt(e), flags));
}
CUresult stream_wait_event_ptsz(CUstream s, CUevent e, unsigned int flags) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaStreamWaitEvent_ptsz(rt(s), rt(e), flags));
}
CUresult launch_host_func(CUstream s, CUhostFn fn, void* data) { return cu(cudaLaunchHostFunc(rt(s), fn, data)); }
CUresult launch_host_func_ptsz(CUstream s, CUhostFn fn, void* data) {
  return cu(cudaLaunchHostFunc_ptsz(rt(s), fn, data));
}
// The first capture call took no mode; it captured as the global mode does.
CUresult begin_capture_v1(CUstream s) {
  return keeping_last_error([=] { return cudaStreamBeginCapture(rt(s), cudaStreamCaptureModeGlobal); });
}
CUresult begin_capture_v1_ptsz(CUstream s) {
  return keeping_last_error([=] { return cudaStreamBeginCapture_ptsz(rt(s), cudaStreamCaptureModeGlobal); });
}
CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  return keeping_last_error([=] { return cudaStreamBeginCapture(rt(s), static_cast<cudaStreamCaptureMode>(mode)); });
}
CUresult begin_capture_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return keeping_last_error(
      [=] { return cudaStreamBeginCapture_ptsz(rt(s), static_cast<cudaStreamCaptureMode>(mode)); });
}
// One for the legacy form and one for the per-thread (_ptsz) one.
template <auto Begin>
CUresult begin_capture_to_graph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                size_t count, CUstreamCaptureMode mode) {
  return keeping_last_error([=] {
    return Begin(rt(s), reinterpret_cast<cudaGraph_t>(g), reinterpret_cast<const cudaGraphNode_t*>(deps),
                 reinterpret_cast<const cudaGraphEdgeData*>(data), count, static_cast<cudaStreamCaptureMode>(mode));
  });
}
CUresult end_capture(CUstream s, CUgraph* g) {
  return keeping_last_error([=] { return cudaStreamEndCapture(rt(s), reinterpret_cast<cudaGraph_t*>(g)); });
}
CUresult end_capture_ptsz(CUstream s, CUgraph* g) {
  return keeping_last_error([=] { return cudaStreamEndCapture_ptsz(rt(s), reinterpret_cast<cudaGraph_t*>(g)); });
}
CUresult exchange_capture_mode(CUstreamCaptureMode* mode) {
  return cu(cudaThreadExchangeStreamCaptureMode(reinterpret_cast<cudaStreamCaptureMode*>(mode)));
}
CUresult is_capturing(CUstream s, CUstreamCaptureStatus* status) {
  return cu(cudaStreamIsCapturing(rt(s), reinterpret_cast<cudaStreamCaptureStatus*>(status)));
}
CUresult is_capturing_ptsz(CUstream s, CUstreamCaptureStatus* status) {
  return cu(cudaStreamIsCapturing_ptsz(rt(s), reinterpret_cast<cudaStreamCaptureStatus*>(status)));
}
CUresult graph_create(CUgraph* g, unsigned int flags) {
  return cu(cudaGraphCreate(reinterpret_cast<cudaGraph_t*>(g), flags));
}
CUresult graph_destroy(CUgraph g) { return cu(cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(g))); }

CUresult event_create(CUevent* e, unsigned int flags) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(e), flags));
}
CUresult event_destroy(CUevent e) { return cu(cudaEventDestroy(rt(e))); }
CUresult event_record(CUevent e, CUstream s) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaEventRecord(rt(e), rt(s)));
}
CUresult event_record_ptsz(CUevent e, CUstream s) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaEventRecord_ptsz(rt(e), rt(s)));
}
CUresult event_query(CUevent e) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaEventQuery(rt(e)));
}
CUresult event_synchronize(CUevent e) {
  simcuda::DriverCaller caller(__builtin_return_address(0));
  return cu(cudaEventSynchronize(rt(e)));
}

struct Entry {
  const char* name;
  int since;          // the first CUDA version whose entry point this is
  void* legacy;       // CU_GET_PROC_ADDRESS_DEFAULT or _LEGACY_STREAM
  void* per_thread;   // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
};

template <typename F>
void* fn(F* f) {
  return reinterpret_cast<void*>(f);
}

// Name and version as cuGetProcAddress takes them; a later row of the same
// name is a later version with another signature. Made at the first lookup, as
// a function's static, which every thread waits for. At namespace scope the
// library's constructor wrote it, and a thread that dlopen()ed the driver as
// another thread's dlopen() ran that constructor waited on glibc's loader
// lock, which ThreadSanitizer does not see: a race it reported now and then
// (test-static-runtime threads), where there was none.
std::span<const Entry> entries() {
  static const Entry kEntries[] = {
      {"cuInit", 2000, fn(init), fn(init)},
      {"cuDriverGetVersion", 2020, fn(driver_version), fn(driver_version)},
      {"cuDeviceGetCount", 2000, fn(device_count), fn(device_count)},
      {"cuCtxGetDevice", 2000, fn(ctx_get_device), fn(ctx_get_device)},
      {"cuCtxSetCurrent", 4000, fn(ctx_set_current), fn(ctx_set_current)},
      {"cuCtxGetCurrent", 4000, fn(ctx_get_current), fn(ctx_get_current)},
      {"cuCtxSynchronize", 2000, fn(ctx_synchronize), fn(ctx_synchronize)},
      {"cuCtxPushCurrent", 4000, fn(ctx_push_current), fn(ctx_push_current)},
      {"cuCtxPopCurrent", 4000, fn(ctx_pop_current), fn(ctx_pop_current)},
      {"cuCtxEnablePeerAccess", 4000, fn(ctx_enable_peer_access), fn(ctx_enable_peer_access)},
      {"cuCtxDisablePeerAccess", 4000, fn(ctx_disable_peer_access), fn(ctx_disable_peer_access)},
      {"cuDevicePrimaryCtxRetain", 7000, fn(primary_ctx_retain), fn(primary_ctx_retain)},
      {"cuDevicePrimaryCtxReset", 7000, fn(primary_ctx_reset), fn(primary_ctx_reset)},
      {"cuMemAlloc", 3020, fn(mem_alloc), fn(mem_alloc)},
      {"cuMemFree", 3020, fn(mem_free), fn(mem_free)},
      {"cuMemAllocPitch", 3020, fn(mem_alloc_pitch), fn(mem_alloc_pitch)},
      {"cuMemAllocAsync", 11020, fn(mem_alloc_async), fn(mem_alloc_async_ptsz)},
      {"cuMemAllocFromPoolAsync", 11020, fn(mem_alloc_from_pool_async), fn(mem_alloc_from_pool_async_ptsz)},
      {"cuMemFreeAsync", 11020, fn(mem_free_async), fn(mem_free_async_ptsz)},
      {"cuMemGetInfo", 3020, fn(mem_get_info), fn(mem_get_info)},
      {"cuMemPoolTrimTo", 11020, fn(mem_pool_trim_to), fn(mem_pool_trim_to)},
      {"cuMemPoolGetAttribute", 11020, fn(mem_pool_get_attribute), fn(mem_pool_get_attribute)},
      {"cuMemPoolSetAttribute", 11020, fn(mem_pool_set_attribute), fn(mem_pool_set_attribute)},
      {"cuMemPoolCreate", 11020, fn(mem_pool_create), fn(mem_pool_create)},
      {"cuMemPoolDestroy", 11020, fn(mem_pool_destroy), fn(mem_pool_destroy)},
      {"cuDeviceSetMemPool", 11020, fn(device_set_mem_pool), fn(device_set_mem_pool)},
      {"cuDeviceGetDefaultMemPool", 11020, fn(device_get_default_mem_pool), fn(device_get_default_mem_pool)},
      {"cuDeviceGetMemPool", 11020, fn(device_get_mem_pool), fn(device_get_mem_pool)},
      {"cuMemPoolSetAccess", 11020, fn(mem_pool_set_access), fn(mem_pool_set_access)},
      {"cuMemPoolGetAccess", 11020, fn(mem_pool_get_access), fn(mem_pool_get_access)},
      {"cuMemSetMemPool", 13000, fn(mem_set_mem_pool), fn(mem_set_mem_pool)},
      {"cuMemGetMemPool", 13000, fn(mem_get_mem_pool), fn(mem_get_mem_pool)},
      {"cuMemGetDefaultMemPool", 13000, fn(mem_get_default_mem_pool), fn(mem_get_default_mem_pool)},
      {"cuMemcpyHtoD", 3020, fn(memcpy_htod), fn(memcpy_htod)},
      {"cuMemcpyDtoH", 3020, fn(memcpy_dtoh), fn(memcpy_dtoh)},
      {"cuMemcpyHtoDAsync", 3020, fn(memcpy_htod_async), fn(memcpy_htod_async_ptsz)},
      {"cuIpcGetMemHandle", 4010, fn(ipc_get_mem_handle), fn(ipc_get_mem_handle)},
      {"cuStreamCreate", 2000, fn(stream_create), fn(stream_create)},
      {"cuStreamCreateWithPriority", 5050, fn(stream_create_with_priority), fn(stream_create_with_priority)},
      {"cuStreamDestroy", 4000, fn(stream_destroy), fn(stream_destroy)},
      {"cuStreamGetFlags", 5050, fn(stream_get_flags), fn(stream_get_flags_ptsz)},
      {"cuStreamGetCtx", 9020, fn(stream_get_ctx), fn(stream_get_ctx_ptsz)},
      {"cuStreamSynchronize", 2000, fn(stream_synchronize), fn(stream_synchronize_ptsz)},
      {"cuStreamQuery", 2000, fn(stream_query), fn(stream_query_ptsz)},
      {"cuStreamWaitEvent", 3020, fn(stream_wait_event), fn(stream_wait_event_ptsz)},
      {"cuLaunchHostFunc", 10000, fn(launch_host_func), fn(launch_host_func_ptsz)},
      {"cuStreamBeginCapture", 10000, fn(begin_capture_v1), fn(begin_capture_v1_ptsz)},
      {"cuStreamBeginCapture", 10010, fn(begin_capture), fn(begin_capture_ptsz)},
      {"cuStreamBeginCaptureToGraph", 12030, fn(begin_capture_to_graph<cudaStreamBeginCaptureToGraph>),
       fn(begin_capture_to_graph<cudaStreamBeginCaptureToGraph_ptsz>)},
      {"cuStreamEndCapture", 10000, fn(end_capture), fn(end_capture_ptsz)},
      {"cuStreamIsCapturing", 10000, fn(is_capturing), fn(is_capturing_ptsz)},
      {"cuThreadExchangeStreamCaptureMode", 10010, fn(exchange_capture_mode), fn(exchange_capture_mode)},
      {"cuGraphCreate", 10000, fn(graph_create), fn(graph_create)},
      {"cuGraphDestroy", 10000, fn(graph_destroy), fn(graph_destroy)},
      {"cuEventCreate", 2000, fn(event_create), fn(event_create)},
      {"cuEventDestroy", 4000, fn(event_destroy), fn(event_destroy)},
      {"cuEventRecord", 2000, fn(event_record), fn(event_record_ptsz)},
      {"cuEventQuery", 2000, fn(event_query), fn(event_query)},
      {"cuEventSynchronize", 2000, fn(event_synchronize), fn(event_synchronize)},
  };
  return kEntries;
}

}  // namespace

extern "C" {

// The 4-argument form, exported under its own name (cuda.h maps the name to _v2).
CUresult get_proc_address_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {  // itself: the 5-argument form from 12.0
    *pfn = version >= 12000 ? reinterpret_cast<void*>(&cuGetProcAddress_v2) : reinterpret_cast<void*>(&get_proc_address_v1);
    found = CU_GET_PROC_ADDRESS_SUCCESS;
  }
  for (const Entry& e : entries()) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    if (e.since > version) {
      if (*pfn == nullptr) found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      continue;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? e.per_thread : e.legacy;
    found = CU_GET_PROC_ADDRESS_SUCCESS;
  }
  if (*pfn == nullptr && found == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) {
    *pfn = simcuda::driver_entry_point(symbol);  // the virtual memory calls
    if (*pfn != nullptr) found = CU_GET_PROC_ADDRESS_SUCCESS;
  }
  if (status != nullptr) *status = found;
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult get_proc_address_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

CUresult cuInit(unsigned int flags) { return init(flags); }
CUresult cuDriverGetVersion(int* version) { return driver_version(version); }

// Some entry points under the names the driver exports them (cuda.h maps
// cuMemAlloc to cuMemAlloc_v2, ...), for a library that fetches each with
// dlsym, as XLA's CUDA stubs do.
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) { return mem_alloc(p, n); }
CUresult cuMemFree(CUdeviceptr p) { return mem_free(p); }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) { return mem_alloc_async(p, n, s); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return mem_free_async(p, s); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t n, CUstream s) { return mem_alloc_async_ptsz(p, n, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) {
  return mem_alloc_from_pool_async(p, n, pool, s);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return mem_free_async_ptsz(p, s); }
CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr p) { return ipc_get_mem_handle(handle, p); }
CUresult cuMemAllocPitch(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned int element_bytes) {
  return mem_alloc_pitch(p, pitch, width, height, element_bytes);
}
CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) { return mem_get_info(free_bytes, total); }
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { return mem_pool_trim_to(pool, keep); }
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return mem_pool_get_attribute(pool, attr, value);
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return mem_pool_set_attribute(pool, attr, value);
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  return device_get_default_mem_pool(pool, device);
}
CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) { return device_set_mem_pool(device, pool); }
CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) { return mem_pool_create(pool, props); }
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return mem_pool_set_access(pool, map, count);
}
CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  return mem_set_mem_pool(location, type, pool);
}
CUresult cuMemPoolDestroy(CUmemoryPool pool) { return mem_pool_destroy(pool); }
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) { return memcpy_htod(dst, src, n); }
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) { return memcpy_dtoh(dst, src, n); }
CUresult cuStreamCreate(CUstream* s, unsigned int flags) { return stream_create(s, flags); }
CUresult cuStreamDestroy(CUstream s) { return stream_destroy(s); }
CUresult cuStreamSynchronize(CUstream s) { return stream_synchronize(s); }
// The capture calls under the names the driver exports: cuda.h maps
// cuStreamBeginCapture to its second version, and each call to its _ptsz
// twin in a build for the per-thread default stream. The first version of
// the begin (no mode) keeps its own name.
CUresult begin_capture_v1_export(CUstream s) __asm__("cuStreamBeginCapture");
CUresult begin_capture_v1_export(CUstream s) { return begin_capture_v1(s); }
CUresult begin_capture_v1_ptsz_export(CUstream s) __asm__("cuStreamBeginCapture_ptsz");
CUresult begin_capture_v1_ptsz_export(CUstream s) { return begin_capture_v1_ptsz(s); }
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) { return begin_capture(s, mode); }
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) { return begin_capture_ptsz(s, mode); }
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                     size_t count, CUstreamCaptureMode mode) {
  return begin_capture_to_graph<cudaStreamBeginCaptureToGraph>(s, g, deps, data, count, mode);
}
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                          size_t count, CUstreamCaptureMode mode) {
  return begin_capture_to_graph<cudaStreamBeginCaptureToGraph_ptsz>(s, g, deps, data, count, mode);
}
CUresult cuStreamEndCapture(CUstream s, CUgraph* g) { return end_capture(s, g); }
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return end_capture_ptsz(s, g); }
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) { return primary_ctx_retain(ctx, d); }
CUresult cuDevicePrimaryCtxReset(CUdevice d) { return primary_ctx_reset(d); }  // exported as _v2
// The first version, under its own name (same parameters).
CUresult primary_ctx_reset_v1(CUdevice d) __asm__("cuDevicePrimaryCtxReset");
CUresult primary_ctx_reset_v1(CUdevice d) { return primary_ctx_reset(d); }
CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx_set_current(ctx); }
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) { return ctx_enable_peer_access(peer, flags); }
CUresult cuCtxDisablePeerAccess(CUcontext peer) { return ctx_disable_peer_access(peer); }

}  // extern "C"
