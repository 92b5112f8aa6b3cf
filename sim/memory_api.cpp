// The simulated runtime's memory calls: cudaMalloc and cudaFree, the
// stream-ordered pair, copies and sets, and what memory is where.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "sim/counters.hpp"
#include "sim/engine.hpp"
#include "sim/mem_pools.hpp"
#include "sim/memory.hpp"
#include "sim/ptsz.h"
#include "sim/runtime_state.hpp"

// The runtime's own names, and what its entry points share (runtime_state.hpp).
using namespace simcuda;
using namespace simcuda::rt;

namespace {

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

}  // namespace

extern "C" {

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

}  // extern "C"
