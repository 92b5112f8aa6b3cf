// Which threads a capture under way forbids unsafe calls (shim/
// unsafe_call_rules.hpp): CUDA's three capture modes, a thread-local capture
// ended on another thread, and a beginner thread that ends.
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "shim/thread_state.hpp"
#include "shim/unsafe_call_rules.hpp"

namespace gpupool::shim {
namespace {

// Runs `work` on a new thread and returns what it returned.
template <typename Work>
auto on_another_thread(Work work) {
  return std::async(std::launch::async, work).get();
}

}  // namespace

TEST_CASE("a global-mode capture forbids every thread and a relaxed one none") {
  UnsafeCallRules rules;
  rules.capture_began(cudaStreamCaptureModeRelaxed);
  CHECK_FALSE(rules.forbid_this_thread());
  rules.capture_began(cudaStreamCaptureModeGlobal);
  CHECK(rules.forbid_this_thread());
  CHECK(on_another_thread([&] { return rules.forbid_this_thread(); }));
  // Ended on another thread: no thread is forbidden any more.
  on_another_thread([&] {
    rules.capture_ended(cudaStreamCaptureModeGlobal, this_thread_stream());
    return 0;
  });
  CHECK_FALSE(rules.forbid_this_thread());
  rules.capture_ended(cudaStreamCaptureModeRelaxed, this_thread_stream());
  CHECK(rules.beginners() == 0);
}

TEST_CASE("a thread-local capture forbids only the thread that began it, until it ends") {
  UnsafeCallRules rules;
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  CHECK(rules.forbid_this_thread());
  CHECK_FALSE(on_another_thread([&] { return rules.forbid_this_thread(); }));
  CHECK(rules.beginners() == 1);
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, this_thread_stream());
  CHECK(rules.forbid_this_thread());  // one of its two goes on
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, this_thread_stream());
  CHECK_FALSE(rules.forbid_this_thread());
  CHECK(rules.beginners() == 0);
}

TEST_CASE("a thread-local capture ended on another thread is settled at its beginner's next check") {
  UnsafeCallRules rules;
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  const StreamId me = this_thread_stream();
  // Both ended elsewhere (their streams destroyed, their device reset).
  on_another_thread([&] {
    rules.capture_ended(cudaStreamCaptureModeThreadLocal, me);
    rules.capture_ended(cudaStreamCaptureModeThreadLocal, me);
    return 0;
  });
  CHECK(rules.beginners() == 1);  // owed, not yet settled
  CHECK_FALSE(rules.forbid_this_thread());
  CHECK(rules.beginners() == 0);
  // Nothing stays owed: a new capture forbids again, and its end frees.
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  CHECK(rules.forbid_this_thread());
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, me);
  CHECK_FALSE(rules.forbid_this_thread());
}

TEST_CASE("a beginner thread that ends is unlisted, and later ends of its captures are dropped") {
  UnsafeCallRules rules;
  std::promise<StreamId> began;
  std::promise<void> one_ended;
  std::thread beginner([&] {
    rules.capture_began(cudaStreamCaptureModeThreadLocal);
    rules.capture_began(cudaStreamCaptureModeThreadLocal);
    began.set_value(this_thread_stream());
    one_ended.get_future().wait();
    rules.thread_ending();  // as its pthread key's destructor does, without a check before
  });
  const StreamId gone = began.get_future().get();
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, gone);  // owed to it
  CHECK(rules.beginners() == 1);
  one_ended.set_value();
  beginner.join();
  CHECK(rules.beginners() == 0);
  // Its other capture's stream destroyed after it ended: nothing to owe.
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, gone);
  CHECK(rules.beginners() == 0);
  // And no settlement is looked for on behalf of the gone thread.
  rules.capture_began(cudaStreamCaptureModeThreadLocal);
  CHECK(rules.forbid_this_thread());
  rules.capture_ended(cudaStreamCaptureModeThreadLocal, this_thread_stream());
  CHECK_FALSE(rules.forbid_this_thread());
  CHECK(rules.beginners() == 0);
}

}  // namespace gpupool::shim
