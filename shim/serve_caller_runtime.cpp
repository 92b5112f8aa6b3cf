// What the caller's own runtime answers (see caller_runtime.hpp): the driver
// functions it fetches, watched where gpupool watches them, and its last
// error, with gpupool's own for that runtime's callers.
#include <cuda_runtime_api.h>

#include "shim/caller_runtime.hpp"
#include "shim/driver_calls.hpp"
#include "shim/guard.hpp"
#include "shim/serve.hpp"

namespace serve {

// ---------------------------------------------------------------- driver functions through the runtime

namespace {

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

}  // namespace

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
namespace {

constinit thread_local bool reading_runtime_error = false;

cudaError_t read_runtime_error(cudaError_t (*read)(), cudaError_t (*real_read)()) {
  if (reading_runtime_error) return real_read != nullptr ? real_read() : cudaSuccess;
  reading_runtime_error = true;
  const cudaError_t err = read();
  reading_runtime_error = false;
  return err;
}

}  // namespace

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

}  // namespace serve
