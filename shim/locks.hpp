// The shim's locks. Its critical sections are short (a pool operation is
// ~100 ns), so a waiter spins a little before it sleeps: a futex sleep and
// wake-up costs more than the whole section it waits for.
#pragma once

#include <sched.h>

#include <atomic>
#include <mutex>

namespace gpupool::shim {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield");
#endif
}

// For tiny sections that are almost never contended. Yields after a while:
// the holder may have been preempted (more threads than cores).
class SpinLock {
 public:
  void lock() {
    for (int spins = 0; flag_.test_and_set(std::memory_order_acquire);) {
      while (flag_.test(std::memory_order_relaxed)) {
        if (++spins < 64) {
          cpu_relax();
        } else {
          sched_yield();
        }
      }
    }
  }
  void unlock() { flag_.clear(std::memory_order_release); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

// A mutex for sections that are usually short but sometimes long (a device
// pool's lock is held across cudaMalloc of a new segment): spins for about a
// pool operation's time, then sleeps like std::mutex.
class AdaptiveMutex {
 public:
  void lock() {
    for (int spins = 0; spins < kSpins; ++spins) {
      if (mu_.try_lock()) return;
      cpu_relax();
    }
    mu_.lock();
  }
  bool try_lock() { return mu_.try_lock(); }
  void unlock() { mu_.unlock(); }

 private:
  static constexpr int kSpins = 100;
  std::mutex mu_;
};

}  // namespace gpupool::shim
