// The devices' calls gpupool intercepts (see serve.hpp): their free memory,
// their resets, their memory pools, peer access and IPC handles. Each passes
// the call on to the runtime and keeps the pool's books around it.
#include <cuda_runtime_api.h>

#include <functional>

#include "shim/driver_calls.hpp"
#include "shim/guard.hpp"
#include "shim/serve.hpp"
#include "shim/step_aside.hpp"

namespace gpupool::shim {

cudaError_t reset_in_books(int device, const char* call, const std::function<cudaError_t()>& reset) {
  // The pool forgets the device's memory once it is gone. No runtime started
  // yet (a reset through the driver before any runtime call): it holds nothing.
  Runtime* runtime = Runtime::if_started();
  const bool valid = runtime != nullptr && device >= 0 && device < kMaxDevices;
  bool tell = valid && !runtime->bypass();
  try {
    if (tell) runtime->device_resetting(device);
  } catch (...) {  // as guarded(): gpupool steps aside, the reset goes on
    step_aside(call);
    tell = false;
  }
  const bool aside = valid && !tell && stepped_aside();
  const cudaError_t err = reset();
  if (tell) keep_books(call, [&] { runtime->device_reset_answered(device, err); });
  if (aside) keep_books(call, [&] { runtime->device_reset_after_stepping_aside(device, err); });
  return err;
}

}  // namespace gpupool::shim

namespace serve {

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemGetInfo>(free_bytes, total_bytes);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaMemGetInfo", [&] { rt.adjust_mem_get_info(free_bytes, total_bytes); });
  }
  return err;
}

// The current device's reset, made by the runtime's function `pick` chooses
// (none: cudaErrorNotSupported), `call` naming it.
template <typename Pick>
cudaError_t reset_device(const char* call, Pick pick) {
  Runtime& rt = enter();
  return gpupool::shim::reset_in_books(rt.current_device(), call, [&] {
    const auto reset = pick(real());
    return reset != nullptr ? reset() : missing();
  });
}

cudaError_t cudaDeviceReset(void) {
  return reset_device("cudaDeviceReset", [](const RealCuda& r) { return r.cudaDeviceReset; });
}

// CUDA 12's old name for the same reset; unseen, it would leave the pool
// lending memory the reset freed. Where the runtime has no such call (CUDA
// 13's, with a library built for CUDA 12 beside it), its cudaDeviceReset,
// which CUDA documents as the same function.
cudaError_t cudaThreadExit(void) {
  return reset_device("cudaThreadExit", [](const RealCuda& r) {
    return r.cudaThreadExit != nullptr ? r.cudaThreadExit : r.cudaDeviceReset;
  });
}

// Trimming a device's default memory pool (PyTorch's cudaMallocAsync backend
// and CuPy free their caches so) gives back gpupool's cache for that device
// too: the program's stream-ordered memory is gpupool's.
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemPoolTrimTo>(pool, min_bytes_to_keep);
  if (err == cudaSuccess && !rt.bypass()) keep_books("cudaMemPoolTrimTo", [&] { rt.trim(pool, min_bytes_to_keep); });
  return err;
}

// A pool the program made, made current, takes over its stream-ordered
// allocations on that device from gpupool (cudaMallocAsync draws from it).
cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaDeviceSetMemPool>(device, pool);
  if (err == cudaSuccess && !rt.disabled()) {
    keep_books("cudaDeviceSetMemPool", [&] { rt.current_pool_set(device, pool); });
  }
  return err;
}

// CUDA 13's way to make a pool current: for a device's pinned memory, the
// same as cudaDeviceSetMemPool (host and managed pools are not gpupool's).
cudaError_t cudaMemSetMemPool(cudaMemLocation* location, cudaMemAllocationType type, cudaMemPool_t pool) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemSetMemPool>(location, type, pool);
  if (err == cudaSuccess && !rt.disabled() && location != nullptr && location->type == cudaMemLocationTypeDevice &&
      type == cudaMemAllocationTypePinned) {
    keep_books("cudaMemSetMemPool", [&] { rt.current_pool_set(location->id, pool); });
  }
  return err;
}

// Another device may now use the pool's memory: where that is a device's
// default pool, the memory is gpupool's, whose pages must open to it too.
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* descs, size_t count) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemPoolSetAccess>(pool, descs, count);
  if (err == cudaSuccess && !rt.disabled()) {
    keep_books("cudaMemPoolSetAccess", [&] { rt.pool_access_set(pool, descs, count); });
  }
  return err;
}

// Destroying a device's current pool makes its default pool current again.
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemPoolDestroy>(pool);
  if (err == cudaSuccess && !rt.disabled()) keep_books("cudaMemPoolDestroy", [&] { rt.pool_destroyed(); });
  return err;
}

// So do the figures of those pools that programs read (PyTorch's
// cudaMallocAsync backend reports memory_allocated() and memory_reserved()
// from them, CuPy its async pool's used and total bytes), and the resets of
// their high watermarks.
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemPoolGetAttribute>(pool, attr, value);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaMemPoolGetAttribute", [&] { rt.add_pool_figure(pool, attr, value); });
  }
  return err;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaMemPoolSetAttribute>(pool, attr, value);
  if (err == cudaSuccess && !rt.bypass()) keep_books("cudaMemPoolSetAttribute", [&] { rt.reset_pool_high(pool, attr); });
  return err;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaDeviceEnablePeerAccess>(peer, flags);
  // The current device may now access the peer's memory: pooled pages too.
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaDeviceEnablePeerAccess",
               [&] { rt.access_granted(rt.current_device(), peer, Runtime::kPeerAccess); });
  }
  return err;
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaDeviceDisablePeerAccess>(peer);
  // Pooled pages close to the current device too, unless the peer's default
  // pool is open to it.
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaDeviceDisablePeerAccess",
               [&] { rt.access_revoked(rt.current_device(), peer, Runtime::kPeerAccess); });
  }
  return err;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  Runtime& rt = enter();
  // A handle naming other memory than the block would corrupt silently (also
  // once gpupool has stepped aside: the blocks it lent are still in use).
  if (!rt.disabled() && !rt.ipc_exportable(ptr, "cudaIpcGetMemHandle", "cudaErrorInvalidValue")) {
    return fail(cudaErrorInvalidValue);
  }
  return pass_on<&RealCuda::cudaIpcGetMemHandle>(handle, ptr);
}

}  // namespace serve
