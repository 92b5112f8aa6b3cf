// The CUDA runtime entry points gpupool intercepts, as libgpupool-core.so
// serves them: the preload library (preload.c) forwards each call here through
// the table gpupool_core_open returns, the only symbol this library exports.
// Here: the guard around every call, the table, the process's lifecycle, and
// the memory calls themselves (the hot ones inline into their exports); the
// other calls are served beside (see serve.hpp).
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <cstdint>
#include <cstdio>
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
#include "shim/serve.hpp"
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
using gpupool::shim::guarded;
using gpupool::shim::keep_books;
using gpupool::shim::Runtime;
using gpupool::shim::step_aside;

// The memory calls' shared work (see serve.hpp for the names it uses).
namespace serve {
namespace {

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

}  // namespace
}  // namespace serve

namespace {

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
  if (const cudaError_t err = serve::free_result(r, ptr, call); err != cudaSuccess) return err;
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
  return serve::free_on(ptr, stream, per_thread, call);
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
