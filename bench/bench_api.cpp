// gpupool-bench-api: cudaMalloc/cudaFree pairs through the CUDA runtime API, as
// a program sees them (run it with and without LD_PRELOAD=libgpupool.so).
//   gpupool-bench-api [plain|async] [threads] [pairs per thread] [sizes per thread] [idle streams]
//   gpupool-bench-api churn [threads] [pause]
// plain: cudaMalloc + cudaFree. async: cudaMallocAsync + cudaFreeAsync on the
// thread's own stream. Sizes cycle through the real traces' sizes. Idle
// streams: non-blocking streams made first and never used, as PyTorch makes
// 32 per priority level once a program asks for one side stream. Prints
// nanoseconds per pair and the pairs per second of all threads together,
// both over the timed loops only: every thread warms up (the pool takes its
// memory from the device then), and all start the loop together. With one
// thread, a second loop then times each pair on its own (up to 100,000), for
// the median pair and the tail, which the first loop's mean folds together:
// a plain pair that records a device barrier costs many times one that does
// not. Those figures include the two clock reads around each pair, whose own
// median cost is printed beside them. pairs_made counts every pair the run
// made (warm-up, loop and single pairs), for rates of whole-run counters.
// churn: threads one after another, each making one 1 MiB cudaMallocAsync +
// cudaFreeAsync pair on its per-thread default stream and ending (a server
// that starts a thread per request), with `pause` microseconds between one
// thread's end and the next one's start (0); prints microseconds per thread,
// pauses included.
//   gpupool-bench-api tasks [tasks] [pause] [busy]
// tasks: one thread makes a non-blocking stream for each task, then a 1 MiB
// cudaMallocAsync, a cudaMemsetAsync and a cudaFreeAsync on it, and destroys
// the stream (a program that makes a stream per task), with `pause`
// microseconds between tasks (0); prints microseconds per task. `busy`: a
// long-lived non-blocking stream gets that many 4 KiB cudaMemsetAsync calls
// before each task (a stream the program keeps fed; 0, none).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "bench/trace_sizes.hpp"

namespace {
using Clock = std::chrono::steady_clock;

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, clock = 0;
};

// Times `count` calls of pair() one by one. `clock`: the median of as many
// empty intervals, the cost of the two reads included in each pair's figure.
template <typename Pair>
Percentiles time_single_pairs(long count, Pair&& pair) {
  std::vector<double> pairs(static_cast<std::size_t>(count));
  std::vector<double> empty(pairs.size());
  for (double& e : empty) {
    const auto t0 = Clock::now();
    e = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  for (double& p : pairs) {
    const auto t0 = Clock::now();
    pair();
    p = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(pairs.begin(), pairs.end());
  std::sort(empty.begin(), empty.end());
  auto at = [](const std::vector<double>& v, double q) {
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  };
  return Percentiles{at(pairs, 0.5), at(pairs, 0.9), at(pairs, 0.99), at(empty, 0.5)};
}

int churn(int threads, int pause_us) {
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    std::thread([] {
      void* p = nullptr;
      if (cudaMallocAsync(&p, 1 << 20, cudaStreamPerThread) != cudaSuccess ||
          cudaFreeAsync(p, cudaStreamPerThread) != cudaSuccess) {
        std::fprintf(stderr, "gpupool-bench-api: churn: a pair failed\n");
        std::exit(1);
      }
      cudaStreamSynchronize(cudaStreamPerThread);
    }).join();
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"mode\": \"churn\", \"threads\": %d, \"us_per_thread\": %.1f}\n", threads, us / threads);
  return 0;
}
int tasks(int count, int pause_us, int busy_ops) {
  cudaStream_t busy = nullptr;
  void* busy_bytes = nullptr;
  if (busy_ops > 0 && (cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking) != cudaSuccess ||
                       cudaMallocAsync(&busy_bytes, 4096, busy) != cudaSuccess)) {
    std::fprintf(stderr, "gpupool-bench-api: tasks: the busy stream could not be made\n");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < count; ++t) {
    for (int i = 0; i < busy_ops; ++i) cudaMemsetAsync(busy_bytes, 0, 4096, busy);
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    cudaStream_t s = nullptr;
    void* p = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMallocAsync(&p, 1 << 20, s) != cudaSuccess || cudaMemsetAsync(p, 0, 1 << 20, s) != cudaSuccess ||
        cudaFreeAsync(p, s) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess) {
      std::fprintf(stderr, "gpupool-bench-api: tasks: a call failed\n");
      return 1;
    }
  }
  cudaDeviceSynchronize();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"mode\": \"tasks\", \"tasks\": %d, \"us_per_task\": %.1f}\n", count, us / count);
  if (busy != nullptr) {  // (after the clock: not part of the tasks)
    cudaFreeAsync(busy_bytes, busy);
    cudaStreamDestroy(busy);
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "churn") == 0) {
    return churn(argc > 2 ? std::atoi(argv[2]) : 2000, argc > 3 ? std::atoi(argv[3]) : 0);
  }
  if (argc > 1 && std::strcmp(argv[1], "tasks") == 0) {
    return tasks(argc > 2 ? std::atoi(argv[2]) : 300, argc > 3 ? std::atoi(argv[3]) : 0,
                 argc > 4 ? std::atoi(argv[4]) : 0);
  }
  const bool async = argc > 1 && std::strcmp(argv[1], "async") == 0;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const long pairs = argc > 3 ? std::atol(argv[3]) : 200000;
  const std::size_t working_set = argc > 4 ? static_cast<std::size_t>(std::atol(argv[4])) : 64;
  std::vector<cudaStream_t> idle_streams(argc > 5 ? static_cast<std::size_t>(std::atol(argv[5])) : 0);
  for (cudaStream_t& s : idle_streams) {
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      std::fprintf(stderr, "gpupool-bench-api: cudaStreamCreateWithFlags failed\n");
      return 1;
    }
  }
  std::vector<std::size_t> sizes = gpupool::bench::trace_sizes();
  std::mt19937 rng(1);
  std::shuffle(sizes.begin(), sizes.end(), rng);
  // Distinct sizes up to 64 MiB (the traces' activations and gradients, not
  // their few multi-gigabyte buffers), cycled: a working set the pool serves
  // from its cache without running the device out of memory.
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [](std::size_t s) { return s > (64u << 20); }), sizes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::shuffle(sizes.begin(), sizes.end(), rng);
  if (sizes.size() > working_set * static_cast<std::size_t>(threads)) {
    sizes.resize(working_set * static_cast<std::size_t>(threads));
  }

  std::vector<double> ns(static_cast<std::size_t>(threads));
  Clock::time_point start;
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads));
  Percentiles single;  // one thread only
  std::atomic<long> pairs_made{0};
  std::barrier warmed(threads, [&]() noexcept { start = Clock::now(); });
  auto work = [&](int t) {
    cudaStream_t s = nullptr;
    if (async) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    auto pair = [&](std::size_t size) {
      void* p = nullptr;
      const cudaError_t a = async ? cudaMallocAsync(&p, size, s) : cudaMalloc(&p, size);
      const cudaError_t f = async ? cudaFreeAsync(p, s) : cudaFree(p);
      if (a != cudaSuccess || f != cudaSuccess) {
        std::fprintf(stderr, "gpupool-bench-api: %s\n", cudaGetErrorName(a != cudaSuccess ? a : f));
        std::exit(1);
      }
    };
    // Each thread cycles through its own `working_set` sizes.
    const std::size_t first = static_cast<std::size_t>(t) * working_set % sizes.size();
    std::vector<std::size_t> mine;
    for (std::size_t k = 0; k < std::min(working_set, sizes.size()); ++k) mine.push_back(sizes[(first + k) % sizes.size()]);
    for (std::size_t size : mine) pair(size);  // warm the cache
    pairs_made += static_cast<long>(mine.size()) + pairs;
    warmed.arrive_and_wait();
    std::size_t i = 0;
    for (long n = 0; n < pairs; ++n) {
      pair(mine[i]);
      if (++i == mine.size()) i = 0;
    }
    ends[static_cast<std::size_t>(t)] = Clock::now();
    ns[static_cast<std::size_t>(t)] =
        std::chrono::duration<double, std::nano>(ends[static_cast<std::size_t>(t)] - start).count() /
        static_cast<double>(pairs);
    if (threads == 1 && pairs > 0) {
      pairs_made += std::min(pairs, 100000L);
      single = time_single_pairs(std::min(pairs, 100000L), [&] {
        pair(mine[i]);
        if (++i == mine.size()) i = 0;
      });
    }
    if (async) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (std::thread& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start).count();
  // The idle streams are left to the process's end, as PyTorch leaves its stream pool's.
  double mean = 0;
  for (double v : ns) mean += v / threads;
  // traces: how many trace files the sizes came from (0: the fixed mix).
  std::printf(
      "{\"mode\": \"%s\", \"threads\": %d, \"idle_streams\": %zu, \"ns_per_pair\": %.1f, "
      "\"pairs_per_second\": %.0f, \"traces\": %zu, \"single_p50_ns\": %.1f, \"single_p90_ns\": %.1f, "
      "\"single_p99_ns\": %.1f, \"clock_ns\": %.1f, \"pairs_made\": %ld}\n",
      async ? "async" : "plain", threads, idle_streams.size(), mean, static_cast<double>(pairs) * threads / seconds,
      gpupool::bench::trace_paths().size(), single.p50, single.p90, single.p99, single.clock, pairs_made.load());
  return 0;
}
