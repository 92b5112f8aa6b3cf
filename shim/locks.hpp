// The shim's locks. Its critical sections are short (a pool operation is
// ~100 ns), so a waiter spins a little before it sleeps: a futex sleep and
// wake-up costs more than the whole section it waits for.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

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
// pool's lock is held across cudaMalloc of a new segment, and across the
// event records of a device barrier, about 1.25 us each on an H200). A waiter
// spins reading the lock word for up to kSpinNs, trying to take it only when
// it reads free, then sleeps on a futex. (A loop of try_lock takes the lock's
// cache line from the holder at every try, slowing the section it waits for.)
// Between reads it backs off, twice as long each time up to kMaxPause pauses:
// every read also pulls the line away from the holder, whose next sections
// then miss on it and on the pool's data. Drepper's "Futexes Are Tricky",
// mutex 3.
class AdaptiveMutex {
 public:
  void lock() {
    if (try_lock()) return;
    const std::int64_t deadline = now_ns() + kSpinNs;
    for (int spins = 1, pause = 1;; ++spins) {
      for (int i = 0; i < pause; ++i) cpu_relax();
      if (pause < kMaxPause) pause *= 2;
      if (state_.load(std::memory_order_relaxed) == kUnlocked && try_lock()) return;
      if ((pause >= 16 || spins % 16 == 0) && now_ns() > deadline) break;
    }
    // kContended: whoever unlocks must wake a sleeper.
    while (state_.exchange(kContended, std::memory_order_acquire) != kUnlocked) {
      syscall(SYS_futex, word(), FUTEX_WAIT_PRIVATE, kContended, nullptr, nullptr, 0);
    }
  }
  bool try_lock() {
    int expected = kUnlocked;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (state_.exchange(kUnlocked, std::memory_order_release) == kContended) {
      syscall(SYS_futex, word(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

 private:
  enum : int { kUnlocked = 0, kLocked = 1, kContended = 2 };
  // Plain cudaMalloc/cudaFree pairs from 2 and 4 threads on the simulated
  // runtime, here (2 cores, a pause takes 25 ns): spinning 10 us instead of
  // 2.5 us took 13-15% off their time, 37 us added 7-10% (reading the word
  // after every pause). Backing off to at most 128 pauses took 64-68% off
  // the medians of one round (2 threads: 1272 ns a pair to 454; 4: 2813 to
  // 909); 32 took 59-64%, 512 about as much as 128. With it, 2.5 us of
  // spinning was worse again (4 threads: 1133-1267 ns), 40 us better
  // (696-732 ns) for four times the spinning; one thread's pairs, and the
  // thread caches' stream-ordered ones, did not change.
  static constexpr std::int64_t kSpinNs = 10'000;
  static constexpr int kMaxPause = 128;
  static std::int64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
  int* word() { return reinterpret_cast<int*>(&state_); }
  static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
  std::atomic<int> state_{kUnlocked};
};

}  // namespace gpupool::shim
