#include "shim/unsafe_call_rules.hpp"

#include <algorithm>
#include <utility>

#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {
// This thread's thread-local captures begun and not settled. Trivially
// destructible: a key destructor's late CUDA call may still read it.
int& own_thread_local_captures() {
  thread_local int captures = 0;
  return captures;
}

template <typename List>
auto find_beginner(List& list, StreamId thread) {
  return std::find_if(list.begin(), list.end(), [&](const auto& b) { return b.thread == thread; });
}
}  // namespace

void UnsafeCallRules::capture_began(cudaStreamCaptureMode mode) {
  if (mode == cudaStreamCaptureModeGlobal) global_.fetch_add(1, std::memory_order_relaxed);
  if (mode != cudaStreamCaptureModeThreadLocal) return;
  if (++own_thread_local_captures() > 1) return;  // listed already
  const StreamId me = this_thread_stream();
  std::lock_guard<std::mutex> lock(beginners_mu_);
  if (find_beginner(beginners_, me) == beginners_.end()) beginners_.push_back(Beginner{me, 0});
}

void UnsafeCallRules::capture_ended(cudaStreamCaptureMode mode, StreamId beginner) {
  if (mode == cudaStreamCaptureModeGlobal) global_.fetch_sub(1, std::memory_order_relaxed);
  if (mode != cudaStreamCaptureModeThreadLocal) return;
  if (beginner == this_thread_stream()) {
    int& count = own_thread_local_captures();
    if (count > 0 && --count == 0) forget_this_thread();
    return;
  }
  std::lock_guard<std::mutex> lock(beginners_mu_);
  auto it = find_beginner(beginners_, beginner);
  if (it == beginners_.end()) return;  // its thread has ended: nothing forbids it any more
  ++it->owed;
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
  std::lock_guard<std::mutex> lock(beginners_mu_);
  auto it = find_beginner(beginners_, this_thread_stream());
  if (it == beginners_.end() || it->owed == 0) return;
  count = std::max(0, count - it->owed);
  owed_total_.fetch_sub(it->owed, std::memory_order_relaxed);
  it->owed = 0;
  if (count == 0) beginners_.erase(it);
}

void UnsafeCallRules::thread_ending() {
  if (std::exchange(own_thread_local_captures(), 0) != 0) forget_this_thread();
}

void UnsafeCallRules::forget_this_thread() const {
  std::lock_guard<std::mutex> lock(beginners_mu_);
  auto it = find_beginner(beginners_, this_thread_stream());
  if (it == beginners_.end()) return;
  owed_total_.fetch_sub(it->owed, std::memory_order_relaxed);
  beginners_.erase(it);
}

std::size_t UnsafeCallRules::beginners() const {
  std::lock_guard<std::mutex> lock(beginners_mu_);
  return beginners_.size();
}

}  // namespace gpupool::shim
