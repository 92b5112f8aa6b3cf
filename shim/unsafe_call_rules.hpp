// Which threads captures under way forbid unsafe calls (cudaFree, cudaMalloc,
// device waits: calls that would break them). A global-mode capture forbids
// them to every thread, a thread-local one to the thread that began it, a
// relaxed one to none (CUDA's capture modes).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
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
  // Called as a thread ends: nothing can be owed to it any more.
  void thread_ending();

  // Threads with thread-local captures counted (for tests).
  std::size_t beginners() const;

 private:
  // A thread counts its own thread-local captures, in a thread_local: the
  // check stays one load. One ended on another thread is owed to its
  // beginner, which settles it at its next check; until then it forbids that
  // thread more than CUDA does, never less. Only threads with a capture
  // counted (and not yet ended) are listed, so the list stays as short as
  // the captures under way.
  struct Beginner {
    StreamId thread;
    int owed;
  };
  void settle_owed(int& count) const;
  // Unlists this thread, whose count is 0 now.
  void forget_this_thread() const;

  std::atomic<int> global_{0};
  mutable std::atomic<int> owed_total_{0};
  mutable std::mutex beginners_mu_;
  mutable std::vector<Beginner> beginners_;  // guarded by beginners_mu_
};

}  // namespace gpupool::shim
