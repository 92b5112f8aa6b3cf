// The runtime calls the core makes (real_cuda.hpp), served by the driver in a
// process that has no shared runtime: a program built with nvcc's default
// static runtime, or one holding a library that carries its own, whose driver
// calls the core takes over (driver_entry_points.cpp).
// Each runtime function here calls the driver function of the same meaning,
// fetched once through the real cuGetProcAddress at the version the static
// runtime itself asks for. The static runtime has made its context current
// before any of its driver calls reach gpupool, so these run in it.
#include "shim/driver_runtime.hpp"

#include <cuda.h>

#include <atomic>

#include "shim/runtime.hpp"

namespace gpupool::shim {

namespace {

struct Driver {
  decltype(&cuMemAlloc_v2) mem_alloc = nullptr;
  decltype(&cuMemFree_v2) mem_free = nullptr;
  decltype(&cuMemAllocAsync) mem_alloc_async = nullptr;
  decltype(&cuMemAllocAsync) mem_alloc_async_ptsz = nullptr;
  decltype(&cuMemAllocFromPoolAsync) mem_alloc_from_pool_async = nullptr;
  decltype(&cuMemAllocFromPoolAsync) mem_alloc_from_pool_async_ptsz = nullptr;
  decltype(&cuMemFreeAsync) mem_free_async = nullptr;
  decltype(&cuMemFreeAsync) mem_free_async_ptsz = nullptr;
  decltype(&cuMemGetInfo_v2) mem_get_info = nullptr;
  decltype(&cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&cuDeviceGetCount) device_get_count = nullptr;
  decltype(&cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&cuCtxPushCurrent_v2) ctx_push_current = nullptr;
  decltype(&cuCtxPopCurrent_v2) ctx_pop_current = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&cuDevicePrimaryCtxReset_v2) primary_ctx_reset = nullptr;
  decltype(&cuEventCreate) event_create = nullptr;
  decltype(&cuEventDestroy_v2) event_destroy = nullptr;
  decltype(&cuEventRecord) event_record = nullptr;
  decltype(&cuEventQuery) event_query = nullptr;
  decltype(&cuEventSynchronize) event_synchronize = nullptr;
  decltype(&cuStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&cuStreamQuery) stream_query = nullptr;
  decltype(&cuStreamIsCapturing) stream_is_capturing = nullptr;
  decltype(&cuStreamGetFlags) stream_get_flags = nullptr;
  decltype(&cuStreamGetCtx) stream_get_ctx = nullptr;
  decltype(&cuStreamCreate) stream_create = nullptr;
  decltype(&cuStreamCreateWithPriority) stream_create_with_priority = nullptr;
  decltype(&cuStreamDestroy_v2) stream_destroy = nullptr;
  decltype(&cuStreamBeginCapture_v2) begin_capture = nullptr;
  decltype(&cuStreamBeginCapture_v2) begin_capture_ptsz = nullptr;
  decltype(&cuStreamBeginCaptureToGraph) begin_capture_to_graph = nullptr;
  decltype(&cuStreamBeginCaptureToGraph) begin_capture_to_graph_ptsz = nullptr;
  decltype(&cuStreamEndCapture) end_capture = nullptr;
  decltype(&cuStreamEndCapture) end_capture_ptsz = nullptr;
  decltype(&cuThreadExchangeStreamCaptureMode) exchange_capture_mode = nullptr;
  decltype(&cuIpcGetMemHandle) ipc_get_mem_handle = nullptr;
  decltype(&cuMemPoolTrimTo) mem_pool_trim_to = nullptr;
  decltype(&cuMemPoolGetAttribute) mem_pool_get_attribute = nullptr;
  decltype(&cuMemPoolSetAttribute) mem_pool_set_attribute = nullptr;
  decltype(&cuDeviceGetDefaultMemPool) device_get_default_mem_pool = nullptr;
  decltype(&cuDeviceGetMemPool) device_get_mem_pool = nullptr;
  decltype(&cuDeviceSetMemPool) device_set_mem_pool = nullptr;
  decltype(&cuMemPoolDestroy) mem_pool_destroy = nullptr;
  decltype(&cuMemPoolSetAccess) mem_pool_set_access = nullptr;
  decltype(&cuMemSetMemPool) mem_set_mem_pool = nullptr;
  gpupool_driver_lookup_fn lookup = nullptr;
};

Driver d;

// The runtime's error codes are the driver's numbers for every code these
// calls return (cudaErrorMemoryAllocation is CUDA_ERROR_OUT_OF_MEMORY, 2).
cudaError_t rt(CUresult r) { return static_cast<cudaError_t>(r); }
CUstream cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
CUevent cu(cudaEvent_t e) { return reinterpret_cast<CUevent>(e); }
CUdeviceptr cu(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

cudaError_t malloc_(void** p, size_t n) { return rt(d.mem_alloc(reinterpret_cast<CUdeviceptr*>(p), n)); }
cudaError_t free_(void* p) { return rt(d.mem_free(cu(p))); }
cudaError_t malloc_async(void** p, size_t n, cudaStream_t s) {
  return rt(d.mem_alloc_async(reinterpret_cast<CUdeviceptr*>(p), n, cu(s)));
}
cudaError_t malloc_async_ptsz(void** p, size_t n, cudaStream_t s) {
  return rt(d.mem_alloc_async_ptsz(reinterpret_cast<CUdeviceptr*>(p), n, cu(s)));
}
cudaError_t malloc_from_pool_async(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return rt(d.mem_alloc_from_pool_async(reinterpret_cast<CUdeviceptr*>(p), n, reinterpret_cast<CUmemoryPool>(pool),
                                        cu(s)));
}
cudaError_t malloc_from_pool_async_ptsz(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return rt(d.mem_alloc_from_pool_async_ptsz(reinterpret_cast<CUdeviceptr*>(p), n,
                                             reinterpret_cast<CUmemoryPool>(pool), cu(s)));
}
cudaError_t free_async(void* p, cudaStream_t s) { return rt(d.mem_free_async(cu(p), cu(s))); }
cudaError_t free_async_ptsz(void* p, cudaStream_t s) { return rt(d.mem_free_async_ptsz(cu(p), cu(s))); }
cudaError_t mem_get_info(size_t* free_bytes, size_t* total) { return rt(d.mem_get_info(free_bytes, total)); }
cudaError_t get_device(int* device) { return rt(d.ctx_get_device(device)); }
cudaError_t get_device_count(int* count) { return rt(d.device_get_count(count)); }
cudaError_t mem_pool_trim_to(cudaMemPool_t pool, size_t keep) {
  return rt(d.mem_pool_trim_to(reinterpret_cast<CUmemoryPool>(pool), keep));
}
cudaError_t mem_pool_get_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return rt(d.mem_pool_get_attribute(reinterpret_cast<CUmemoryPool>(pool), static_cast<CUmemPool_attribute>(attr),
                                     value));
}
cudaError_t mem_pool_set_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return rt(d.mem_pool_set_attribute(reinterpret_cast<CUmemoryPool>(pool), static_cast<CUmemPool_attribute>(attr),
                                     value));
}
cudaError_t device_get_default_mem_pool(cudaMemPool_t* pool, int device) {
  return rt(d.device_get_default_mem_pool(reinterpret_cast<CUmemoryPool*>(pool), device));
}
cudaError_t device_get_mem_pool(cudaMemPool_t* pool, int device) {
  return rt(d.device_get_mem_pool(reinterpret_cast<CUmemoryPool*>(pool), device));
}
cudaError_t mem_pool_destroy(cudaMemPool_t pool) { return rt(d.mem_pool_destroy(reinterpret_cast<CUmemoryPool>(pool))); }
cudaError_t device_set_mem_pool(int device, cudaMemPool_t pool) {
  return rt(d.device_set_mem_pool(device, reinterpret_cast<CUmemoryPool>(pool)));
}
cudaError_t mem_pool_set_access(cudaMemPool_t pool, const cudaMemAccessDesc* descs, size_t count) {
  static_assert(sizeof(CUmemAccessDesc) == sizeof(cudaMemAccessDesc));
  return rt(d.mem_pool_set_access(reinterpret_cast<CUmemoryPool>(pool), reinterpret_cast<const CUmemAccessDesc*>(descs),
                                  count));
}
cudaError_t mem_set_mem_pool(cudaMemLocation* location, cudaMemAllocationType type, cudaMemPool_t pool) {
  static_assert(sizeof(CUmemLocation) == sizeof(cudaMemLocation));
  return rt(d.mem_set_mem_pool(reinterpret_cast<CUmemLocation*>(location), static_cast<CUmemAllocationType>(type),
                               reinterpret_cast<CUmemoryPool>(pool)));
}
cudaError_t device_synchronize() { return rt(d.ctx_synchronize()); }
// The static runtime keeps each device's primary context current; so do we
// (retained once per device, as the runtime holds it).
cudaError_t set_device(int device) {
  static std::atomic<CUcontext> contexts[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  CUcontext ctx = contexts[device].load(std::memory_order_acquire);
  if (ctx == nullptr) {
    if (const CUresult r = d.primary_ctx_retain(&ctx, device); r != CUDA_SUCCESS) return rt(r);
    CUcontext expected = nullptr;
    if (!contexts[device].compare_exchange_strong(expected, ctx)) ctx = expected;  // another thread's retain stands
  }
  return rt(d.ctx_set_current(ctx));
}
// The driver keeps no last error: nothing of gpupool's to clear.
cudaError_t no_error() { return cudaSuccess; }
cudaError_t device_reset() {
  CUdevice device = 0;
  if (const CUresult r = d.ctx_get_device(&device); r != CUDA_SUCCESS) return rt(r);
  return rt(d.primary_ctx_reset(device));
}
cudaError_t event_create(cudaEvent_t* e, unsigned int flags) {
  return rt(d.event_create(reinterpret_cast<CUevent*>(e), flags));  // cudaEventDisableTiming is CU_EVENT_DISABLE_TIMING
}
cudaError_t event_destroy(cudaEvent_t e) { return rt(d.event_destroy(cu(e))); }
cudaError_t event_record(cudaEvent_t e, cudaStream_t s) { return rt(d.event_record(cu(e), cu(s))); }
cudaError_t event_query(cudaEvent_t e) { return rt(d.event_query(cu(e))); }
cudaError_t event_synchronize(cudaEvent_t e) { return rt(d.event_synchronize(cu(e))); }
cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return rt(d.stream_wait_event(cu(s), cu(e), flags));
}
cudaError_t stream_synchronize(cudaStream_t s) { return rt(d.stream_synchronize(cu(s))); }
cudaError_t stream_query(cudaStream_t s) { return rt(d.stream_query(cu(s))); }
cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return rt(d.stream_is_capturing(cu(s), reinterpret_cast<CUstreamCaptureStatus*>(status)));
}
cudaError_t stream_get_flags(cudaStream_t s, unsigned int* flags) { return rt(d.stream_get_flags(cu(s), flags)); }
cudaError_t stream_create(cudaStream_t* s) { return rt(d.stream_create(reinterpret_cast<CUstream*>(s), 0)); }
cudaError_t stream_create_with_flags(cudaStream_t* s, unsigned int flags) {
  return rt(d.stream_create(reinterpret_cast<CUstream*>(s), flags));
}
cudaError_t stream_create_with_priority(cudaStream_t* s, unsigned int flags, int priority) {
  return rt(d.stream_create_with_priority(reinterpret_cast<CUstream*>(s), flags, priority));
}
cudaError_t stream_destroy(cudaStream_t s) { return rt(d.stream_destroy(cu(s))); }
cudaError_t begin_capture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return rt(d.begin_capture(cu(s), static_cast<CUstreamCaptureMode>(mode)));
}
cudaError_t begin_capture_ptsz(cudaStream_t s, cudaStreamCaptureMode mode) {
  return rt(d.begin_capture_ptsz(cu(s), static_cast<CUstreamCaptureMode>(mode)));
}
// cudaGraphEdgeData and CUgraphEdgeData have the same layout.
cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t* deps,
                                   const cudaGraphEdgeData* data, size_t count, cudaStreamCaptureMode mode) {
  if (d.begin_capture_to_graph == nullptr) return cudaErrorNotSupported;
  return rt(d.begin_capture_to_graph(cu(s), reinterpret_cast<CUgraph>(g), reinterpret_cast<const CUgraphNode*>(deps),
                                     reinterpret_cast<const CUgraphEdgeData*>(data), count,
                                     static_cast<CUstreamCaptureMode>(mode)));
}
cudaError_t begin_capture_to_graph_ptsz(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t* deps,
                                        const cudaGraphEdgeData* data, size_t count, cudaStreamCaptureMode mode) {
  if (d.begin_capture_to_graph_ptsz == nullptr) return cudaErrorNotSupported;
  return rt(d.begin_capture_to_graph_ptsz(cu(s), reinterpret_cast<CUgraph>(g),
                                          reinterpret_cast<const CUgraphNode*>(deps),
                                          reinterpret_cast<const CUgraphEdgeData*>(data), count,
                                          static_cast<CUstreamCaptureMode>(mode)));
}
cudaError_t end_capture(cudaStream_t s, cudaGraph_t* g) {
  return rt(d.end_capture(cu(s), reinterpret_cast<CUgraph*>(g)));
}
cudaError_t end_capture_ptsz(cudaStream_t s, cudaGraph_t* g) {
  return rt(d.end_capture_ptsz(cu(s), reinterpret_cast<CUgraph*>(g)));
}
cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode) {
  return rt(d.exchange_capture_mode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}
cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* handle, void* p) {
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
  return rt(d.ipc_get_mem_handle(reinterpret_cast<CUipcMemHandle*>(handle), cu(p)));
}
// The virtual memory calls for expandable segments.
cudaError_t get_driver_entry_point(const char* name, void** fn, unsigned int version, unsigned long long flags,
                                   cudaDriverEntryPointQueryResult* status) {
  if (d.lookup(name, fn, static_cast<int>(version), flags) != CUDA_SUCCESS) *fn = nullptr;
  if (status != nullptr) *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

template <typename F>
void fetch(F*& slot, const char* name, int version, unsigned long long flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* fn = nullptr;
  if (d.lookup(name, &fn, version, flags) != CUDA_SUCCESS) fn = nullptr;
  slot = reinterpret_cast<F*>(fn);
}

}  // namespace

int device_of_context(CUcontext ctx) {
  if (d.ctx_push_current == nullptr || d.ctx_push_current(ctx) != CUDA_SUCCESS) return -1;
  CUdevice device = -1;
  if (d.ctx_get_device(&device) != CUDA_SUCCESS) device = -1;
  CUcontext popped = nullptr;
  d.ctx_pop_current(&popped);
  return device;
}

namespace {
// The device of a stream made where gpupool could not see it: its context's.
cudaError_t stream_get_device(cudaStream_t s, int* device) {
  CUcontext ctx = nullptr;
  if (const CUresult r = d.stream_get_ctx(cu(s), &ctx); r != CUDA_SUCCESS) return rt(r);
  const int owner = device_of_context(ctx);
  if (owner < 0) return cudaErrorInvalidResourceHandle;
  *device = owner;
  return cudaSuccess;
}
}  // namespace

bool fill_from_driver(RealCuda& table, gpupool_driver_lookup_fn lookup) {
  if (lookup == nullptr) return false;
  d.lookup = lookup;
  constexpr unsigned long long kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  // Everything the pool needs to order and serve memory, or nothing.
  bool complete = true;
  auto need = [&complete](auto& slot, const char* name, int version, unsigned long long flags = 0) {
    fetch(slot, name, version, flags);
    complete = complete && slot != nullptr;
  };
  need(d.mem_alloc, "cuMemAlloc", 3020);
  need(d.mem_free, "cuMemFree", 3020);
  need(d.mem_alloc_async, "cuMemAllocAsync", 11020);
  need(d.mem_alloc_async_ptsz, "cuMemAllocAsync", 11020, kPerThread);
  need(d.mem_free_async, "cuMemFreeAsync", 11020);
  need(d.mem_free_async_ptsz, "cuMemFreeAsync", 11020, kPerThread);
  need(d.mem_get_info, "cuMemGetInfo", 3020);
  need(d.ctx_get_device, "cuCtxGetDevice", 2000);
  need(d.device_get_count, "cuDeviceGetCount", 2000);
  need(d.ctx_set_current, "cuCtxSetCurrent", 4000);
  need(d.ctx_push_current, "cuCtxPushCurrent", 4000);
  need(d.ctx_pop_current, "cuCtxPopCurrent", 4000);
  need(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain", 7000);
  need(d.ctx_synchronize, "cuCtxSynchronize", 2000);
  need(d.primary_ctx_reset, "cuDevicePrimaryCtxReset", 11000);
  need(d.event_create, "cuEventCreate", 2000);
  need(d.event_destroy, "cuEventDestroy", 4000);
  need(d.event_record, "cuEventRecord", 2000);
  need(d.event_query, "cuEventQuery", 2000);
  need(d.event_synchronize, "cuEventSynchronize", 2000);
  need(d.stream_wait_event, "cuStreamWaitEvent", 3020);
  need(d.stream_synchronize, "cuStreamSynchronize", 2000);
  need(d.stream_query, "cuStreamQuery", 2000);
  need(d.stream_is_capturing, "cuStreamIsCapturing", 10000);
  need(d.stream_get_flags, "cuStreamGetFlags", 5050);
  fetch(d.stream_get_ctx, "cuStreamGetCtx", 9020);
  need(d.stream_create, "cuStreamCreate", 2000);
  need(d.stream_create_with_priority, "cuStreamCreateWithPriority", 5050);
  need(d.stream_destroy, "cuStreamDestroy", 4000);
  need(d.begin_capture, "cuStreamBeginCapture", 10010);
  need(d.begin_capture_ptsz, "cuStreamBeginCapture", 10010, kPerThread);
  need(d.end_capture, "cuStreamEndCapture", 10000);
  need(d.end_capture_ptsz, "cuStreamEndCapture", 10000, kPerThread);
  fetch(d.exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", 10010);
  need(d.ipc_get_mem_handle, "cuIpcGetMemHandle", 4010);
  // Captures into an existing graph came with CUDA 12.3: optional.
  fetch(d.begin_capture_to_graph, "cuStreamBeginCaptureToGraph", 12030);
  fetch(d.begin_capture_to_graph_ptsz, "cuStreamBeginCaptureToGraph", 12030, kPerThread);
  // The memory pool calls (trims, figures, allocations from a pool named,
  // the current pool and its destruction), which drivers before CUDA 11.2
  // lack: optional, each missing one answered as not supported.
  fetch(d.mem_pool_trim_to, "cuMemPoolTrimTo", 11020);
  fetch(d.mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync", 11020);
  fetch(d.mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync", 11020, kPerThread);
  fetch(d.mem_pool_get_attribute, "cuMemPoolGetAttribute", 11020);
  fetch(d.mem_pool_set_attribute, "cuMemPoolSetAttribute", 11020);
  fetch(d.device_get_default_mem_pool, "cuDeviceGetDefaultMemPool", 11020);
  fetch(d.device_get_mem_pool, "cuDeviceGetMemPool", 11020);
  fetch(d.device_set_mem_pool, "cuDeviceSetMemPool", 11020);
  fetch(d.mem_pool_destroy, "cuMemPoolDestroy", 11020);
  fetch(d.mem_pool_set_access, "cuMemPoolSetAccess", 11020);
  fetch(d.mem_set_mem_pool, "cuMemSetMemPool", 13000);  // CUDA 13's current pool by location
  if (!complete) return false;
  table.cudaMalloc = malloc_;
  table.cudaFree = free_;
  table.cudaMallocAsync = malloc_async;
  table.cudaMallocAsync_ptsz = malloc_async_ptsz;
  table.cudaMallocFromPoolAsync = d.mem_alloc_from_pool_async != nullptr ? malloc_from_pool_async : nullptr;
  table.cudaMallocFromPoolAsync_ptsz =
      d.mem_alloc_from_pool_async_ptsz != nullptr ? malloc_from_pool_async_ptsz : nullptr;
  table.cudaFreeAsync = free_async;
  table.cudaFreeAsync_ptsz = free_async_ptsz;
  table.cudaMemGetInfo = mem_get_info;
  table.cudaGetDevice = get_device;
  table.cudaGetDeviceCount = get_device_count;
  table.cudaSetDevice = set_device;
  table.cudaGetLastError = no_error;
  table.cudaPeekAtLastError = no_error;
  table.cudaDeviceReset = device_reset;
  table.cudaDeviceSynchronize = device_synchronize;
  table.cudaEventCreateWithFlags = event_create;
  table.cudaEventDestroy = event_destroy;
  table.cudaEventRecord = event_record;
  table.cudaEventQuery = event_query;
  table.cudaEventSynchronize = event_synchronize;
  table.cudaStreamWaitEvent = stream_wait_event;
  table.cudaStreamSynchronize = stream_synchronize;
  table.cudaStreamQuery = stream_query;
  table.cudaStreamIsCapturing = stream_is_capturing;
  table.cudaPointerGetAttributes = nullptr;  // a reset's error is then taken as its having happened
  table.cudaStreamGetFlags = stream_get_flags;
  table.cudaStreamGetDevice = d.stream_get_ctx != nullptr ? stream_get_device : nullptr;
  table.cudaStreamCreate = stream_create;
  table.cudaStreamCreateWithFlags = stream_create_with_flags;
  table.cudaStreamCreateWithPriority = stream_create_with_priority;
  table.cudaStreamDestroy = stream_destroy;
  table.cudaStreamBeginCapture = begin_capture;
  table.cudaStreamBeginCapture_ptsz = begin_capture_ptsz;
  table.cudaStreamBeginCaptureToGraph = begin_capture_to_graph;
  table.cudaStreamBeginCaptureToGraph_ptsz = begin_capture_to_graph_ptsz;
  table.cudaStreamEndCapture = end_capture;
  table.cudaStreamEndCapture_ptsz = end_capture_ptsz;
  table.cudaThreadExchangeStreamCaptureMode = d.exchange_capture_mode != nullptr ? exchange_capture_mode : nullptr;
  table.cudaIpcGetMemHandle = ipc_get_mem_handle;
  table.cudaDeviceEnablePeerAccess = nullptr;  // the program's own call reaches the driver
  table.cudaDeviceDisablePeerAccess = nullptr;
  table.cudaMallocPitch = nullptr;             // so does its cuMemAllocPitch, when gpupool declines it
  table.cudaMalloc3D = nullptr;
  table.cudaDeviceGetDefaultMemPool = d.device_get_default_mem_pool != nullptr ? device_get_default_mem_pool : nullptr;
  table.cudaDeviceGetMemPool = d.device_get_mem_pool != nullptr ? device_get_mem_pool : nullptr;
  table.cudaDeviceSetMemPool = d.device_set_mem_pool != nullptr ? device_set_mem_pool : nullptr;
  table.cudaMemPoolDestroy = d.mem_pool_destroy != nullptr ? mem_pool_destroy : nullptr;
  table.cudaMemPoolSetAccess = d.mem_pool_set_access != nullptr ? mem_pool_set_access : nullptr;
  table.cudaMemSetMemPool = d.mem_set_mem_pool != nullptr ? mem_set_mem_pool : nullptr;
  table.cudaMemPoolTrimTo = d.mem_pool_trim_to != nullptr ? mem_pool_trim_to : nullptr;
  table.cudaMemPoolGetAttribute = d.mem_pool_get_attribute != nullptr ? mem_pool_get_attribute : nullptr;
  table.cudaMemPoolSetAttribute = d.mem_pool_set_attribute != nullptr ? mem_pool_set_attribute : nullptr;
  table.cudaGetDriverEntryPointByVersion = get_driver_entry_point;
  table.cudaGetDriverEntryPoint = nullptr;
  return true;
}

}  // namespace gpupool::shim
