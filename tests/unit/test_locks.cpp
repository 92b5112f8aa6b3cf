// The shim's locks (shim/locks.hpp, no CUDA in it): mutual exclusion under
// contention, and a waiter that went to sleep is woken by the unlock.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "shim/locks.hpp"

namespace gpupool::shim {
namespace {

// Threads add to a plain counter under the lock, each section long enough
// that others must spin or sleep: any lost update, or a data race that
// ThreadSanitizer sees, means the lock let two in.
template <typename Lock>
void count_under(Lock& lock, int threads, int rounds) {
  long counter = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<Lock> guard(lock);
        const long seen = counter;
        for (int spin = 0; spin < 50; ++spin) cpu_relax();
        counter = seen + 1;
      }
    });
  }
  for (std::thread& t : pool) t.join();
  CHECK(counter == static_cast<long>(threads) * rounds);
}

}  // namespace

TEST_CASE("AdaptiveMutex and SpinLock let one thread in at a time") {
  AdaptiveMutex mutex;
  count_under(mutex, 4, 20000);
  SpinLock spin;
  count_under(spin, 4, 20000);
}

TEST_CASE("AdaptiveMutex wakes a waiter that went to sleep") {
  struct Shared {
    AdaptiveMutex mutex;
    std::atomic<bool> acquired{false};
  };
  auto* shared = new Shared;  // left to a waiter that is never woken
  shared->mutex.lock();
  std::thread waiter([shared] {
    std::lock_guard<AdaptiveMutex> guard(shared->mutex);
    shared->acquired = true;
  });
  // Held far past the waiter's spinning: it sleeps on the futex.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(shared->acquired.load());
  CHECK_FALSE(shared->mutex.try_lock());
  shared->mutex.unlock();
  for (int i = 0; i < 500 && !shared->acquired.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!shared->acquired.load()) {
    waiter.detach();
    FAIL("the unlock woke no sleeping waiter in 5 s");
  }
  waiter.join();
  CHECK(shared->mutex.try_lock());
  shared->mutex.unlock();
  delete shared;
}

}  // namespace gpupool::shim
