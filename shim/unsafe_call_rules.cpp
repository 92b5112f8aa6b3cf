#include "shim/unsafe_call_rules.hpp"

#include <algorithm>

#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {
// This thread's thread-local captures begun and not settled. Trivially
// destructible: a key destructor's late CUDA call may still read it.
int& own_thread_local_captures() {
  thread_local int captures = 0;
  return captures;
}
}  // namespace

void UnsafeCallRules::capture_began(cudaStreamCaptureMode mode) {
  if (mode == cudaStreamCaptureModeGlobal) global_.fetch_add(1, std::memory_order_relaxed);
  if (mode == cudaStreamCaptureModeThreadLocal) ++own_thread_local_captures();
}

void UnsafeCallRules::capture_ended(cudaStreamCaptureMode mode, StreamId beginner) {
  if (mode == cudaStreamCaptureModeGlobal) global_.fetch_sub(1, std::memory_order_relaxed);
  if (mode != cudaStreamCaptureModeThreadLocal) return;
  if (beginner == this_thread_stream()) {
    int& count = own_thread_local_captures();
    if (count > 0) --count;
    return;
  }
  std::lock_guard<std::mutex> lock(owed_mu_);
  auto it = std::find_if(owed_.begin(), owed_.end(), [&](const auto& e) { return e.first == beginner; });
  if (it == owed_.end()) {
    owed_.emplace_back(beginner, 1);
  } else {
    ++it->second;
  }
  owed_total_.fetch_add(1, std::memory_order_relaxed);
}

bool UnsafeCallRules::forbid_this_thread() const {
  if (global_.load(std::memory_order_relaxed) > 0) return true;
  int& count = own_thread_local_captures();
  // A settlement missed here (the owed one counted a moment late) only
  // forbids this once more.
  if (count > 0 && owed_total_.load(std::memory_order_relaxed) > 0) settle_owed(count);
  return count > 0;
}

void UnsafeCallRules::settle_owed(int& count) const {
  std::lock_guard<std::mutex> lock(owed_mu_);
  const StreamId me = this_thread_stream();
  auto it = std::find_if(owed_.begin(), owed_.end(), [&](const auto& e) { return e.first == me; });
  if (it == owed_.end()) return;
  count = std::max(0, count - it->second);
  owed_total_.fetch_sub(it->second, std::memory_order_relaxed);
  owed_.erase(it);
}

}  // namespace gpupool::shim
