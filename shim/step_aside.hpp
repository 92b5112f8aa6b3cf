// What gpupool does when its own work throws: an exception (std::bad_alloc,
// the host out of memory) must never unwind into the program's C frames, where
// it would terminate the process. gpupool steps aside instead, for good: from
// then on every allocation is the CUDA runtime's, a free of memory the pool
// lent is taken and kept (never lent again, so never lent twice), and the
// pool's figures stop where they were. Whatever the failure left half done,
// no later call trusts it.
#pragma once

#include <atomic>

namespace gpupool::shim {

// Called inside a catch block: the first time, keeps the call's name and the
// exception's message for the report and writes one line on stderr (which
// says what is lost, at exit: `exiting`). Allocates nothing.
void step_aside(const char* call, bool exiting = false) noexcept;

inline std::atomic<bool>& stepped_aside_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline bool stepped_aside() { return stepped_aside_flag().load(std::memory_order_relaxed); }

// The call that stepped aside and why ("" before then, or while the first
// step_aside is still writing them).
const char* stepped_aside_call();
const char* stepped_aside_reason();

// Bookkeeping after the runtime has done a call: should it throw, gpupool
// steps aside and the call's result stays the runtime's.
template <typename Work>
void keep_books(const char* call, Work&& work) noexcept {
  try {
    work();
  } catch (...) {
    step_aside(call);
  }
}

}  // namespace gpupool::shim
