// The driver entry points gpupool serves to a program built with nvcc's
// default static runtime (with static_runtime:1), or to a library carrying its
// own that static_runtime_libraries names. driver_hook.c in the
// preload library hands the program's runtime a cuGetProcAddress that asks
// driver_entry() about each entry point it fetches; the allocation, stream,
// capture and peer-access calls come back here and go through the same code
// as the shared runtime's (entry_points.cpp, serve_*.cpp), whose calls to "the real
// runtime" are then served by the driver (driver_runtime.cpp). Anywhere else,
// the few driver calls gpupool watches are driver_watch.cpp's.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "config/config.hpp"
#include "shim/core_interface.h"
#include "shim/driver_calls.hpp"
#include "shim/driver_runtime.hpp"
#include "shim/messages.hpp"
#include "shim/ptsz.h"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"
#include "shim/guard.hpp"

namespace gpupool::shim {

namespace {

void** out(CUdeviceptr* p) { return reinterpret_cast<void**>(p); }

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

bool fetches_entry_points(const char* symbol) {
  return symbol != nullptr && (std::strcmp(symbol, "cuGetProcAddress") == 0 || std::strcmp(symbol, "cuGetProcAddress_v2") == 0);
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
  if (watched_driver_call(symbol) && !never) return 1;
  if (!c.static_runtime || !config::names_match(c.static_runtime_libraries, path)) {
    if (!never && allocates(symbol)) {
      std::lock_guard<std::mutex> lock(unnamed_mu);
      if (unnamed_library[0] == '\0') {
        const char* slash = std::strrchr(path, '/');
        std::snprintf(unnamed_library, sizeof unnamed_library, "%s", slash != nullptr ? slash + 1 : path);
      }
    }
    // Its own cuGetProcAddress (NVIDIA's cuda-python fetches every driver
    // function through one) hands out the watched calls as a lookup by name
    // does, and nothing else of gpupool's.
    return !never && fetches_entry_points(symbol) ? 2 : 0;
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
    void* watching = watching_driver_call(symbol, version, flags, real_function);
    return watching != nullptr ? watching : real_function;
  }
  for (const Substitute& s : kSubstitutes) {
    if (std::strcmp(s.name, symbol) != 0 || version < s.since || (s.until != 0 && version >= s.until)) continue;
    if (s.real != nullptr) s.real->store(real_function);
    return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? s.per_thread : s.legacy;
  }
  return real_function;
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
