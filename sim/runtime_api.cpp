// The CUDA runtime API subset the shim and the test programs use, compiled
// against the real headers so the signatures match, built as libcudart.so.13
// with the same symbol version as the real one: a program linked against
// either runs against either. Here: errors, devices, kernel launches, driver
// entry points and the tests' controls; memory_api.cpp and stream_api.cpp
// hold the rest, runtime_state.hpp what they share.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "sim/counters.hpp"
#include "sim/engine.hpp"
#include "sim/mem_pools.hpp"
#include "sim/memory.hpp"
#include "sim/ptsz.h"
#include "sim/runtime_state.hpp"
#include "sim/simcuda.h"
#include "sim/vmm.hpp"

// The runtime's own names, and what its entry points share (runtime_state.hpp).
using namespace simcuda;
using namespace simcuda::rt;

namespace {

thread_local dim3 t_grid, t_block;
thread_local size_t t_shared = 0;
thread_local cudaStream_t t_launch_stream = nullptr;

cudaError_t launch(cudaStream_t stream, bool per_thread) {
  counters().kernel_launches++;
  // Kernels have no device to run on here: they take the per-operation delay
  // and leave memory as it was.
  return result(Engine::instance().enqueue(stream_of(stream, per_thread), nullptr));
}

void write_counters_at_exit() {
  const char* path = std::getenv("SIMCUDA_COUNTERS_FILE");
  if (path == nullptr || *path == '\0') return;
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  simcuda_counters c;
  simcuda_get_counters(&c);
  std::fprintf(f,
               "{\"malloc_calls\": %llu, \"malloc_failures\": %llu, \"free_calls\": %llu, "
               "\"malloc_async_calls\": %llu, \"free_async_calls\": %llu, \"bytes_in_use\": %llu, "
               "\"peak_bytes_in_use\": %llu, \"event_records\": %llu, \"stream_waits\": %llu, "
               "\"event_queries\": %llu, \"event_syncs\": %llu, \"stream_syncs\": %llu, "
               "\"device_syncs\": %llu, \"legacy_ops\": %llu, \"captures_begun\": %llu, "
               "\"captures_invalidated\": %llu, \"kernel_launches\": %llu, \"vmm_maps\": %llu, "
               "\"vmm_unmaps\": %llu, \"stale_event_uses\": %llu, \"null_free_calls\": %llu, "
               "\"event_failures\": %llu, \"host_wait_failures\": %llu, \"event_query_failures\": %llu, "
               "\"get_device_calls\": %llu, \"destroyed_stream_calls\": %llu, \"unmap_failures\": %llu, "
               "\"worker_wakeups\": %llu, \"streams_tracked\": %llu}\n",
               (unsigned long long)c.malloc_calls, (unsigned long long)c.malloc_failures,
               (unsigned long long)c.free_calls, (unsigned long long)c.malloc_async_calls,
               (unsigned long long)c.free_async_calls, (unsigned long long)c.bytes_in_use,
               (unsigned long long)c.peak_bytes_in_use, (unsigned long long)c.event_records,
               (unsigned long long)c.stream_waits, (unsigned long long)c.event_queries,
               (unsigned long long)c.event_syncs, (unsigned long long)c.stream_syncs,
               (unsigned long long)c.device_syncs, (unsigned long long)c.legacy_ops,
               (unsigned long long)c.captures_begun, (unsigned long long)c.captures_invalidated,
               (unsigned long long)c.kernel_launches, (unsigned long long)c.vmm_maps,
               (unsigned long long)c.vmm_unmaps, (unsigned long long)c.stale_event_uses,
               (unsigned long long)c.null_free_calls, (unsigned long long)c.event_failures,
               (unsigned long long)c.host_wait_failures, (unsigned long long)c.event_query_failures,
               (unsigned long long)c.get_device_calls, (unsigned long long)c.destroyed_stream_calls,
               (unsigned long long)c.unmap_failures, (unsigned long long)c.worker_wakeups,
               (unsigned long long)c.streams_tracked);
  std::fclose(f);
}

__attribute__((constructor)) void register_exit_hook() { std::atexit(write_counters_at_exit); }

}  // namespace

extern "C" {

void** __cudaRegisterFatBinary(void*);
void __cudaRegisterFatBinaryEnd(void**);
void __cudaUnregisterFatBinary(void**);
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*, dim3*, int*);
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int);
char __cudaInitModule(void**);
unsigned __cudaPushCallConfiguration(dim3, dim3, size_t, struct CUstream_st*);
cudaError_t __cudaPopCallConfiguration(dim3*, dim3*, size_t*, void*);
cudaError_t __cudaGetKernel(cudaKernel_t*, const void*);
cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);

// ---------------------------------------------------------------- errors

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return cudaGetErrorName(error);
  }
}

// ---------------------------------------------------------------- devices

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return result(cudaErrorInvalidValue);
  *count = Memory::instance().devices();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  counters().get_device_calls++;
  if (device == nullptr) return result(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= Memory::instance().devices()) return result(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (can == nullptr) return result(cudaErrorInvalidValue);
  const int n = Memory::instance().devices();
  if (device < 0 || device >= n || peer < 0 || peer >= n) return result(cudaErrorInvalidDevice);
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (flags != 0) return result(cudaErrorInvalidValue);
  return result(Memory::instance().enable_peer_access(t_device, peer));
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) { return result(Memory::instance().disable_peer_access(t_device, peer)); }

// Waits for all work, then frees all of the current device's memory and
// destroys the streams the program made there and its events (a later use of
// an event fails and is counted).
cudaError_t cudaDeviceReset(void) {
  static const char* const error = std::getenv("SIMCUDA_RESET_ERROR");
  const bool refused = error != nullptr && std::strcmp(error, "refused") == 0;
  const bool late = error != nullptr && std::strcmp(error, "late") == 0;
  if (refused) return result(cudaErrorNotPermitted);
  Engine::instance().synchronize_all();
  Engine::instance().reset_streams(t_device);
  Memory::instance().reset(t_device);
  simcuda::mem_pool_device_reset(t_device);
  std::lock_guard<std::mutex> lock(events_mu());
  for (auto it = events().begin(); it != events().end();) {
    if ((*it)->device != t_device) {
      ++it;
      continue;
    }
    (*it)->reset = true;  // kept: see Event::reset
    reset_events().insert(*it);
    it = events().erase(it);
  }
  return late ? result(cudaErrorLaunchFailure) : cudaSuccess;
}

// CUDA 12's old name of cudaDeviceReset, which CUDA 13 removed: kept so that
// a program built for CUDA 12 runs here too, as on CUDA 12's runtime.
extern "C" cudaError_t cudaThreadExit(void) { return cudaDeviceReset(); }

cudaError_t cudaDeviceSynchronize(void) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  // Like the real runtime: not allowed while a stream captures (global mode).
  if (const cudaError_t e = Engine::instance().check_unsafe_call(); e != cudaSuccess) return result(e);
  if (Engine::instance().stale_capture_refuses(true)) return result(cudaErrorStreamCaptureUnsupported);
  Engine::instance().synchronize_device(t_device);  // the current device's work only, as a GPU's
  return checked(t_device, cudaSuccess);
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return result(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return result(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// ---------------------------------------------------------------- kernels

void** __cudaRegisterFatBinary(void* fat) {
  static void* handle = nullptr;
  handle = fat;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*, dim3*, int*) {}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
char __cudaInitModule(void**) { return 1; }

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  t_grid = grid;
  t_block = block;
  t_shared = shared;
  t_launch_stream = stream;
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  *grid = t_grid;
  *block = t_block;
  *shared = t_shared;
  *static_cast<cudaStream_t*>(stream) = t_launch_stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fn) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fn));
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t s) { return launch(s, false); }
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t s) { return launch(s, true); }
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t s) { return launch(s, false); }
cudaError_t cudaLaunchKernel_ptsz(const void*, dim3, dim3, void**, size_t, cudaStream_t s) { return launch(s, true); }

// ---------------------------------------------------------------- driver entry points

// As the real runtime: asked of the driver's cuGetProcAddress directly (past
// any lookup a preloaded library watches), at the version given, or at the
// runtime's own for the call without one. The default flag means the
// per-thread versions in the _ptsz twins (a program built with
// --default-stream per-thread calls those). A symbol not found is no error.
namespace {
cudaError_t driver_entry_point(const char* symbol, void** fn, unsigned int version, unsigned long long flags,
                               cudaDriverEntryPointQueryResult* status, bool per_thread_default) {
  if (symbol == nullptr || fn == nullptr) return result(cudaErrorInvalidValue);
  const bool per_thread = (flags & cudaEnablePerThreadDefaultStream) != 0 ||
                          (flags == cudaEnableDefault && per_thread_default);
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (cuGetProcAddress_v2(symbol, fn, static_cast<int>(version),
                          per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                          &found) != CUDA_SUCCESS) {
    *fn = nullptr;
  }
  if (status != nullptr) {
    *status = found == CU_GET_PROC_ADDRESS_SUCCESS                ? cudaDriverEntryPointSuccess
              : found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? cudaDriverEntryPointVersionNotSufficent
                                                                    : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, version, flags, status, false);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fn, unsigned int version,
                                                  unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, version, flags, status, true);
}
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, CUDART_VERSION, flags, status, false);
}
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fn, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, CUDART_VERSION, flags, status, true);
}

// ---------------------------------------------------------------- control

void simcuda_fault_stream(void* stream, int error) {
  Stream* s = stream_of(static_cast<cudaStream_t>(stream), false);
  const int device = s->device;
  Engine::instance().enqueue(s, [device, error] { set_fault(device, error); });
}

// A stream-ordered allocation is its pool's to open (cudaMemPoolSetAccess).
int simcuda_access(const void* ptr, int device) {
  const int pooled = simcuda::mem_pool_access(ptr, device);
  return pooled >= 0 ? pooled : Memory::instance().access_from(ptr, device);
}

int simcuda_accessible(const void* ptr, int device) { return simcuda_access(ptr, device) != 0 ? 1 : 0; }

void simcuda_get_counters(struct simcuda_counters* out) {
  const simcuda::Counters& c = counters();
  out->event_failures = c.event_failures;
  out->host_wait_failures = c.host_wait_failures;
  out->event_query_failures = c.event_query_failures;
  out->get_device_calls = c.get_device_calls;
  out->destroyed_stream_calls = c.destroyed_stream_calls;
  out->unmap_failures = c.unmap_failures;
  out->worker_wakeups = c.worker_wakeups;
  out->streams_tracked = c.streams_tracked;
  out->malloc_calls = c.malloc_calls;
  out->malloc_failures = c.malloc_failures;
  out->free_calls = c.free_calls;
  out->malloc_async_calls = c.malloc_async_calls;
  out->free_async_calls = c.free_async_calls;
  out->bytes_in_use = c.bytes_in_use;
  out->peak_bytes_in_use = c.peak_bytes_in_use;
  out->event_records = c.event_records;
  out->stream_waits = c.stream_waits;
  out->event_queries = c.event_queries;
  out->event_syncs = c.event_syncs;
  out->stream_syncs = c.stream_syncs;
  out->device_syncs = c.device_syncs;
  out->legacy_ops = c.legacy_ops;
  out->captures_begun = c.captures_begun;
  out->captures_invalidated = c.captures_invalidated;
  out->kernel_launches = c.kernel_launches;
  out->vmm_maps = c.vmm_maps;
  out->vmm_unmaps = c.vmm_unmaps;
  out->stale_event_uses = c.stale_event_uses;
  out->null_free_calls = c.null_free_calls;
}

}  // extern "C"
