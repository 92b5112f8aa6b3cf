// Which threads captures under way forbid unsafe calls (cudaFree, cudaMalloc,
// device waits: calls that would break them). A global-mode capture forbids
// them to every thread, a thread-local one to the thread that began it, a
// relaxed one to none (CUDA's capture modes).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "pool/types.hpp"

namespace gpupool::shim {

class UnsafeCallRules {
 public:
  // Called on the thread that begins the capture.
  void capture_began(cudaStreamCaptureMode mode);
  // Called on any thread: `beginner` is the this_thread_stream() of the
  // thread that began it. A capture can end where it did not begin: its
  // stream destroyed or its device reset by another thread, or its end
  // called there.
  void capture_ended(cudaStreamCaptureMode mode, StreamId beginner);
  // Whether a capture under way forbids this thread unsafe calls.
  bool forbid_this_thread() const;

 private:
  // A thread counts its own thread-local captures, in a thread_local: the
  // check stays one load. One ended on another thread is owed to its
  // beginner, which settles it at its next check; until then it forbids that
  // thread more than CUDA does, never less.
  void settle_owed(int& count) const;

  std::atomic<int> global_{0};
  mutable std::atomic<int> owed_total_{0};
  mutable std::mutex owed_mu_;
  mutable std::vector<std::pair<StreamId, int>> owed_;  // by beginner; guarded by owed_mu_
};

}  // namespace gpupool::shim
