// Per-thread state the shim keeps beside the runtime's own.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "pool/types.hpp"

namespace gpupool::shim {

// Errors the shim returns without the runtime having seen them (a null
// out-pointer, out of memory inside the pool, a double free), reported by the
// intercepted cudaGetLastError / cudaPeekAtLastError like the runtime's own:
// one per runtime in the process, for that runtime's callers (see
// caller_runtime.hpp).
cudaError_t& thread_error(int runtime);

// Returns `error`, kept for the caller's runtime. Out of line: error paths
// only, kept out of the hot ones.
[[gnu::cold]] cudaError_t fail(cudaError_t error);

// This thread's per-thread default stream, as a pool stream id unique for the
// life of the process (thread ids and addresses are reused; these are not).
StreamId this_thread_stream();

// Pool stream ids for the fixed handles.
inline constexpr StreamId kLegacyStream = 0x1;      // cudaStreamLegacy
inline constexpr StreamId kPerThreadHandle = 0x2;   // cudaStreamPerThread
inline bool is_per_thread_id(StreamId id) { return (id & 0xF) == 0x2 && id > 0xF; }

// The pool's id for a stream handle passed to a legacy or a _ptsz entry point.
inline StreamId stream_id(cudaStream_t handle, bool per_thread_entry) {
  const auto raw = reinterpret_cast<StreamId>(handle);
  if (raw == kPerThreadHandle || (raw == 0 && per_thread_entry)) return this_thread_stream();
  if (raw == 0) return kLegacyStream;
  return raw;
}

// The handle to pass to the runtime for a pool stream id; false when the id is
// another thread's per-thread stream, which cannot be named from here.
inline bool stream_handle(StreamId id, cudaStream_t* out) {
  if (is_per_thread_id(id)) {
    if (id != this_thread_stream()) return false;
    *out = cudaStreamPerThread;
    return true;
  }
  *out = reinterpret_cast<cudaStream_t>(id);
  return true;
}

}  // namespace gpupool::shim
