// The CUDA runtime API subset the shim and the test programs use, compiled
// against the real headers so the signatures match, built as libcudart.so.13
// with the same symbol version as the real one: a program linked against
// either runs against either.
#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_set>

#include "sim/counters.hpp"
#include "sim/driver_caller.hpp"
#include "sim/engine.hpp"
#include "sim/mem_pools.hpp"
#include "sim/memory.hpp"
#include "sim/ptsz.h"
#include "sim/simcuda.h"
#include "sim/vmm.hpp"

using simcuda::Engine;
using simcuda::Memory;
using simcuda::Stream;
using simcuda::counters;

namespace {

// Every live event, so that a device reset can destroy the device's own.
std::mutex& events_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_set<simcuda::Event*>& events() {
  static auto* all = new std::unordered_set<simcuda::Event*>;
  return *all;
}
// Events a device reset destroyed (kept: see Event::reset). Under events_mu.
std::unordered_set<simcuda::Event*>& reset_events() {
  static auto* all = new std::unordered_set<simcuda::Event*>;
  return *all;
}

// The event behind a handle, or null (the call fails) when there is none or a
// device reset destroyed it; such a use is counted, for tests to catch.
simcuda::Event* usable_event(cudaEvent_t e) {
  auto* ev = reinterpret_cast<simcuda::Event*>(e);
  if (ev != nullptr && ev->reset) {
    counters().stale_event_uses++;
    return nullptr;
  }
  return ev;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

// Every entry point reports through here, as the runtime does: a failure is
// remembered for cudaGetLastError.
cudaError_t result(cudaError_t err) {
  if (err != cudaSuccess) t_last_error = err;
  return err;
}

// Sticky faults (simcuda_fault_stream): once a queued fault has run, the
// device's later calls fail with its error, as a real context does after a
// kernel's illegal address.
constexpr int kFaultDevices = 64;
std::atomic<int> g_fault[kFaultDevices];
cudaError_t fault_of(int device) {
  return device >= 0 && device < kFaultDevices ? static_cast<cudaError_t>(g_fault[device].load()) : cudaSuccess;
}
// A call's own result, unless its device has faulted.
cudaError_t checked(int device, cudaError_t err) {
  const cudaError_t fault = fault_of(device);
  return result(fault != cudaSuccess ? fault : err);
}

// True, at `rate`, for a call made by gpupool's core (seeded by
// SIMCUDA_FAIL_SEED). The program's own calls never fail, so that a test
// program's ordering of its own work stays as it wrote it.
bool injected_core_failure(const void* caller, double rate) {
  if (rate <= 0) return false;
  if (simcuda::t_driver_caller != nullptr) caller = simcuda::t_driver_caller;  // through a driver entry point
  Dl_info info;
  if (dladdr(caller, &info) == 0 || info.dli_fname == nullptr ||
      std::strstr(info.dli_fname, "/libgpupool-core.so") == nullptr) {
    return false;
  }
  static std::mutex mu;
  static const char* const seed = std::getenv("SIMCUDA_FAIL_SEED");
  static std::mt19937_64 rng(seed != nullptr ? std::strtoull(seed, nullptr, 10) : 1);
  std::lock_guard<std::mutex> lock(mu);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < rate;
}

double rate_from(const char* variable) {
  const char* text = std::getenv(variable);
  return text != nullptr ? std::atof(text) : 0;
}

// SIMCUDA_EVENT_FAIL_RATE: the chance that an event creation, record or
// stream wait made by gpupool's core fails, as with a runtime short of
// resources.
bool injected_event_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_EVENT_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().event_failures++;
  return true;
}

// SIMCUDA_EVENT_QUERY_FAIL_RATE: the chance that an event query made by
// gpupool's core fails with an error instead of saying whether the event has
// completed, as on a device in trouble; the event itself is unharmed.
bool injected_event_query_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_EVENT_QUERY_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().event_query_failures++;
  return true;
}

// SIMCUDA_HOST_WAIT_FAIL_RATE: the chance that a host wait made by gpupool's
// core (cudaEventSynchronize, cudaStreamSynchronize, cudaDeviceSynchronize)
// fails, waiting for nothing.
bool injected_host_wait_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_HOST_WAIT_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().host_wait_failures++;
  return true;
}

Stream* stream_of(cudaStream_t s, bool per_thread) { return Engine::instance().resolve(s, per_thread, t_device); }

// The graph handle EndCapture returns; only ever destroyed.
struct Graph {
  unsigned long long nodes;
};

thread_local dim3 t_grid, t_block;
thread_local size_t t_shared = 0;
thread_local cudaStream_t t_launch_stream = nullptr;

cudaError_t launch(cudaStream_t stream, bool per_thread) {
  counters().kernel_launches++;
  // Kernels have no device to run on here: they take the per-operation delay
  // and leave memory as it was.
  return result(Engine::instance().enqueue(stream_of(stream, per_thread), nullptr));
}

bool device_side_ok(const void* p, size_t n) { return n == 0 || Memory::instance().contains(p, n); }

cudaError_t memcpy_checked(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_device && !device_side_ok(dst, count)) || (src_device && !device_side_ok(src, count))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t memcpy_async(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                         cudaStream_t stream, bool per_thread) {
  if (const cudaError_t err = memcpy_checked(dst, src, count, kind); err != cudaSuccess) return result(err);
  return result(Engine::instance().enqueue(stream_of(stream, per_thread),
                                           [=] { std::memmove(dst, src, count); }));
}

cudaError_t memset_async(void* p, int value, size_t count, cudaStream_t stream, bool per_thread) {
  if (!device_side_ok(p, count)) return result(cudaErrorInvalidValue);
  return result(Engine::instance().enqueue(stream_of(stream, per_thread),
                                           [=] { std::memset(p, value, count); }));
}

// From `from`, or from the current pool of the stream's device.
cudaError_t malloc_async(void** p, size_t size, cudaStream_t stream, bool per_thread, cudaMemPool_t from = nullptr) {
  if (p == nullptr) return result(cudaErrorInvalidValue);
  counters().malloc_async_calls++;
  Stream* const s = stream_of(stream, per_thread);
  const int device = from != nullptr ? simcuda::mem_pool_device(from) : s->device;
  if (device < 0) return result(cudaErrorInvalidValue);
  if (!simcuda::mem_pools_supported(device)) return result(cudaErrorNotSupported);
  if (const cudaError_t fault = fault_of(device); fault != cudaSuccess) return result(fault);
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  // The allocation is an operation of the stream's: on the legacy stream it
  // breaks a blocking stream's capture, as any legacy-stream work does; on a
  // capturing stream it is the graph's node.
  if (const cudaError_t err = Engine::instance().enqueue(s, nullptr, {}, false); err != cudaSuccess) {
    return result(err);
  }
  // Memory is usable in stream order at once here; the pool of a real device
  // would also hand it out in stream order. Frees still queued would give
  // memory back in stream order: let them finish before giving up. Another
  // thread may take what they gave back before this one retries: a few tries.
  cudaError_t err = Memory::instance().allocate(device, size, p);
  for (int tries = 0; err == cudaErrorMemoryAllocation && tries < 8; ++tries) {
    Engine::instance().synchronize_all();
    err = Memory::instance().allocate(device, size, p);
  }
  if (err == cudaSuccess) simcuda::mem_pool_allocated(*p, size, device, from);
  return result(err);
}

cudaError_t free_async(void* p, cudaStream_t stream, bool per_thread) {
  counters().free_async_calls++;
  if (p == nullptr) return cudaSuccess;
  if (!Memory::instance().contains(p, 1)) return result(cudaErrorInvalidValue);
  Stream* s = stream_of(stream, per_thread);
  if (const cudaError_t fault = fault_of(s->device); fault != cudaSuccess) return result(fault);
  return result(Engine::instance().enqueue(s, [p] {
    simcuda::mem_pool_freed(p);
    Memory::instance().release(p);
  }));
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

namespace simcuda {
cudaError_t current_device_fault() { return fault_of(t_device); }

// SIMCUDA_UNMAP_FAIL_RATE: the chance that a cuMemUnmap made by gpupool's
// core is refused, as by a driver whose context a fault broke.
bool injected_unmap_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_UNMAP_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().unmap_failures++;
  return true;
}

Counters& counters() {
  static Counters* c = new Counters();
  return *c;
}
}  // namespace simcuda

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

// Waits for all work, then frees all of the current device's memory and
// destroys its events (a later use of one fails and is counted). Streams are
// not destroyed here (a program must not use them afterwards).
cudaError_t cudaDeviceReset(void) {
  static const char* const error = std::getenv("SIMCUDA_RESET_ERROR");
  const bool refused = error != nullptr && std::strcmp(error, "refused") == 0;
  const bool late = error != nullptr && std::strcmp(error, "late") == 0;
  if (refused) return result(cudaErrorNotPermitted);
  Engine::instance().synchronize_all();
  Engine::instance().end_captures(t_device);
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

// ---------------------------------------------------------------- memory

cudaError_t cudaMalloc(void** p, size_t size) {
  if (p == nullptr) return result(cudaErrorInvalidValue);
  if (const cudaError_t e = Engine::instance().check_unsafe_call(); e != cudaSuccess) return result(e);
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (const cudaError_t fault = fault_of(t_device); fault != cudaSuccess) return result(fault);
  return result(Memory::instance().allocate(t_device, size, p));
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) {
    counters().null_free_calls++;  // on a real runtime: creates the context if none is current yet
    return cudaSuccess;
  }
  if (const cudaError_t e = Engine::instance().check_unsafe_call(); e != cudaSuccess) return result(e);
  counters().free_calls++;
  if (!Memory::instance().contains(p, 1)) return result(cudaErrorInvalidValue);
  // cudaFree synchronizes the device before the memory goes, and reports an
  // earlier kernel's fault.
  Engine::instance().synchronize_all();
  if (const cudaError_t fault = fault_of(t_device); fault != cudaSuccess) return result(fault);
  simcuda::mem_pool_freed(p);  // stream-ordered memory may be freed so too
  return result(Memory::instance().release(p));
}

// Pitched memory as CUDA hands it out: rows padded to the 512 bytes a texture
// needs at its base (cudaDevAttrTextureAlignment), which also meets the pitch
// alignment (cudaDevAttrTexturePitchAlignment). An empty extent: no memory.
constexpr size_t kPitchAlignment = 512;

cudaError_t cudaMallocPitch(void** p, size_t* pitch, size_t width, size_t height) {
  if (p == nullptr || pitch == nullptr) return result(cudaErrorInvalidValue);
  if (width == 0 || height == 0) {
    *p = nullptr;
    *pitch = 0;
    return cudaSuccess;
  }
  const size_t row = (width + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
  if (row < width || height > SIZE_MAX / row) return result(cudaErrorMemoryAllocation);
  const cudaError_t err = cudaMalloc(p, row * height);
  if (err == cudaSuccess) *pitch = row;
  return err;
}

cudaError_t cudaMalloc3D(cudaPitchedPtr* out, cudaExtent extent) {
  if (out == nullptr) return result(cudaErrorInvalidValue);
  const size_t rows = extent.depth != 0 && extent.height > SIZE_MAX / extent.depth ? SIZE_MAX
                                                                                   : extent.height * extent.depth;
  void* p = nullptr;
  size_t pitch = 0;
  const cudaError_t err = cudaMallocPitch(&p, &pitch, extent.width, rows);
  if (err == cudaSuccess) *out = cudaPitchedPtr{p, pitch, extent.width, extent.height};
  return err;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (value == nullptr || device < 0 || device >= Memory::instance().devices()) return result(cudaErrorInvalidDevice);
  switch (attribute) {
    case cudaDevAttrTextureAlignment: *value = 512; return cudaSuccess;
    case cudaDevAttrTexturePitchAlignment: *value = 32; return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported: *value = simcuda::mem_pools_supported(device) ? 1 : 0; return cudaSuccess;
    default: return result(cudaErrorInvalidValue);
  }
}

// Like the real runtime: a handle for memory from cudaMalloc (which names its
// whole allocation); memory mapped through the VMM calls cannot be exported.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  if (handle == nullptr || !Memory::instance().contains(p, 1)) return result(cudaErrorInvalidValue);
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &p, sizeof(p));
  return cudaSuccess;
}

// Device memory says which device holds it; anything else is unregistered
// host memory (not an error since CUDA 11).
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  if (attributes == nullptr) return result(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof(*attributes));
  const int device = Memory::instance().device_of(p);
  // Runtimes before CUDA 11 refused an address they did not know.
  static const char* const answer = std::getenv("SIMCUDA_POINTER_ATTRIBUTES");
  if (device < 0 && answer != nullptr && std::strcmp(answer, "legacy") == 0) return result(cudaErrorInvalidValue);
  attributes->type = device < 0 ? cudaMemoryTypeUnregistered : cudaMemoryTypeDevice;
  if (device >= 0) attributes->device = device;
  attributes->devicePointer = device < 0 ? nullptr : const_cast<void*>(p);
  attributes->hostPointer = device < 0 ? const_cast<void*>(p) : nullptr;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return result(cudaErrorInvalidValue);
  Memory::instance().info(t_device, free_bytes, total_bytes);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t size, cudaStream_t s) { return malloc_async(p, size, s, false); }
cudaError_t cudaMallocAsync_ptsz(void** p, size_t size, cudaStream_t s) { return malloc_async(p, size, s, true); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { return free_async(p, s, false); }
cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) { return free_async(p, s, true); }
cudaError_t cudaMallocFromPoolAsync(void** p, size_t size, cudaMemPool_t pool, cudaStream_t s) {
  if (pool == nullptr) return result(cudaErrorInvalidValue);
  return malloc_async(p, size, s, false, pool);
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t size, cudaMemPool_t pool, cudaStream_t s) {
  if (pool == nullptr) return result(cudaErrorInvalidValue);
  return malloc_async(p, size, s, true, pool);
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  return result(simcuda::create_mem_pool(pool, props));
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) { return result(simcuda::destroy_mem_pool(pool)); }

cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  return result(simcuda::set_current_mem_pool(device, pool));
}

// The simulated pools keep nothing: stream-ordered memory is freed at once.
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  return simcuda::is_mem_pool(pool) ? cudaSuccess : result(cudaErrorInvalidValue);
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return result(simcuda::mem_pool_get(pool, attr, value));
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return result(simcuda::mem_pool_set(pool, attr, value));
}

cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* pool, int device) {
  if (pool == nullptr || device < 0 || device >= Memory::instance().devices()) return result(cudaErrorInvalidValue);
  if (!simcuda::mem_pools_supported(device)) return result(cudaErrorNotSupported);
  *pool = simcuda::current_mem_pool(device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (pool == nullptr || device < 0 || device >= Memory::instance().devices()) return result(cudaErrorInvalidValue);
  if (!simcuda::mem_pools_supported(device)) return result(cudaErrorNotSupported);
  *pool = simcuda::default_mem_pool(device);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* descs, size_t count) {
  return result(simcuda::set_mem_pool_access(pool, descs, count));
}

cudaError_t cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t pool, cudaMemLocation* location) {
  return result(simcuda::get_mem_pool_access(flags, pool, location));
}

// CUDA 13's pools by location: a device's pinned memory is its
// cudaDevice*MemPool's; host and managed pools the simulated runtime lacks.
namespace {
int pool_device(const cudaMemLocation* location, cudaMemAllocationType type) {
  if (location == nullptr || location->type != cudaMemLocationTypeDevice || type != cudaMemAllocationTypePinned ||
      location->id < 0 || location->id >= Memory::instance().devices()) {
    return -1;
  }
  return location->id;
}
}  // namespace

cudaError_t cudaMemSetMemPool(cudaMemLocation* location, cudaMemAllocationType type, cudaMemPool_t pool) {
  const int device = pool_device(location, type);
  if (device < 0) return result(cudaErrorInvalidValue);
  return result(simcuda::set_current_mem_pool(device, pool));
}

cudaError_t cudaMemGetMemPool(cudaMemPool_t* pool, cudaMemLocation* location, cudaMemAllocationType type) {
  const int device = pool_device(location, type);
  if (device < 0) return result(cudaErrorInvalidValue);
  return cudaDeviceGetMemPool(pool, device);
}

cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t* pool, cudaMemLocation* location, cudaMemAllocationType type) {
  const int device = pool_device(location, type);
  if (device < 0) return result(cudaErrorInvalidValue);
  return cudaDeviceGetDefaultMemPool(pool, device);
}

cudaError_t cudaMallocHost(void** p, size_t size) {
  if (p == nullptr) return result(cudaErrorInvalidValue);
  *p = std::malloc(size == 0 ? 1 : size);
  return *p != nullptr ? cudaSuccess : result(cudaErrorMemoryAllocation);
}

// Host memory is device-visible here whatever the flags (mapped, portable).
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) { return cudaMallocHost(p, size); }

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  // Synchronous: queued on the legacy stream (so ordered after blocking
  // streams' earlier work), then waited for.
  if (const cudaError_t err = memcpy_async(dst, src, count, kind, nullptr, false); err != cudaSuccess) return err;
  return Engine::instance().synchronize(stream_of(nullptr, false));
}

cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t err = memcpy_async(dst, src, count, kind, nullptr, true); err != cudaSuccess) return err;
  return Engine::instance().synchronize(stream_of(nullptr, true));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t s) {
  return memcpy_async(dst, src, count, kind, s, false);
}
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t s) {
  return memcpy_async(dst, src, count, kind, s, true);
}
cudaError_t cudaMemset(void* p, int v, size_t n) { return memset_async(p, v, n, nullptr, false); }
cudaError_t cudaMemset_ptds(void* p, int v, size_t n) { return memset_async(p, v, n, nullptr, true); }
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) { return memset_async(p, v, n, s, false); }
cudaError_t cudaMemsetAsync_ptsz(void* p, int v, size_t n, cudaStream_t s) { return memset_async(p, v, n, s, true); }

// ---------------------------------------------------------------- streams

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr) return result(cudaErrorInvalidValue);
  *s = Engine::instance().create_stream(flags, t_device);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return result(cudaErrorInvalidResourceHandle);
  return result(Engine::instance().destroy_stream(stream_of(s, false)));
}

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int* flags) {
  if (flags == nullptr) return result(cudaErrorInvalidValue);
  *flags = stream_of(s, false)->kind == simcuda::StreamKind::NonBlocking ? cudaStreamNonBlocking : 0;
  return cudaSuccess;
}
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t s, unsigned int* flags) {
  if (flags == nullptr) return result(cudaErrorInvalidValue);
  *flags = stream_of(s, true)->kind == simcuda::StreamKind::NonBlocking ? cudaStreamNonBlocking : 0;
  return cudaSuccess;
}

// CUDA 12.8 and later: the device a stream belongs to (a stream made
// through the driver on another device too).
cudaError_t stream_get_device(cudaStream_t s, int* device, bool per_thread) {
  if (device == nullptr) return result(cudaErrorInvalidValue);
  const Stream* st = stream_of(s, per_thread);
  if (st->destroyed) return result(cudaErrorInvalidResourceHandle);
  *device = st->device;
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) { return stream_get_device(s, device, false); }
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int* device) { return stream_get_device(s, device, true); }

cudaError_t stream_synchronize(cudaStream_t s, bool per_thread) {
  Stream* st = stream_of(s, per_thread);
  return checked(st->device, Engine::instance().synchronize(st));
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  return stream_synchronize(s, false);
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  return stream_synchronize(s, true);
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return Engine::instance().query(stream_of(s, false)); }
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) { return Engine::instance().query(stream_of(s, true)); }

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().wait(stream_of(s, false), ev));
}
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().wait(stream_of(s, true), ev));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return result(cudaErrorInvalidValue);
  return result(Engine::instance().enqueue(stream_of(s, false), [fn, data] { fn(data); }));
}
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return result(cudaErrorInvalidValue);
  return result(Engine::instance().enqueue(stream_of(s, true), [fn, data] { fn(data); }));
}

// ---------------------------------------------------------------- capture

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return result(Engine::instance().begin_capture(stream_of(s, false), mode));
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, cudaStreamCaptureMode mode) {
  return result(Engine::instance().begin_capture(stream_of(s, true), mode));
}

// Into an existing graph (CUDA 12.3): its nodes grow, and the end returns it.
static cudaError_t begin_capture_to_graph(Stream* s, cudaGraph_t graph, size_t dependencies,
                                          cudaStreamCaptureMode mode) {
  if (graph == nullptr || dependencies != 0) return result(cudaErrorInvalidValue);  // no nodes to depend on here
  const cudaError_t err = Engine::instance().begin_capture(s, mode);
  if (err == cudaSuccess) s->capture_graph = graph;
  return result(err);
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t*,
                                          const cudaGraphEdgeData*, size_t count, cudaStreamCaptureMode mode) {
  return begin_capture_to_graph(stream_of(s, false), graph, count, mode);
}
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t*,
                                               const cudaGraphEdgeData*, size_t count, cudaStreamCaptureMode mode) {
  return begin_capture_to_graph(stream_of(s, true), graph, count, mode);
}

static cudaError_t end_capture(Stream* s, cudaGraph_t* graph) {
  if (graph == nullptr) return result(cudaErrorInvalidValue);
  bool valid = false;
  auto* target = static_cast<Graph*>(s->capture_graph);
  const cudaError_t err = Engine::instance().end_capture(s, &valid);
  if (!valid) {
    *graph = nullptr;
  } else if (target != nullptr) {
    target->nodes += s->captured_nodes;
    *graph = reinterpret_cast<cudaGraph_t>(target);
  } else {
    *graph = reinterpret_cast<cudaGraph_t>(new Graph{s->captured_nodes});
  }
  return result(err);
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) { return end_capture(stream_of(s, false), g); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t* g) { return end_capture(stream_of(s, true), g); }

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return result(Engine::instance().exchange_capture_mode(mode));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return result(cudaErrorInvalidValue);
  *status = Engine::instance().capture_status(stream_of(s, false));
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return result(cudaErrorInvalidValue);
  *status = Engine::instance().capture_status(stream_of(s, true));
  return cudaSuccess;
}

cudaError_t cudaGraphCreate(cudaGraph_t* g, unsigned int flags) {
  if (g == nullptr || flags != 0) return result(cudaErrorInvalidValue);
  *g = reinterpret_cast<cudaGraph_t>(new Graph{0});
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete reinterpret_cast<Graph*>(g);
  return cudaSuccess;
}

// ---------------------------------------------------------------- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr) return result(cudaErrorInvalidValue);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorMemoryAllocation);
  auto* ev = new simcuda::Event();
  ev->flags = flags;
  ev->device = t_device;
  {
    std::lock_guard<std::mutex> lock(events_mu());
    events().insert(ev);
  }
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return result(cudaErrorInvalidResourceHandle);
  auto* ev = reinterpret_cast<simcuda::Event*>(e);
  {
    std::lock_guard<std::mutex> lock(events_mu());
    if (events().erase(ev) == 0) {
      // Destroyed already: by a reset (kept, so counted), or by the caller.
      if (reset_events().count(ev) != 0) counters().stale_event_uses++;
      return result(cudaErrorInvalidResourceHandle);
    }
  }
  // Waits already queued copied the event's stream position, so it can go.
  delete ev;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  if (const cudaError_t fault = fault_of(ev->device); fault != cudaSuccess) return result(fault);
  return result(Engine::instance().record(ev, stream_of(s, false)));
}
cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().record(ev, stream_of(s, true)));
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_query_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  if (const cudaError_t fault = fault_of(ev->device); fault != cudaSuccess) return result(fault);
  const cudaError_t err = Engine::instance().query(ev);
  return err == cudaErrorNotReady ? err : result(err);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (Engine::instance().stale_capture_refuses(false)) return result(cudaErrorStreamCaptureUnsupported);
  return checked(ev->device, Engine::instance().synchronize(ev));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  if (ms == nullptr) return result(cudaErrorInvalidValue);
  *ms = 0.0f;
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

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || fn == nullptr) return result(cudaErrorInvalidValue);
  *fn = simcuda::driver_entry_point(symbol);
  if (status != nullptr) *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, CUDART_VERSION, flags, status);
}

// ---------------------------------------------------------------- control

void simcuda_fault_stream(void* stream, int error) {
  Stream* s = stream_of(static_cast<cudaStream_t>(stream), false);
  const int device = s->device;
  Engine::instance().enqueue(s, [device, error] {
    if (device >= 0 && device < kFaultDevices) g_fault[device].store(error);
  });
}

// A stream-ordered allocation is its pool's to open (cudaMemPoolSetAccess).
int simcuda_accessible(const void* ptr, int device) {
  const int pooled = simcuda::mem_pool_accessible(ptr, device);
  if (pooled >= 0) return pooled;
  return Memory::instance().accessible_from(ptr, device) ? 1 : 0;
}

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
