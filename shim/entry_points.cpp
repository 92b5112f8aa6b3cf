// The CUDA runtime entry points gpupool intercepts, as libgpupool-core.so
// serves them: the preload library (preload.c) forwards each call here through
// the table gpupool_core_open returns, the only symbol this library exports.
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string_view>

#include "shim/caller_runtime.hpp"
#include "shim/core_interface.h"
#include "shim/driver_calls.hpp"
#include "shim/guard.hpp"
#include "shim/library_opening.hpp"
#include "shim/messages.hpp"
#include "shim/ptsz.h"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"
#include "shim/thread_state.hpp"

// Hidden like everything here (only gpupool_core_open is exported): the
// preload library reaches these through the table.
#define GPUPOOL_EXPORT extern "C"

using gpupool::FreeResult;
using gpupool::StreamId;
using gpupool::shim::cuda_driver_loaded;

namespace gpupool::shim {
// driver_entry_points.cpp
void* driver_entry(const char* symbol, int version, unsigned long long flags, void* real,
                   gpupool_driver_lookup_fn lookup);
int driver_library_accepted(const char* path, const char* symbol);
void* driver_symbol(const char* exported, void* real, gpupool_driver_lookup_fn lookup);
// driver_watch.cpp: the watched driver calls a program linked with the driver
// makes (each the preload's export's, with the driver's own as `real`)
int direct_stream_destroy(void* stream, int (*real)(void* stream));
int direct_device_reset(int device, int (*real)(int device));
int direct_mem_free(unsigned long long ptr, int (*real)(unsigned long long ptr));
int direct_mem_free_async(unsigned long long ptr, void* stream, int (*real)(unsigned long long ptr, void* stream));
int direct_mem_free_async_ptsz(unsigned long long ptr, void* stream,
                               int (*real)(unsigned long long ptr, void* stream));
int direct_ipc_get_mem_handle(void* handle, unsigned long long ptr, int (*real)(void* handle, unsigned long long ptr));
int direct_begin_capture_v1(void* stream, int (*real)(void* stream));
int direct_begin_capture_v1_ptsz(void* stream, int (*real)(void* stream));
int direct_begin_capture(void* stream, int mode, int (*real)(void* stream, int mode));
int direct_begin_capture_ptsz(void* stream, int mode, int (*real)(void* stream, int mode));
int direct_begin_capture_to_graph(void* stream, void* graph, const void* deps, const void* data, size_t count, int mode,
                                  gpupool_begin_capture_to_graph_fn real);
int direct_begin_capture_to_graph_ptsz(void* stream, void* graph, const void* deps, const void* data, size_t count,
                                       int mode, gpupool_begin_capture_to_graph_fn real);
int direct_end_capture(void* stream, void** graph, int (*real)(void* stream, void** graph));
int direct_end_capture_ptsz(void* stream, void** graph, int (*real)(void* stream, void** graph));

// Pitched memory (cudaMallocPitch, cudaMalloc3D, the driver's cuMemAllocPitch)
// is served as cudaMalloc of `rows` rows of *pitch bytes. Each row is padded to
// 512 bytes, as the runtime has padded them on the GPUs we know of: the base
// alignment texture binding needs (cudaDevAttrTextureAlignment), a multiple of
// the pitch alignment it needs, and where every pooled block starts. False where the runtime's own call is to
// answer, so that it answers as it would without gpupool: gpupool bypassed, an
// empty or overflowing extent, a null argument.
bool allocate_pitched(void** ptr, size_t* pitch, size_t width, size_t rows, cudaError_t* result) {
  constexpr size_t kRowAlignment = 512;
  Runtime& rt = Runtime::get();
  if (rt.bypass() || ptr == nullptr || pitch == nullptr || width == 0 || rows == 0) return false;
  if (width > SIZE_MAX - (kRowAlignment - 1)) return false;
  const size_t row = (width + kRowAlignment - 1) / kRowAlignment * kRowAlignment;
  if (rows > SIZE_MAX / row) return false;
  *result = rt.allocate(ptr, row * rows, gpupool::kAnyStream, rt.current_device());
  if (*result == cudaSuccess) *pitch = row;
  return true;
}
}  // namespace gpupool::shim
using gpupool::shim::allocate_pitched;
using gpupool::shim::close_library_opening;
using gpupool::shim::explain_nothing_pooled;
using gpupool::shim::fail;
using gpupool::shim::guarded;
using gpupool::shim::keep_books;
using gpupool::shim::real;
using gpupool::shim::RealCuda;
using gpupool::shim::Runtime;
using gpupool::shim::step_aside;
using gpupool::shim::stream_id;

namespace {

// Entry for every intercepted call: starts the runtime on first use and
// serves a report a signal asked for.
Runtime& enter() {
  Runtime& rt = Runtime::get();
  rt.poll_report_request();
  return rt;
}

cudaError_t missing() { return fail(cudaErrorNotSupported); }

// A call passed on to the runtime: cudaErrorNotSupported where it has no such
// function (an older runtime), or where no runtime was found at all.
template <auto function, typename... Args>
cudaError_t pass_on(Args... args) {
  const auto call = real().*function;
  return call != nullptr ? call(args...) : missing();
}

cudaError_t free_result(FreeResult r, void* ptr, const char* call) {
  if (r == FreeResult::Freed) return cudaSuccess;
  // NotAllocated: inside a pooled segment but not live. The real runtime would
  // reject it too (it never handed this pointer out as an allocation).
  char line[200];
  std::snprintf(line, sizeof line,
                "gpupool: %s: %p is not a live allocation (freed twice, or not the start of a block)", call, ptr);
  gpupool::shim::message(gpupool::config::LogLevel::Warn, line);
  return fail(cudaErrorInvalidValue);
}

// A stream-ordered allocation on `device`'s pool for the stream `id`: false
// where the runtime must serve it instead (see Runtime::allocate).
bool pooled_stream_ordered(Runtime& rt, void** ptr, size_t size, StreamId id, int device, bool named_default_pool,
                           cudaError_t* result) {
  rt.note_stream_ordered_call();
  if (size == 0) {
    *ptr = nullptr;
    *result = cudaSuccess;
    return true;
  }
  bool runtime_serves = false;
  *result = rt.allocate(ptr, size, id, device, &runtime_serves, named_default_pool);
  return !runtime_serves;
}

cudaError_t malloc_on(void** ptr, size_t size, cudaStream_t stream, bool per_thread) {
  Runtime& rt = enter();
  auto real_call = per_thread ? real().cudaMallocAsync_ptsz : real().cudaMallocAsync;
  if (rt.bypass()) return real_call != nullptr ? real_call(ptr, size, stream) : missing();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  const StreamId id = stream_id(stream, per_thread);
  const int device = rt.prepare_stream(id);
  cudaError_t err = cudaSuccess;
  if (device != Runtime::kNoSuchStream && pooled_stream_ordered(rt, ptr, size, id, device, false, &err)) return err;
  return real_call != nullptr ? real_call(ptr, size, stream) : missing();
}

// cudaMallocFromPoolAsync: the default pool of the stream's device is
// gpupool's memory (TensorFlow's and XLA's async allocators ask for it by
// name); any other pool is the runtime's.
cudaError_t malloc_from_pool(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream, bool per_thread) {
  Runtime& rt = enter();
  auto real_call = per_thread ? real().cudaMallocFromPoolAsync_ptsz : real().cudaMallocFromPoolAsync;
  if (!rt.bypass() && ptr != nullptr) {
    const StreamId id = stream_id(stream, per_thread);
    const int device = rt.prepare_stream(id);
    cudaError_t err = cudaSuccess;
    if (device != Runtime::kNoSuchStream && rt.is_default_pool(pool, device) &&
        pooled_stream_ordered(rt, ptr, size, id, device, true, &err)) {
      return err;
    }
  }
  return real_call != nullptr ? real_call(ptr, size, pool, stream) : missing();
}

// cudaFreeAsync naming a handle the runtime says is no stream's (one the
// program destroyed): refused, as the runtime refuses it, its block left
// live (a leak the report lists) rather than freed in no stream's order.
template <typename RealFree>
cudaError_t free_on_no_stream(Runtime& rt, void* ptr, cudaStream_t stream, RealFree real_call, const char* call) {
  if (rt.device_holding(ptr) < 0) return real_call != nullptr ? real_call(ptr, stream) : missing();
  // The driver's call (cuMemFreeAsync) answers the same number by its own name.
  const char* refusal =
      std::string_view(call).starts_with("cuda") ? "cudaErrorInvalidResourceHandle" : "CUDA_ERROR_INVALID_HANDLE";
  char line[200];
  std::snprintf(line, sizeof line,
                "gpupool: %s: the runtime knows no stream %p (destroyed?); refused with %s, and %p stays allocated",
                call, static_cast<void*>(stream), refusal, ptr);
  gpupool::shim::message(gpupool::config::LogLevel::Warn, line);
  return fail(cudaErrorInvalidResourceHandle);
}

cudaError_t free_on(void* ptr, cudaStream_t stream, bool per_thread, const char* call) {
  Runtime& rt = enter();
  auto real_call = per_thread ? real().cudaFreeAsync_ptsz : real().cudaFreeAsync;
  if (rt.disabled() || ptr == nullptr) return real_call != nullptr ? real_call(ptr, stream) : missing();
  const StreamId id = stream_id(stream, per_thread);
  int device = -1;
  if (!rt.bypass()) {
    device = rt.prepare_stream(id);
    if (device == Runtime::kNoSuchStream) return free_on_no_stream(rt, ptr, stream, real_call, call);
    rt.note_stream_ordered_call();
  }
  const FreeResult r = rt.deallocate(ptr, id, device);
  if (r == FreeResult::NotOwned) return real_call != nullptr ? real_call(ptr, stream) : missing();
  return free_result(r, ptr, call);
}

// The pool stops ordering on the stream before the runtime starts capturing
// it: a fence recorded there in between would join the capture, and a wait
// there would break it. If the runtime refuses, the pool takes it back.
template <typename Begin>
cudaError_t begin_capture(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, Begin&& begin) {
  Runtime& rt = Runtime::get();
  const bool tell = !rt.bypass();
  const StreamId id = stream_id(stream, per_thread);
  if (tell) rt.capture_began(id, mode);
  const cudaError_t err = begin();
  if (err != cudaSuccess && tell) keep_books("cudaStreamBeginCapture", [&] { rt.capture_ended(id); });
  return err;
}

cudaError_t end_capture(cudaStream_t stream, bool per_thread, cudaError_t err) {
  // The capture is over whatever the result (an invalidated one ends too),
  // unless the runtime refused an end on another thread than the one that
  // began it and says the capture goes on.
  Runtime& rt = Runtime::get();
  if (!rt.bypass()) {
    keep_books("cudaStreamEndCapture", [&] {
      const StreamId id = stream_id(stream, per_thread);
      if (err == cudaErrorStreamCaptureWrongThread && rt.still_capturing(id)) return;
      rt.capture_ended(id);
    });
  }
  return err;
}

// ---------------------------------------------------------------- lifecycle

void at_exit() {
  // The runtime's functions are resolved now, if they have not been, while
  // libraries may still be opened: a runtime loaded since the core opened,
  // reachable only from a library's own scope, could not be found once the
  // opening is closed, and a thread's first use of them would call nothing.
  try {
    gpupool::shim::resolve_real_where_runtime_loaded();
  } catch (...) {  // (std::call_once's own failure) the handler goes on
  }
  close_library_opening();  // before glibc's _dl_fini, which comes next
  try {
    if (Runtime* rt = Runtime::if_started()) {
      rt->at_exit();
      return;
    }
    // No call reached gpupool, yet CUDA may have been used all the same.
    if (!cuda_driver_loaded()) return;
    const gpupool::config::Config c =
        gpupool::config::parse_config(gpupool::config::process_environment()).config;
    gpupool::shim::set_log_level(c.log_level);
    if (!c.disable) explain_nothing_pooled(c.static_runtime);
  } catch (...) {
    step_aside("at exit", true);
  }
}

// Neither handler of the fork allocates or throws (see Runtime::before_fork).
// A caller's runtime being looked up goes first (no lock of the runtime's is
// held around a lookup).
void prepare_fork() {
  gpupool::shim::caller_lookups_mutex().lock();
  if (Runtime* rt = Runtime::if_started()) rt->before_fork();
}
void parent_after_fork() {
  if (Runtime* rt = Runtime::if_started()) rt->after_fork_parent();
  gpupool::shim::caller_lookups_mutex().unlock();
}
void child_after_fork() {
  gpupool::shim::forget_library_openers();
  if (Runtime* rt = Runtime::if_started()) rt->after_fork_child();
  gpupool::shim::caller_lookups_mutex().unlock();
}

// The driver's entry points are fetched through these (preload.c): should
// gpupool fail there, the program gets the driver's own function.
void* guarded_driver_entry(const char* symbol, int version, unsigned long long flags, void* real_fn,
                   gpupool_driver_lookup_fn lookup) {
  void* given = real_fn;
  keep_books("cuGetProcAddress", [&] { given = gpupool::shim::driver_entry(symbol, version, flags, real_fn, lookup); });
  return given;
}
void* guarded_watched_driver_entry(const char* symbol, int version, unsigned long long flags, void* real_fn) {
  void* given = real_fn;
  keep_books("cuGetProcAddress", [&] {
    void* watching = gpupool::shim::watching_driver_call(symbol, version, flags, real_fn);
    if (watching != nullptr) given = watching;
  });
  return given;
}
int guarded_driver_library_accepted(const char* path, const char* symbol) {
  int accepted = 0;
  keep_books("dlsym", [&] { accepted = gpupool::shim::driver_library_accepted(path, symbol); });
  return accepted;
}
void* guarded_driver_symbol(const char* exported, void* real_fn, gpupool_driver_lookup_fn lookup) {
  void* given = real_fn;
  keep_books("dlsym", [&] { given = gpupool::shim::driver_symbol(exported, real_fn, lookup); });
  return given;
}

const void* guarded_real_function(const char* name) {
  const void* function = nullptr;
  keep_books("dlsym", [&] { function = gpupool::shim::real_function(name); });
  return function;
}

}  // namespace

namespace gpupool::shim {
// Inlined in cudaFree, as its body was (a plain free's path); the driver's
// free calls it through free_plain.
[[gnu::always_inline]] inline cudaError_t free_plain_here(void* ptr, const char* call) {
  Runtime& rt = enter();
  // cudaFree(NULL) is how programs create the CUDA context (before OptiX or
  // the driver API, or to keep it out of a timing): it reaches the runtime.
  if (rt.disabled() || ptr == nullptr) return pass_on<&RealCuda::cudaFree>(ptr);
  int owner = -1;
  const FreeResult r = rt.deallocate(ptr, gpupool::kAnyStream, -1, &owner);
  if (r == FreeResult::NotOwned) return pass_on<&RealCuda::cudaFree>(ptr);
  if (const cudaError_t err = free_result(r, ptr, call); err != cudaSuccess) return err;
  // free_synchronizes:1 keeps the rest of cudaFree's promise: the host goes on
  // once the memory's device has done all earlier work (the device barrier
  // already orders its reuse). Not during a capture, which a synchronization
  // would break. An error it reports (an earlier kernel's) is cudaFree's to
  // return, as the runtime's would.
  if (rt.config().free_synchronizes && !rt.exiting() && !rt.any_capture()) return rt.synchronize_for_free(owner);
  return cudaSuccess;
}

cudaError_t free_plain(void* ptr, const char* call) { return free_plain_here(ptr, call); }

cudaError_t free_stream_ordered(void* ptr, cudaStream_t stream, bool per_thread, const char* call) {
  return free_on(ptr, stream, per_thread, call);
}

cudaError_t begin_capture_in_books(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, const char* call,
                                   const std::function<cudaError_t()>& begin) {
  return guarded(call, [&] {
    enter();
    return begin_capture(stream, per_thread, mode, begin);
  });
}

void end_capture_in_books(cudaStream_t stream, bool per_thread, cudaError_t err, const char* call) {
  guarded(call, [&] {
    enter();
    return end_capture(stream, per_thread, err);
  });
}

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

// ---------------------------------------------------------------- memory

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Runtime& rt = enter();
  if (rt.bypass()) return pass_on<&RealCuda::cudaMalloc>(ptr, size);
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  return rt.allocate(ptr, size, gpupool::kAnyStream, rt.current_device());
}

cudaError_t cudaFree(void* ptr) { return gpupool::shim::free_plain_here(ptr, "cudaFree"); }

cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width, size_t height) {
  enter();
  cudaError_t err = cudaSuccess;
  if (allocate_pitched(ptr, pitch, width, height, &err)) return err;
  return pass_on<&RealCuda::cudaMallocPitch>(ptr, pitch, width, height);
}

cudaError_t cudaMalloc3D(cudaPitchedPtr* pitched, cudaExtent extent) {
  enter();
  const bool fits = extent.depth == 0 || extent.height <= SIZE_MAX / extent.depth;
  void* ptr = nullptr;
  size_t pitch = 0;
  cudaError_t err = cudaSuccess;
  if (pitched != nullptr && fits && allocate_pitched(&ptr, &pitch, extent.width, extent.height * extent.depth, &err)) {
    if (err == cudaSuccess) *pitched = cudaPitchedPtr{ptr, pitch, extent.width, extent.height};
    return err;
  }
  return pass_on<&RealCuda::cudaMalloc3D>(pitched, extent);
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return malloc_on(ptr, size, stream, false);
}
cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  return malloc_on(ptr, size, stream, true);
}
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream) {
  return malloc_from_pool(ptr, size, pool, stream, false);
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t pool,
                                                        cudaStream_t stream) {
  return malloc_from_pool(ptr, size, pool, stream, true);
}
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) { return free_on(ptr, stream, false, "cudaFreeAsync"); }
cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  return free_on(ptr, stream, true, "cudaFreeAsync");
}

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

// ---------------------------------------------------------------- driver functions through the runtime

// A runtime's version, at which its cudaGetDriverEntryPoint fetches; 0 where
// unknown, at which only the stream destroy and the reset (one signature at
// every version) are watched, the frees, IPC handle and captures not.
int runtime_version(const gpupool::shim::RuntimeFetches& runtime) {
  int version = 0;
  return runtime.get_version != nullptr && runtime.get_version(&version) == cudaSuccess ? version : 0;
}

// A driver function fetched through the caller's own runtime (see
// RuntimeFetches), as `fetch` does: its answer, with a watched call's
// function swapped for gpupool's (see watch_runtime_fetch).
template <typename Fetch>
cudaError_t fetched_driver_function(const char* call, const char* symbol, void** fn, int version,
                                    unsigned long long flags, bool per_thread_default, Fetch&& fetch) {
  enter();
  const cudaError_t err = fetch();
  if (err == cudaSuccess) {
    keep_books(call, [&] { gpupool::shim::watch_runtime_fetch(symbol, fn, version, flags, per_thread_default); });
  }
  return err;
}

// The call without a version, or (per_thread_twin) its _ptsz twin.
cudaError_t fetch_at_runtime_version(const char* symbol, void** fn, unsigned long long flags,
                                     cudaDriverEntryPointQueryResult* status, bool per_thread_twin) {
  const auto own = gpupool::shim::caller_runtime().fetches;
  const auto entry_point = per_thread_twin ? own.entry_point_ptsz : own.entry_point;
  return fetched_driver_function("cudaGetDriverEntryPoint", symbol, fn, runtime_version(own), flags, per_thread_twin,
                                 [&] { return entry_point != nullptr ? entry_point(symbol, fn, flags, status) : missing(); });
}

// The call with a version, or (per_thread_twin) its _ptsz twin.
cudaError_t fetch_by_version(const char* symbol, void** fn, unsigned int version, unsigned long long flags,
                             cudaDriverEntryPointQueryResult* status, bool per_thread_twin) {
  const auto own = gpupool::shim::caller_runtime().fetches;
  const auto by_version = per_thread_twin ? own.entry_point_by_version_ptsz : own.entry_point_by_version;
  return fetched_driver_function("cudaGetDriverEntryPointByVersion", symbol, fn, static_cast<int>(version), flags,
                                 per_thread_twin, [&] {
                                   return by_version != nullptr ? by_version(symbol, fn, version, flags, status)
                                                                : missing();
                                 });
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  return fetch_at_runtime_version(symbol, fn, flags, status, false);
}
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fn, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* status) {
  return fetch_at_runtime_version(symbol, fn, flags, status, true);
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return fetch_by_version(symbol, fn, version, flags, status, false);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fn, unsigned int version,
                                                  unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return fetch_by_version(symbol, fn, version, flags, status, true);
}

// ---------------------------------------------------------------- errors

// The caller's runtime's last error, and gpupool's for that runtime's callers.
// A library whose own cudaGetLastError forwards to the function it fetched
// by name from the runtime (the cudart stubs of TensorFlow and XLA) is handed
// gpupool's (driver_hook.c), and counts as a runtime of its own
// (caller_runtime.hpp): reading that runtime's error calls the library's
// function, which comes back here on the same thread. The runtime behind it
// is real()'s, which answers that inner call.
constinit thread_local bool reading_runtime_error = false;

cudaError_t read_runtime_error(cudaError_t (*read)(), cudaError_t (*real_read)()) {
  if (reading_runtime_error) return real_read != nullptr ? real_read() : cudaSuccess;
  reading_runtime_error = true;
  const cudaError_t err = read();
  reading_runtime_error = false;
  return err;
}

cudaError_t cudaGetLastError(void) {
  const gpupool::shim::CallerRuntime runtime = gpupool::shim::caller_runtime();
  const cudaError_t runtime_error =
      runtime.errors.get_last != nullptr ? read_runtime_error(runtime.errors.get_last, real().cudaGetLastError)
                                         : cudaSuccess;
  cudaError_t& ours = gpupool::shim::thread_error(runtime.number);
  if (ours == cudaSuccess) return runtime_error;
  const cudaError_t e = ours;
  ours = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  const gpupool::shim::CallerRuntime runtime = gpupool::shim::caller_runtime();
  const cudaError_t ours = gpupool::shim::thread_error(runtime.number);
  if (ours != cudaSuccess || runtime.errors.peek_at_last == nullptr) return ours;
  return read_runtime_error(runtime.errors.peek_at_last, real().cudaPeekAtLastError);
}

// ---------------------------------------------------------------- streams

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreate>(stream);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreate", [&] { rt.stream_created(*stream, cudaStreamDefault); });
  }
  return err;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreateWithFlags>(stream, flags);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreateWithFlags", [&] { rt.stream_created(*stream, flags); });
  }
  return err;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreateWithPriority>(stream, flags, priority);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreateWithPriority", [&] { rt.stream_created(*stream, flags); });
  }
  return err;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& rt = enter();
  const int device = !rt.bypass() && stream != nullptr ? rt.stream_destroying(stream) : -1;
  const cudaError_t err = pass_on<&RealCuda::cudaStreamDestroy>(stream);
  if (device >= 0) {
    const StreamId id = reinterpret_cast<StreamId>(stream);
    keep_books("cudaStreamDestroy", [&] { rt.stream_destroy_answered(id, device, err == cudaSuccess); });
  }
  return err;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCapture == nullptr) return missing();
  return begin_capture(stream, false, mode, [&] { return real().cudaStreamBeginCapture(stream, mode); });
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCapture_ptsz == nullptr) return missing();
  return begin_capture(stream, true, mode, [&] { return real().cudaStreamBeginCapture_ptsz(stream, mode); });
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                         const cudaGraphNode_t* deps, const cudaGraphEdgeData* data,
                                                         size_t count, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCaptureToGraph == nullptr) return missing();
  return begin_capture(stream, false, mode,
                       [&] { return real().cudaStreamBeginCaptureToGraph(stream, graph, deps, data, count, mode); });
}
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                              const cudaGraphNode_t* deps,
                                                              const cudaGraphEdgeData* data, size_t count,
                                                              cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCaptureToGraph_ptsz == nullptr) return missing();
  return begin_capture(stream, true, mode, [&] {
    return real().cudaStreamBeginCaptureToGraph_ptsz(stream, graph, deps, data, count, mode);
  });
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  enter();
  if (real().cudaStreamEndCapture == nullptr) return missing();
  return end_capture(stream, false, real().cudaStreamEndCapture(stream, graph));
}
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  enter();
  if (real().cudaStreamEndCapture_ptsz == nullptr) return missing();
  return end_capture(stream, true, real().cudaStreamEndCapture_ptsz(stream, graph));
}

}  // namespace serve

// ---------------------------------------------------------------- the guard

// What the program calls: each entry point's work under the guard, so that no
// exception ever reaches the program's frames (see step_aside.hpp). The error
// of a call passed on to real() is its caller's runtime's (see
// caller_runtime.hpp); the two that read errors set none.
namespace {
constexpr bool reads_errors(std::string_view call) {
  return call == "cudaGetLastError" || call == "cudaPeekAtLastError";
}
template <bool kReadsErrors>
cudaError_t with_error_to_caller(cudaError_t err) {
  if constexpr (!kReadsErrors) {
    if (err != cudaSuccess) gpupool::shim::give_error_to_caller(err);
  }
  return err;
}
}  // namespace
// cudaGetDriverEntryPoint is deprecated, and intercepted all the same (see
// fetched_driver_function): its export and its place in the table below.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define GPUPOOL_ENTRY(name, params, args)                                                              \
  GPUPOOL_EXPORT cudaError_t name params {                                                             \
    return with_error_to_caller<reads_errors(#name)>(guarded(#name, [&] { return serve::name args; })); \
  }
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY

// ---------------------------------------------------------------- the table

extern "C" __attribute__((visibility("default"))) const gpupool_core* gpupool_core_open(
    int abi, gpupool_lookup_fn lookup, gpupool_caller_fn caller, gpupool_stderr_fn stderr_takes_lines) {
  if (abi != GPUPOOL_CORE_ABI) return nullptr;
  gpupool::shim::set_stderr_check(stderr_takes_lines);
  gpupool::shim::set_symbol_lookup(lookup);
  gpupool::shim::set_caller_lookup(caller);
  gpupool::shim::resolve_real_where_runtime_loaded();
  static const gpupool_core table = {
      GPUPOOL_CORE_ABI,
#define GPUPOOL_ENTRY(name, params, args) &name,
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
      &at_exit,
      &prepare_fork,
      &parent_after_fork,
      &child_after_fork,
      &guarded_driver_entry,
      &guarded_driver_library_accepted,
      &guarded_driver_symbol,
      &guarded_watched_driver_entry,
      &gpupool::shim::direct_stream_destroy,
      &gpupool::shim::direct_device_reset,
      &gpupool::shim::direct_mem_free,
      &gpupool::shim::direct_mem_free_async,
      &gpupool::shim::direct_mem_free_async_ptsz,
      &gpupool::shim::direct_ipc_get_mem_handle,
      &gpupool::shim::direct_begin_capture_v1,
      &gpupool::shim::direct_begin_capture_v1_ptsz,
      &gpupool::shim::direct_begin_capture,
      &gpupool::shim::direct_begin_capture_ptsz,
      &gpupool::shim::direct_begin_capture_to_graph,
      &gpupool::shim::direct_begin_capture_to_graph_ptsz,
      &gpupool::shim::direct_end_capture,
      &gpupool::shim::direct_end_capture_ptsz,
      &guarded_real_function,
  };
  return &table;
}
#pragma GCC diagnostic pop
