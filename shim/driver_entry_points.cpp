// The driver entry points gpupool serves to a program built with nvcc's
// default static runtime (with static_runtime:1), or to a library carrying its
// own that static_runtime_libraries names. driver_hook.c in the
// preload library hands the program's runtime a cuGetProcAddress that asks
// driver_entry() about each entry point it fetches; the allocation, stream,
// capture and peer-access calls come back here and go through the same code
// as the shared runtime's (entry_points.cpp), whose calls to "the real
// runtime" are then served by the driver (driver_runtime.cpp).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

#include "config/config.hpp"
#include "shim/caller_runtime.hpp"
#include "shim/core_interface.h"
#include "shim/driver_runtime.hpp"
#include "shim/messages.hpp"
#include "shim/ptsz.h"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"
#include "shim/guard.hpp"

namespace gpupool::shim {

// entry_points.cpp
bool allocate_pitched(void** ptr, size_t* pitch, size_t width, size_t rows, cudaError_t* result);
cudaError_t free_plain(void* ptr, const char* call);
cudaError_t free_stream_ordered(void* ptr, cudaStream_t stream, bool per_thread, const char* call);
cudaError_t reset_in_books(int device, const char* call, const std::function<cudaError_t()>& reset);
cudaError_t begin_capture_in_books(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, const char* call,
                                   const std::function<cudaError_t()>& begin);
void end_capture_in_books(cudaStream_t stream, bool per_thread, cudaError_t err, const char* call);

namespace {

// The driver's numbers for every code these return (see driver_runtime.cpp).
CUresult cu(cudaError_t err) { return static_cast<CUresult>(err); }
void** out(CUdeviceptr* p) { return reinterpret_cast<void**>(p); }
void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
cudaStream_t rt(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaStreamCaptureMode rt(CUstreamCaptureMode m) { return static_cast<cudaStreamCaptureMode>(m); }

CUresult mem_alloc(CUdeviceptr* p, size_t n) { return cu(cudaMalloc(out(p), n)); }
CUresult mem_free(CUdeviceptr p) { return cu(cudaFree(ptr(p))); }
CUresult mem_alloc_async(CUdeviceptr* p, size_t n, CUstream s) { return cu(cudaMallocAsync(out(p), n, rt(s))); }
CUresult mem_alloc_async_ptsz(CUdeviceptr* p, size_t n, CUstream s) {
  return cu(cudaMallocAsync_ptsz(out(p), n, rt(s)));
}
CUresult mem_alloc_from_pool_async(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) {
  return cu(cudaMallocFromPoolAsync(out(p), n, reinterpret_cast<cudaMemPool_t>(pool), rt(s)));
}
CUresult mem_alloc_from_pool_async_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) {
  return cu(cudaMallocFromPoolAsync_ptsz(out(p), n, reinterpret_cast<cudaMemPool_t>(pool), rt(s)));
}
CUresult mem_free_async(CUdeviceptr p, CUstream s) { return cu(cudaFreeAsync(ptr(p), rt(s))); }
CUresult mem_free_async_ptsz(CUdeviceptr p, CUstream s) { return cu(cudaFreeAsync_ptsz(ptr(p), rt(s))); }
CUresult mem_get_info(size_t* free_bytes, size_t* total) { return cu(cudaMemGetInfo(free_bytes, total)); }
CUresult mem_pool_trim_to(CUmemoryPool pool, size_t keep) {
  return cu(cudaMemPoolTrimTo(reinterpret_cast<cudaMemPool_t>(pool), keep));
}
CUresult device_set_mem_pool(CUdevice device, CUmemoryPool pool) {
  return cu(cudaDeviceSetMemPool(device, reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult mem_set_mem_pool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  return cu(cudaMemSetMemPool(reinterpret_cast<cudaMemLocation*>(location), static_cast<cudaMemAllocationType>(type),
                              reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult mem_pool_set_access(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return cu(cudaMemPoolSetAccess(reinterpret_cast<cudaMemPool_t>(pool), reinterpret_cast<const cudaMemAccessDesc*>(map),
                                 count));
}
CUresult mem_pool_destroy(CUmemoryPool pool) { return cu(cudaMemPoolDestroy(reinterpret_cast<cudaMemPool_t>(pool))); }
CUresult mem_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return cu(cudaMemPoolGetAttribute(reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return cu(cudaMemPoolSetAttribute(reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  return cu(cudaIpcGetMemHandle(reinterpret_cast<cudaIpcMemHandle_t*>(handle), ptr(p)));
}
CUresult stream_create(CUstream* s, unsigned int flags) {
  return cu(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(s), flags));
}
CUresult stream_create_with_priority(CUstream* s, unsigned int flags, int priority) {
  return cu(cudaStreamCreateWithPriority(reinterpret_cast<cudaStream_t*>(s), flags, priority));
}
CUresult stream_destroy(CUstream s) { return cu(cudaStreamDestroy(rt(s))); }
// The first capture call took no mode and captured as the global mode does.
CUresult begin_capture_v1(CUstream s) { return cu(cudaStreamBeginCapture(rt(s), cudaStreamCaptureModeGlobal)); }
CUresult begin_capture_v1_ptsz(CUstream s) {
  return cu(cudaStreamBeginCapture_ptsz(rt(s), cudaStreamCaptureModeGlobal));
}
CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) { return cu(cudaStreamBeginCapture(rt(s), rt(mode))); }
CUresult begin_capture_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return cu(cudaStreamBeginCapture_ptsz(rt(s), rt(mode)));
}
CUresult begin_capture_to_graph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                size_t count, CUstreamCaptureMode mode) {
  return cu(cudaStreamBeginCaptureToGraph(rt(s), reinterpret_cast<cudaGraph_t>(g),
                                          reinterpret_cast<const cudaGraphNode_t*>(deps),
                                          reinterpret_cast<const cudaGraphEdgeData*>(data), count, rt(mode)));
}
CUresult begin_capture_to_graph_ptsz(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                     size_t count, CUstreamCaptureMode mode) {
  return cu(cudaStreamBeginCaptureToGraph_ptsz(rt(s), reinterpret_cast<cudaGraph_t>(g),
                                               reinterpret_cast<const cudaGraphNode_t*>(deps),
                                               reinterpret_cast<const cudaGraphEdgeData*>(data), count, rt(mode)));
}
CUresult end_capture(CUstream s, CUgraph* g) {
  return cu(cudaStreamEndCapture(rt(s), reinterpret_cast<cudaGraph_t*>(g)));
}
CUresult end_capture_ptsz(CUstream s, CUgraph* g) {
  return cu(cudaStreamEndCapture_ptsz(rt(s), reinterpret_cast<cudaGraph_t*>(g)));
}

// Three substitutes call the program's own real function (the one it fetched,
// at its version) after or instead of gpupool's part.
std::atomic<void*> real_primary_ctx_reset{nullptr};
std::atomic<void*> real_enable_peer_access{nullptr};
std::atomic<void*> real_disable_peer_access{nullptr};
std::atomic<void*> real_mem_alloc_pitch{nullptr};

template <typename F>
F* real_of(const std::atomic<void*>& slot, F*) {
  return reinterpret_cast<F*>(slot.load());
}

// cudaMallocPitch and cudaMalloc3D of the static runtime: pooled as the shared
// runtime's are. Another element size is the driver's error to give.
CUresult mem_alloc_pitch(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned int element_bytes) {
  // This one and the next reach Runtime directly, so each runs under the
  // guard itself (the others call an entry point that does).
  return cu(guarded("cuMemAllocPitch", [&] {
    cudaError_t err = cudaSuccess;
    const bool valid = element_bytes == 4 || element_bytes == 8 || element_bytes == 16;
    if (valid && allocate_pitched(out(p), pitch, width, height, &err)) return err;
    return static_cast<cudaError_t>(
        real_of(real_mem_alloc_pitch, &mem_alloc_pitch)(p, pitch, width, height, element_bytes));
  }));
}

// A device reset through the driver (`reset`, the driver's own), with the
// pool's books kept around it as at cudaDeviceReset.
template <typename Reset>
CUresult driver_reset_in_books(CUdevice device, Reset&& reset) {
  return cu(reset_in_books(device, "cuDevicePrimaryCtxReset",
                           [&] { return static_cast<cudaError_t>(reset(device)); }));
}

// cudaDeviceReset of the static runtime (both versions of the reset take the device).
CUresult primary_ctx_reset(CUdevice device) {
  return driver_reset_in_books(device, real_of(real_primary_ctx_reset, &primary_ctx_reset));
}

// cudaDeviceEnablePeerAccess of the static runtime: the current device may now
// reach the peer's memory, pooled pages too (as for the shared runtime's).
CUresult ctx_enable_peer_access(CUcontext peer, unsigned int flags) {
  const CUresult r = real_of(real_enable_peer_access, &ctx_enable_peer_access)(peer, flags);
  keep_books("cuCtxEnablePeerAccess", [&] {
    Runtime& runtime = Runtime::get();
    if (r == CUDA_SUCCESS && !runtime.bypass()) {
      if (const int owner = device_of_context(peer); owner >= 0) {
        runtime.access_granted(runtime.current_device(), owner, Runtime::kPeerAccess);
      }
    }
  });
  return r;
}

// Its cudaDeviceDisablePeerAccess: the pooled pages close again.
CUresult ctx_disable_peer_access(CUcontext peer) {
  const CUresult r = real_of(real_disable_peer_access, &ctx_disable_peer_access)(peer);
  keep_books("cuCtxDisablePeerAccess", [&] {
    Runtime& runtime = Runtime::get();
    if (r == CUDA_SUCCESS && !runtime.bypass()) {
      if (const int owner = device_of_context(peer); owner >= 0) {
        runtime.access_revoked(runtime.current_device(), owner, Runtime::kPeerAccess);
      }
    }
  });
  return r;
}

struct Substitute {
  const char* name;
  int since;  // the version from which the program's call has this signature
  int until;  // the version from which it has another (0: none yet)
  void* legacy;
  void* per_thread;
  std::atomic<void*>* real = nullptr;  // where the program's own function is kept, if it is called
};

template <typename F>
void* fn(F* f) {
  return reinterpret_cast<void*>(f);
}

const Substitute kSubstitutes[] = {
    {"cuMemAlloc", 3020, 0, fn(mem_alloc), fn(mem_alloc)},
    {"cuMemFree", 3020, 0, fn(mem_free), fn(mem_free)},
    {"cuMemAllocPitch", 3020, 0, fn(mem_alloc_pitch), fn(mem_alloc_pitch), &real_mem_alloc_pitch},
    {"cuMemAllocAsync", 11020, 0, fn(mem_alloc_async), fn(mem_alloc_async_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, 0, fn(mem_alloc_from_pool_async), fn(mem_alloc_from_pool_async_ptsz)},
    {"cuMemFreeAsync", 11020, 0, fn(mem_free_async), fn(mem_free_async_ptsz)},
    {"cuMemGetInfo", 3020, 0, fn(mem_get_info), fn(mem_get_info)},
    {"cuMemPoolTrimTo", 11020, 0, fn(mem_pool_trim_to), fn(mem_pool_trim_to)},
    {"cuDeviceSetMemPool", 11020, 0, fn(device_set_mem_pool), fn(device_set_mem_pool)},
    {"cuMemSetMemPool", 13000, 0, fn(mem_set_mem_pool), fn(mem_set_mem_pool)},
    {"cuMemPoolSetAccess", 11020, 0, fn(mem_pool_set_access), fn(mem_pool_set_access)},
    {"cuMemPoolDestroy", 11020, 0, fn(mem_pool_destroy), fn(mem_pool_destroy)},
    {"cuMemPoolGetAttribute", 11020, 0, fn(mem_pool_get_attribute), fn(mem_pool_get_attribute)},
    {"cuMemPoolSetAttribute", 11020, 0, fn(mem_pool_set_attribute), fn(mem_pool_set_attribute)},
    {"cuIpcGetMemHandle", 4010, 0, fn(ipc_get_mem_handle), fn(ipc_get_mem_handle)},
    {"cuStreamCreate", 2000, 0, fn(stream_create), fn(stream_create)},
    {"cuStreamCreateWithPriority", 5050, 0, fn(stream_create_with_priority), fn(stream_create_with_priority)},
    {"cuStreamDestroy", 4000, 0, fn(stream_destroy), fn(stream_destroy)},
    {"cuStreamBeginCapture", 10000, 10010, fn(begin_capture_v1), fn(begin_capture_v1_ptsz)},
    {"cuStreamBeginCapture", 10010, 0, fn(begin_capture), fn(begin_capture_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, 0, fn(begin_capture_to_graph), fn(begin_capture_to_graph_ptsz)},
    {"cuStreamEndCapture", 10000, 0, fn(end_capture), fn(end_capture_ptsz)},
    {"cuDevicePrimaryCtxReset", 7000, 0, fn(primary_ctx_reset), fn(primary_ctx_reset), &real_primary_ctx_reset},
    {"cuCtxEnablePeerAccess", 4000, 0, fn(ctx_enable_peer_access), fn(ctx_enable_peer_access),
     &real_enable_peer_access},
    {"cuCtxDisablePeerAccess", 4000, 0, fn(ctx_disable_peer_access), fn(ctx_disable_peer_access),
     &real_disable_peer_access},
};

// Whether to take the program's driver calls over, decided at the first one.
// Off, nothing starts: no report, no signal handler, as before this hook.
bool taking_over(gpupool_driver_lookup_fn lookup) {
  static bool on = false;
  static std::once_flag once;
  std::call_once(once, [lookup] {
    const config::Config c = config::parse_config(config::process_environment()).config;
    if (c.disable || !c.static_runtime) return;
    set_driver_lookup(lookup);  // before anything resolves the real functions
    Runtime::get();
    on = real().cudaMalloc != nullptr;
    if (!on) {
      message(config::LogLevel::Warn,
              "gpupool: static_runtime:1: this CUDA driver lacks an entry point gpupool needs; the program's "
              "memory is not pooled");
    }
  });
  return on;
}

// The names the driver exports its entry points under, for a library that
// fetches each with dlsym instead of cuGetProcAddress (XLA's CUDA stubs do):
// the version and stream semantics cuGetProcAddress would be asked for. Only
// these are swapped; an older export of another signature (cuMemAlloc, with a
// 32-bit pointer) is not listed and stays the driver's.
struct ExportedName {
  const char* exported;
  const char* symbol;
  int version;
  bool per_thread;
};

const ExportedName kExportedNames[] = {
    {"cuMemAlloc_v2", "cuMemAlloc", 3020, false},
    {"cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, false},
    {"cuMemFree_v2", "cuMemFree", 3020, false},
    {"cuMemGetInfo_v2", "cuMemGetInfo", 3020, false},
    {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, false},
    {"cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020, false},
    {"cuMemSetMemPool", "cuMemSetMemPool", 13000, false},
    {"cuMemPoolSetAccess", "cuMemPoolSetAccess", 11020, false},
    {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, false},
    {"cuMemPoolGetAttribute", "cuMemPoolGetAttribute", 11020, false},
    {"cuMemPoolSetAttribute", "cuMemPoolSetAttribute", 11020, false},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, false},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020, true},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, false},
    {"cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", 11020, true},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, false},
    {"cuMemFreeAsync_ptsz", "cuMemFreeAsync", 11020, true},
    {"cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, false},
    {"cuStreamCreate", "cuStreamCreate", 2000, false},
    {"cuStreamCreateWithPriority", "cuStreamCreateWithPriority", 5050, false},
    {"cuStreamDestroy", "cuStreamDestroy", 4000, false},  // the first version, with the same parameters
    {"cuStreamDestroy_v2", "cuStreamDestroy", 4000, false},
    {"cuStreamBeginCapture", "cuStreamBeginCapture", 10000, false},
    {"cuStreamBeginCapture_ptsz", "cuStreamBeginCapture", 10000, true},
    {"cuStreamBeginCapture_v2", "cuStreamBeginCapture", 10010, false},
    {"cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCapture", 10010, true},
    {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph", 12030, false},
    {"cuStreamBeginCaptureToGraph_ptsz", "cuStreamBeginCaptureToGraph", 12030, true},
    {"cuStreamEndCapture", "cuStreamEndCapture", 10000, false},
    {"cuStreamEndCapture_ptsz", "cuStreamEndCapture", 10000, true},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, false},
    {"cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset", 11000, false},
    {"cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess", 4000, false},
    {"cuCtxDisablePeerAccess", "cuCtxDisablePeerAccess", 4000, false},
};

// The first library seen taking memory from the driver itself without being
// taken over, for the line at exit when nothing was pooled. A plain array:
// that line is written after static destructors have run.
std::mutex unnamed_mu;
char unnamed_library[256];

bool destroys_stream(const char* symbol) {
  return symbol != nullptr &&
         (std::strcmp(symbol, "cuStreamDestroy") == 0 || std::strcmp(symbol, "cuStreamDestroy_v2") == 0);
}

// A stream destroy fetched from the driver where gpupool does not take the
// driver's calls over: the driver's own, with gpupool's books kept around it
// as at cudaStreamDestroy. Without it, a stream the program made or named
// through the runtime and destroyed through the driver stayed in the books,
// and the next barrier named a dead handle (on CUDA 13 the program crashed).
// The two versions take the same parameter and do the same.
std::atomic<decltype(&cuStreamDestroy_v2)> driver_stream_destroy{nullptr};

template <typename Destroy>
CUresult destroy_in_books(CUstream s, Destroy&& destroy) {
  Runtime* runtime = Runtime::if_started();  // none yet: it knows no stream
  const bool tell = runtime != nullptr && !runtime->bypass() && s != nullptr;
  int device = -1;
  try {
    if (tell) device = runtime->stream_destroying(rt(s));
  } catch (...) {  // as guarded(): gpupool steps aside, the destroy goes on
    step_aside("cuStreamDestroy");
  }
  const CUresult err = destroy(s);
  if (device >= 0) {
    const StreamId id = reinterpret_cast<StreamId>(s);
    keep_books("cuStreamDestroy", [&] { runtime->stream_destroy_answered(id, device, err == CUDA_SUCCESS); });
  }
  return err;
}

CUresult observed_stream_destroy(CUstream s) {
  return destroy_in_books(s, driver_stream_destroy.load(std::memory_order_acquire));
}

bool resets_device(const char* symbol) {
  return symbol != nullptr && (std::strcmp(symbol, "cuDevicePrimaryCtxReset") == 0 ||
                               std::strcmp(symbol, "cuDevicePrimaryCtxReset_v2") == 0);
}

// A device reset fetched from the driver where gpupool does not take the
// driver's calls over (Numba's cuda.close(), CUDA.jl's unsafe_reset!): the
// driver's own, with the books kept as at cudaDeviceReset. Unseen, the pool
// went on lending memory the reset had freed. Both versions do the same.
std::atomic<decltype(&cuDevicePrimaryCtxReset_v2)> driver_primary_ctx_reset{nullptr};

CUresult observed_primary_ctx_reset(CUdevice device) {
  return driver_reset_in_books(device, driver_primary_ctx_reset.load(std::memory_order_acquire));
}

// The driver's exported frees (cuMemFree's first version took 32-bit pointers).
bool frees_memory(const char* symbol) {
  for (const char* name : {"cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"}) {
    if (symbol != nullptr && std::strcmp(symbol, name) == 0) return true;
  }
  return false;
}

// The driver's cuMemFree and cuMemFreeAsync where gpupool does not take the
// driver's calls over. CUDA lets either API free what the other allocated: a
// block gpupool lent goes back to the pool as at cudaFree or cudaFreeAsync
// (`pooled`, with the call's name), anything else to the driver (`driver`,
// its own). The driver's own free of a block took the whole segment from
// under the pool (fixed segments: lent again while the driver reused the
// memory) or refused a mapped page (expandable ones: the block leaked). A
// driver call leaves the runtime's last error as it was.
template <typename Pooled, typename Driver>
CUresult free_in_books(CUdeviceptr p, const char* call, Pooled&& pooled, Driver&& driver) {
  Runtime* runtime = Runtime::if_started();  // none yet: it lent nothing
  if (runtime == nullptr || p == 0 || runtime->device_holding(ptr(p)) < 0) return driver();
  cudaError_t& last_error = thread_error(caller_runtime().number);
  const cudaError_t before = last_error;
  const CUresult r = cu(guarded(call, pooled));
  last_error = before;
  return r;
}

template <typename Free>
CUresult mem_free_in_books(CUdeviceptr p, Free&& free) {
  return free_in_books(
      p, "cuMemFree", [p] { return free_plain(ptr(p), "cuMemFree"); }, [&] { return free(p); });
}

// A null stream is the legacy default stream's, or with `per_thread` the
// calling thread's default stream, as for cudaFreeAsync.
template <typename Free>
CUresult mem_free_async_in_books(CUdeviceptr p, CUstream s, bool per_thread, Free&& free) {
  return free_in_books(
      p, "cuMemFreeAsync", [=] { return free_stream_ordered(ptr(p), rt(s), per_thread, "cuMemFreeAsync"); },
      [&] { return free(p, s); });
}

std::atomic<decltype(&cuMemFree_v2)> driver_mem_free{nullptr};
std::atomic<decltype(&cuMemFreeAsync)> driver_mem_free_async{nullptr};
std::atomic<decltype(&cuMemFreeAsync)> driver_mem_free_async_ptsz{nullptr};

CUresult observed_mem_free(CUdeviceptr p) {
  return mem_free_in_books(p, driver_mem_free.load(std::memory_order_acquire));
}
CUresult observed_mem_free_async(CUdeviceptr p, CUstream s) {
  return mem_free_async_in_books(p, s, false, driver_mem_free_async.load(std::memory_order_acquire));
}
CUresult observed_mem_free_async_ptsz(CUdeviceptr p, CUstream s) {
  return mem_free_async_in_books(p, s, true, driver_mem_free_async_ptsz.load(std::memory_order_acquire));
}

bool shares_memory(const char* symbol) { return symbol != nullptr && std::strcmp(symbol, "cuIpcGetMemHandle") == 0; }

// The driver's cuIpcGetMemHandle where gpupool does not take the driver's
// calls over. A handle names a whole allocation: for a block gpupool lent, its
// segment, so the other process would map other bytes than the block's (or,
// in an expandable segment, memory CUDA IPC cannot share). Refused as
// cudaIpcGetMemHandle refuses it, with a line naming the call and the fix;
// any other address, and every one under GPUPOOL_DISABLE, is the driver's to
// judge. A driver call leaves the runtime's last error as it was.
template <typename Get>
CUresult ipc_handle_in_books(CUipcMemHandle* handle, CUdeviceptr p, Get&& get) {
  Runtime* runtime = Runtime::if_started();  // none yet: it lent nothing
  if (runtime == nullptr || runtime->disabled() || p == 0) return get(handle, p);
  cudaError_t& last_error = thread_error(caller_runtime().number);
  const cudaError_t before = last_error;
  const cudaError_t judged = guarded("cuIpcGetMemHandle", [&] {
    return runtime->ipc_exportable(ptr(p), "cuIpcGetMemHandle", "CUDA_ERROR_INVALID_VALUE") ? cudaSuccess
                                                                                            : cudaErrorInvalidValue;
  });
  last_error = before;
  return judged == cudaSuccess ? get(handle, p) : cu(judged);
}

std::atomic<decltype(&cuIpcGetMemHandle)> driver_ipc_get_mem_handle{nullptr};

CUresult observed_ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  return ipc_handle_in_books(handle, p, driver_ipc_get_mem_handle.load(std::memory_order_acquire));
}

// The capture's begins and ends, under any of their names (a library's dlsym
// asks for cuStreamBeginCapture_v2_ptsz).
bool captures(const char* symbol) {
  if (symbol == nullptr) return false;
  const std::string_view name(symbol);
  return name.starts_with("cuStreamBeginCapture") || name.starts_with("cuStreamEndCapture");
}

// The driver's captures where gpupool does not take the driver's calls over.
// Unseen, a capture had its stream's stream-ordered requests served from the
// cache, so the graph's work wrote memory the pool lent again once the
// capture was over (at every launch of the graph), and the pool's fences on
// the stream joined the capture. Seen, the pool keeps its books as for
// cudaStreamBeginCapture: requests on the stream go to the runtime (graph
// nodes) and nothing of the pool's touches the capture. The driver's own call
// makes the capture, and its answer is the caller's; a driver call leaves the
// runtime's last error as it was. No runtime loaded in the process: gpupool
// can serve nothing there, and the driver alone answers.
template <typename Begin>
CUresult capture_begin_in_books(CUstream s, bool per_thread, CUstreamCaptureMode mode, Begin&& begin) {
  if (Runtime::if_started() == nullptr && real().cudaStreamBeginCapture == nullptr) return begin();
  CUresult r = CUDA_SUCCESS;
  bool made = false;
  cudaError_t& last_error = thread_error(caller_runtime().number);
  const cudaError_t before = last_error;
  begin_capture_in_books(rt(s), per_thread, static_cast<cudaStreamCaptureMode>(mode), "cuStreamBeginCapture", [&] {
    r = begin();
    made = true;
    return static_cast<cudaError_t>(r);
  });
  last_error = before;
  // gpupool failed twice on the way (host memory): the driver begins all the
  // same, as it destroys and frees all the same.
  return made ? r : begin();
}

template <typename End>
CUresult capture_end_in_books(CUstream s, bool per_thread, End&& end) {
  const CUresult r = end();
  if (Runtime::if_started() == nullptr) return r;  // no capture of gpupool's books
  cudaError_t& last_error = thread_error(caller_runtime().number);
  const cudaError_t before = last_error;
  // The capture's codes are the same numbers in both APIs.
  end_capture_in_books(rt(s), per_thread, static_cast<cudaError_t>(r), "cuStreamEndCapture");
  last_error = before;
  return r;
}

using BeginCaptureV1 = CUresult (*)(CUstream);
std::atomic<BeginCaptureV1> driver_begin_capture_v1{nullptr};
std::atomic<BeginCaptureV1> driver_begin_capture_v1_ptsz{nullptr};
std::atomic<decltype(&cuStreamBeginCapture)> driver_begin_capture{nullptr};
std::atomic<decltype(&cuStreamBeginCapture)> driver_begin_capture_ptsz{nullptr};
std::atomic<decltype(&cuStreamBeginCaptureToGraph)> driver_begin_capture_to_graph{nullptr};
std::atomic<decltype(&cuStreamBeginCaptureToGraph)> driver_begin_capture_to_graph_ptsz{nullptr};
std::atomic<decltype(&cuStreamEndCapture)> driver_end_capture{nullptr};
std::atomic<decltype(&cuStreamEndCapture)> driver_end_capture_ptsz{nullptr};

// Each version as fetched, the per-thread ones naming the calling thread's
// default stream with a null stream. The first version of the begin took no
// mode: it captured as the global mode does.
template <std::atomic<BeginCaptureV1>& real, bool per_thread>
CUresult observed_begin_capture_v1(CUstream s) {
  return capture_begin_in_books(s, per_thread, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                [s] { return real.load(std::memory_order_acquire)(s); });
}
template <std::atomic<decltype(&cuStreamBeginCapture)>& real, bool per_thread>
CUresult observed_begin_capture(CUstream s, CUstreamCaptureMode mode) {
  return capture_begin_in_books(s, per_thread, mode, [=] { return real.load(std::memory_order_acquire)(s, mode); });
}
template <std::atomic<decltype(&cuStreamBeginCaptureToGraph)>& real, bool per_thread>
CUresult observed_begin_capture_to_graph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                         size_t count, CUstreamCaptureMode mode) {
  return capture_begin_in_books(
      s, per_thread, mode, [=] { return real.load(std::memory_order_acquire)(s, g, deps, data, count, mode); });
}
template <std::atomic<decltype(&cuStreamEndCapture)>& real, bool per_thread>
CUresult observed_end_capture(CUstream s, CUgraph* g) {
  return capture_end_in_books(s, per_thread, [=] { return real.load(std::memory_order_acquire)(s, g); });
}

// What the program gets for the capture call `symbol` fetched at `version`
// (real_function): gpupool's watching one, or null where none is.
void* watched_capture(const char* symbol, int version, bool per_thread, void* real_function) {
  const auto keep = [real_function](auto& slot) {
    slot.store(reinterpret_cast<typename std::remove_reference_t<decltype(slot)>::value_type>(real_function),
               std::memory_order_release);
  };
  if (std::strcmp(symbol, "cuStreamBeginCapture") == 0 && version >= 10000 && version < 10010) {
    keep(per_thread ? driver_begin_capture_v1_ptsz : driver_begin_capture_v1);
    return per_thread ? fn(observed_begin_capture_v1<driver_begin_capture_v1_ptsz, true>)
                      : fn(observed_begin_capture_v1<driver_begin_capture_v1, false>);
  }
  if (std::strcmp(symbol, "cuStreamBeginCapture") == 0 && version >= 10010) {
    keep(per_thread ? driver_begin_capture_ptsz : driver_begin_capture);
    return per_thread ? fn(observed_begin_capture<driver_begin_capture_ptsz, true>)
                      : fn(observed_begin_capture<driver_begin_capture, false>);
  }
  if (std::strcmp(symbol, "cuStreamBeginCaptureToGraph") == 0 && version >= 12030) {
    keep(per_thread ? driver_begin_capture_to_graph_ptsz : driver_begin_capture_to_graph);
    return per_thread ? fn(observed_begin_capture_to_graph<driver_begin_capture_to_graph_ptsz, true>)
                      : fn(observed_begin_capture_to_graph<driver_begin_capture_to_graph, false>);
  }
  if (std::strcmp(symbol, "cuStreamEndCapture") == 0 && version >= 10000) {
    keep(per_thread ? driver_end_capture_ptsz : driver_end_capture);
    return per_thread ? fn(observed_end_capture<driver_end_capture_ptsz, true>)
                      : fn(observed_end_capture<driver_end_capture, false>);
  }
  return nullptr;
}

bool allocates(const char* symbol) {
  for (const char* name : {"cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"}) {
    if (symbol != nullptr && std::strcmp(symbol, name) == 0) return true;
  }
  return false;
}

}  // namespace

std::string driver_library_not_taken_over() {
  std::lock_guard<std::mutex> lock(unnamed_mu);
  return std::string(unnamed_library);
}

int driver_library_accepted(const char* path, const char* symbol) {
  static const config::Config c = config::parse_config(config::process_environment()).config;
  if (c.disable || path == nullptr) return 0;
  // The shared runtime calls the driver under gpupool's own calls (taking it
  // over would loop), and NCCL shares its memory over CUDA IPC.
  const bool never = config::names_match("libcudart.so:libnccl.so", path);
  // Any library's stream destroy, device reset, frees, IPC handles and
  // captures are watched (a library such as numba's destroys through the
  // driver streams another one used with the runtime, and resets devices
  // whose memory gpupool holds).
  const bool watched = destroys_stream(symbol) || resets_device(symbol) || frees_memory(symbol) ||
                       shares_memory(symbol) || captures(symbol);
  if (watched && !never) return 1;
  if (!c.static_runtime || !config::names_match(c.static_runtime_libraries, path)) {
    if (!never && allocates(symbol)) {
      std::lock_guard<std::mutex> lock(unnamed_mu);
      if (unnamed_library[0] == '\0') {
        const char* slash = std::strrchr(path, '/');
        std::snprintf(unnamed_library, sizeof unnamed_library, "%s", slash != nullptr ? slash + 1 : path);
      }
    }
    return 0;
  }
  if (never) {
    static std::once_flag told;
    std::call_once(told, [path] {
      message(config::LogLevel::Warn, std::string("gpupool: static_runtime_libraries: ") + path +
                                          " is never taken over (the shared runtime, or NCCL, which shares its memory "
                                          "over CUDA IPC)");
    });
    return 0;
  }
  return 1;
}

void* driver_entry(const char* symbol, int version, unsigned long long flags, void* real_function,
                   gpupool_driver_lookup_fn lookup) {
  if (symbol == nullptr || real_function == nullptr) return real_function;
  if (!taking_over(lookup)) {
    if (destroys_stream(symbol)) {
      driver_stream_destroy.store(reinterpret_cast<decltype(&cuStreamDestroy_v2)>(real_function),
                                  std::memory_order_release);
      return reinterpret_cast<void*>(&observed_stream_destroy);
    }
    if (resets_device(symbol)) {
      driver_primary_ctx_reset.store(reinterpret_cast<decltype(&cuDevicePrimaryCtxReset_v2)>(real_function),
                                     std::memory_order_release);
      return reinterpret_cast<void*>(&observed_primary_ctx_reset);
    }
    if (std::strcmp(symbol, "cuMemFree") == 0 && version >= 3020) {  // before 3020, 32-bit pointers
      driver_mem_free.store(reinterpret_cast<decltype(&cuMemFree_v2)>(real_function), std::memory_order_release);
      return reinterpret_cast<void*>(&observed_mem_free);
    }
    if (std::strcmp(symbol, "cuMemFreeAsync") == 0 && version >= 11020) {
      const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
      (per_thread ? driver_mem_free_async_ptsz : driver_mem_free_async)
          .store(reinterpret_cast<decltype(&cuMemFreeAsync)>(real_function), std::memory_order_release);
      return per_thread ? reinterpret_cast<void*>(&observed_mem_free_async_ptsz)
                        : reinterpret_cast<void*>(&observed_mem_free_async);
    }
    if (shares_memory(symbol) && version >= 4010) {
      driver_ipc_get_mem_handle.store(reinterpret_cast<decltype(&cuIpcGetMemHandle)>(real_function),
                                      std::memory_order_release);
      return reinterpret_cast<void*>(&observed_ipc_get_mem_handle);
    }
    const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    if (void* watched = captures(symbol) ? watched_capture(symbol, version, per_thread, real_function) : nullptr) {
      return watched;
    }
    return real_function;
  }
  for (const Substitute& s : kSubstitutes) {
    if (std::strcmp(s.name, symbol) != 0 || version < s.since || (s.until != 0 && version >= s.until)) continue;
    if (s.real != nullptr) s.real->store(real_function);
    return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? s.per_thread : s.legacy;
  }
  return real_function;
}

int direct_stream_destroy(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(destroy_in_books(static_cast<CUstream>(stream),
                                           [real](CUstream s) { return static_cast<CUresult>(real(s)); }));
}

int direct_device_reset(int device, int (*real)(int device)) {
  return static_cast<int>(driver_reset_in_books(device, [real](CUdevice d) { return static_cast<CUresult>(real(d)); }));
}

int direct_mem_free(unsigned long long p, int (*real)(unsigned long long p)) {
  return static_cast<int>(mem_free_in_books(p, [real](CUdeviceptr q) { return static_cast<CUresult>(real(q)); }));
}

int direct_mem_free_async(unsigned long long p, void* stream, int (*real)(unsigned long long p, void* stream)) {
  const auto driver = [real](CUdeviceptr q, CUstream s) { return static_cast<CUresult>(real(q, s)); };
  return static_cast<int>(mem_free_async_in_books(p, static_cast<CUstream>(stream), false, driver));
}

int direct_mem_free_async_ptsz(unsigned long long p, void* stream, int (*real)(unsigned long long p, void* stream)) {
  const auto driver = [real](CUdeviceptr q, CUstream s) { return static_cast<CUresult>(real(q, s)); };
  return static_cast<int>(mem_free_async_in_books(p, static_cast<CUstream>(stream), true, driver));
}

int direct_ipc_get_mem_handle(void* handle, unsigned long long p, int (*real)(void* handle, unsigned long long p)) {
  const auto driver = [real](CUipcMemHandle* h, CUdeviceptr q) { return static_cast<CUresult>(real(h, q)); };
  return static_cast<int>(ipc_handle_in_books(static_cast<CUipcMemHandle*>(handle), p, driver));
}

int direct_begin_capture_v1(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), false, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                                 [=] { return static_cast<CUresult>(real(stream)); }));
}
int direct_begin_capture_v1_ptsz(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), true, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                                 [=] { return static_cast<CUresult>(real(stream)); }));
}
int direct_begin_capture(void* stream, int mode, int (*real)(void* stream, int mode)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), false,
                                                 static_cast<CUstreamCaptureMode>(mode),
                                                 [=] { return static_cast<CUresult>(real(stream, mode)); }));
}
int direct_begin_capture_ptsz(void* stream, int mode, int (*real)(void* stream, int mode)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), true,
                                                 static_cast<CUstreamCaptureMode>(mode),
                                                 [=] { return static_cast<CUresult>(real(stream, mode)); }));
}
int direct_begin_capture_to_graph(void* stream, void* graph, const void* deps, const void* data, size_t count, int mode,
                                  gpupool_begin_capture_to_graph_fn real) {
  return static_cast<int>(
      capture_begin_in_books(static_cast<CUstream>(stream), false, static_cast<CUstreamCaptureMode>(mode),
                             [=] { return static_cast<CUresult>(real(stream, graph, deps, data, count, mode)); }));
}
int direct_begin_capture_to_graph_ptsz(void* stream, void* graph, const void* deps, const void* data, size_t count,
                                       int mode, gpupool_begin_capture_to_graph_fn real) {
  return static_cast<int>(
      capture_begin_in_books(static_cast<CUstream>(stream), true, static_cast<CUstreamCaptureMode>(mode),
                             [=] { return static_cast<CUresult>(real(stream, graph, deps, data, count, mode)); }));
}
int direct_end_capture(void* stream, void** graph, int (*real)(void* stream, void** graph)) {
  return static_cast<int>(capture_end_in_books(static_cast<CUstream>(stream), false,
                                               [=] { return static_cast<CUresult>(real(stream, graph)); }));
}
int direct_end_capture_ptsz(void* stream, void** graph, int (*real)(void* stream, void** graph)) {
  return static_cast<int>(capture_end_in_books(static_cast<CUstream>(stream), true,
                                               [=] { return static_cast<CUresult>(real(stream, graph)); }));
}

void* driver_symbol(const char* exported, void* real_function, gpupool_driver_lookup_fn lookup) {
  if (exported == nullptr) return real_function;
  for (const ExportedName& e : kExportedNames) {
    if (std::strcmp(e.exported, exported) != 0) continue;
    return driver_entry(e.symbol, e.version, e.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
                        real_function, lookup);
  }
  return real_function;
}

}  // namespace gpupool::shim
