// RMM-style multithreaded use: blocks allocated on one thread and freed on
// another, on the same stream and on different streams, plain and
// stream-ordered, while other threads allocate and free on their own. Every
// block carries a pattern checked by the thread that frees it.
//   threads [threads] [blocks per thread]
//   threads come-and-go [threads]
//     threads two at a time, each making a pair on its per-thread default
//     stream and ending; every tenth leaves a block live for the main thread
//     to check and free after it has ended, and every third first makes a
//     pair on a stream of the main thread's (its cache, made then, holds its
//     per-thread stream's block when it ends); every seventh keeps a block in
//     a thread_local made before its first CUDA call, which frees it on the
//     per-thread stream as the thread ends, after gpupool's own thread-exit
//     work would have run had it been a thread_local too. Prints
//     {"threads": N, "left": K}.
//   threads first-use-at-exit [threads]
//     threads one after another whose first CUDA calls (a stream-ordered
//     pair on the per-thread stream, its bytes checked) come from a pthread
//     key's destructor the program made before gpupool's: the thread's cache
//     is made then, after the thread_local destructors that hand caches back
//     have run. Prints {"threads": N, "corrupted": C}.
//   threads used-after-end [threads]
//     the same pair, from the destructor of a pthread key the program made
//     after its first CUDA call, so after gpupool's: each thread's
//     per-thread stream, ended by gpupool's key, is used again and ends
//     again. Prints {"threads": N, "corrupted": C}.
//   threads busy-at-fork [threads] [children]
//     the same busy threads, while the main thread forks children one after
//     another, as a data loader forks its workers: each child checks a
//     block the parent filled before the fork (host memory here) and exits
//     without CUDA; each fork comes after the threads' next pair. Prints
//     {"threads": N, "children": C, "failed": F}.
//   threads main-exits
//     the main thread makes a stream-ordered pair on its per-thread stream
//     (thread caches on) and ends with pthread_exit; a thread it started
//     waits for that end, makes its own pair and ends the process with exit.
//     Prints {"main ended": 1}.
//   threads busy-at-exit [threads] [milliseconds]
//     detached threads allocate, fill, check and free, plain and
//     stream-ordered, without end, and others come and go doing the same,
//     while the main thread returns after the given time: the process exits
//     under their calls (gpupool's exit handler, its report, threads ending
//     after it). A block found overwritten ends the process with status 3; a
//     call the exit makes fail stops that thread. Prints how many rounds of
//     pairs the long-lived threads had done when main returned.
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common.hpp"

namespace {

struct Handoff {
  void* ptr;
  size_t size;
  unsigned char tag;
  cudaStream_t stream;
  bool async;
};

std::mutex mu;
std::condition_variable cv;
std::deque<Handoff> queue;
bool producers_done = false;
std::atomic<int> corrupted{0};

// A block a thread keeps to its end, freed on its per-thread stream then.
struct KeptToTheEnd {
  void* ptr = nullptr;
  ~KeptToTheEnd() {
    if (ptr != nullptr && cudaFreeAsync(ptr, cudaStreamPerThread) != cudaSuccess) ++corrupted;
  }
};
thread_local KeptToTheEnd t_kept;

int come_and_go(int threads) {
  constexpr size_t kBytes = 1 << 20;
  // The main thread's per-thread stream, used before and after them all.
  void* first = nullptr;
  CHECK_CUDA(cudaMallocAsync(&first, kBytes, cudaStreamPerThread));
  std::vector<Handoff> left;
  cudaStream_t shared = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&shared, cudaStreamNonBlocking));
  for (int t = 0; t < threads; t += 2) {
    std::thread pair[2];
    for (int k = 0; k < 2; ++k) {
      pair[k] = std::thread([&, n = t + k] {
        const auto tag = static_cast<unsigned char>(1 + n % 250);
        if (n % 7 == 0) t_kept.ptr = nullptr;  // made now, before any CUDA call: destroyed after those made later
        void* p = nullptr;
        if (n % 3 == 0) {
          CHECK_CUDA(cudaMallocAsync(&p, 4096, shared));
          CHECK_CUDA(cudaFreeAsync(p, shared));
        }
        CHECK_CUDA(cudaMallocAsync(&p, kBytes, cudaStreamPerThread));
        CHECK_CUDA(cudaMemsetAsync(p, tag, kBytes, cudaStreamPerThread));
        if (n % 7 == 0) CHECK_CUDA(cudaMallocAsync(&t_kept.ptr, 4096, cudaStreamPerThread));
        if (n % 10 == 0) {
          std::lock_guard<std::mutex> lock(mu);
          left.push_back(Handoff{p, kBytes, tag, cudaStreamPerThread, true});
          return;  // ends with its work maybe still queued
        }
        CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
        if (!testprog::holds_sampled(p, kBytes, tag)) ++corrupted;
        CHECK_CUDA(cudaFreeAsync(p, cudaStreamPerThread));
      });
    }
    for (std::thread& th : pair) th.join();
  }
  for (const Handoff& h : left) {
    if (!testprog::holds_sampled(h.ptr, h.size, h.tag)) ++corrupted;
    CHECK_CUDA(cudaFreeAsync(h.ptr, cudaStreamPerThread));
  }
  CHECK_CUDA(cudaFreeAsync(first, cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(shared));
  CHECK_CUDA(cudaStreamDestroy(shared));
  std::printf("{\"threads\": %d, \"left\": %zu, \"corrupted\": %d}\n", threads, left.size(), corrupted.load());
  return corrupted.load() == 0 ? 0 : 1;
}

// A 1 MiB stream-ordered pair on `stream`, its bytes checked: false if a call
// failed or a byte was wrong.
bool stream_pair_holds(cudaStream_t stream, unsigned char tag) {
  constexpr size_t kBytes = 1 << 20;
  void* p = nullptr;
  return cudaMallocAsync(&p, kBytes, stream) == cudaSuccess &&
         cudaMemsetAsync(p, tag, kBytes, stream) == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess &&
         testprog::holds_sampled(p, kBytes, tag) && cudaFreeAsync(p, stream) == cudaSuccess;
}

// A pair on the per-thread stream, from a key's destructor as the thread ends.
void pair_at_exit(void*) {
  if (!stream_pair_holds(cudaStreamPerThread, 0x5a)) ++corrupted;
}

int first_use_at_exit(int threads) {
  pthread_key_t key;  // made before any CUDA call: its destructor runs before gpupool's in a round
  if (pthread_key_create(&key, pair_at_exit) != 0) return 1;
  // Two threads' stream-ordered calls: the per-thread caches are on.
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 4096, cudaStreamPerThread));
  std::thread([] {
    void* q = nullptr;
    CHECK_CUDA(cudaMallocAsync(&q, 4096, cudaStreamPerThread));
    CHECK_CUDA(cudaFreeAsync(q, cudaStreamPerThread));
  }).join();
  for (int t = 0; t < threads; ++t) {
    std::thread([key] { pthread_setspecific(key, &key); }).join();
  }
  CHECK_CUDA(cudaFreeAsync(p, cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  std::printf("{\"threads\": %d, \"corrupted\": %d}\n", threads, corrupted.load());
  return corrupted.load() == 0 ? 0 : 1;
}

int used_after_end(int threads) {
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 4096, cudaStreamPerThread));  // gpupool's key is made now
  pthread_key_t key;  // so its destructor runs after gpupool's in a round
  if (pthread_key_create(&key, pair_at_exit) != 0) return 1;
  for (int t = 0; t < threads; ++t) {
    std::thread([key] {
      void* q = nullptr;
      CHECK_CUDA(cudaMallocAsync(&q, 4096, cudaStreamPerThread));
      CHECK_CUDA(cudaFreeAsync(q, cudaStreamPerThread));
      pthread_setspecific(key, &key);
    }).join();
  }
  CHECK_CUDA(cudaFreeAsync(p, cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  std::printf("{\"threads\": %d, \"corrupted\": %d}\n", threads, corrupted.load());
  return corrupted.load() == 0 ? 0 : 1;
}

// One block of each kind, filled, checked and freed: false once a call fails.
bool pairs_checked(unsigned char tag) {
  constexpr size_t kBytes = 256 << 10;
  void* p = nullptr;
  void* q = nullptr;
  if (cudaMalloc(&p, kBytes) != cudaSuccess) return false;
  if (cudaMallocAsync(&q, kBytes, cudaStreamPerThread) != cudaSuccess) {
    cudaFree(p);
    return false;
  }
  const bool ok = cudaMemset(p, tag, kBytes) == cudaSuccess &&
                  cudaMemsetAsync(q, tag ^ 0xff, kBytes, cudaStreamPerThread) == cudaSuccess &&
                  cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess;
  if (ok && (!testprog::holds_sampled(p, kBytes, tag) || !testprog::holds_sampled(q, kBytes, tag ^ 0xff))) {
    std::fprintf(stderr, "threads: a block was overwritten\n");
    _exit(3);
  }
  const bool freed = cudaFreeAsync(q, cudaStreamPerThread) == cudaSuccess && cudaFree(p) == cudaSuccess;
  return ok && freed;
}

int busy_at_fork(int threads, int children) {
  // CUDA (and gpupool) in use before the first fork, as in a training
  // process that starts its loader's workers. (A fork while gpupool loads
  // would hang the child under ASan, whose globals lock the fork does not
  // cover: test-lifecycle fork-while-loading runs that case uninstrumented.)
  if (!pairs_checked(0x11)) return 1;
  std::atomic<bool> stop{false};
  std::atomic<int> pairs{0};
  std::vector<std::thread> busy;
  for (int t = 0; t < threads; ++t) {
    busy.emplace_back([t, &stop, &pairs] {
      for (unsigned i = 0; !stop.load() && pairs_checked(static_cast<unsigned char>(t * 31 + i)); ++i) {
        pairs.fetch_add(1);
      }
    });
  }
  std::vector<unsigned char> page(4096, 0x3c);
  int failed = 0;
  for (int c = 0; c < children; ++c) {
    // Each fork comes after the threads' next pair, so that they fork
    // under way, not all before the threads have started.
    const int before = pairs.load();
    for (int waited = 0; pairs.load() == before && waited < 10000; ++waited) usleep(100);
    const pid_t child = fork();
    if (child == 0) {
      // Exits through the exit handlers, gpupool's among them.
      std::exit(std::all_of(page.begin(), page.end(), [](unsigned char b) { return b == 0x3c; }) ? 0 : 1);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop.store(true);
  for (std::thread& t : busy) t.join();
  std::printf("{\"threads\": %d, \"children\": %d, \"failed\": %d}\n", threads, children, failed);
  return failed == 0 ? 0 : 1;
}

int busy_at_exit(int threads, int milliseconds) {
  static std::atomic<long> rounds_done{0};  // before the exit: gpupool was used, and reports
  for (int t = 0; t < threads; ++t) {
    std::thread([t] {
      for (unsigned i = 0; pairs_checked(static_cast<unsigned char>(t * 31 + i)); ++i) {
        rounds_done.fetch_add(1, std::memory_order_relaxed);
      }
    }).detach();
  }
  std::thread([] {  // threads that come and go, to the end
    for (unsigned i = 0;; ++i) std::thread([i] { pairs_checked(static_cast<unsigned char>(i)); }).join();
  }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  std::printf("{\"threads\": %d, \"rounds_done\": %ld}\n", threads, rounds_done.load());
  std::fflush(stdout);
  return 0;
}

// The main thread's pair on its per-thread stream, then its pthread_exit; a
// thread it started waits for that end, makes its own pair and ends the process.
pthread_t g_main_thread;
void* outlive_main(void*) {
  pthread_join(g_main_thread, nullptr);
  EXPECT(stream_pair_holds(cudaStreamPerThread, 0x5e));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  std::printf("{\"main ended\": 1}\n");
  std::fflush(stdout);
  std::exit(0);
}

int main_exits() {
  testprog::turn_thread_caches_on();  // so that the main thread's cache keeps its block
  EXPECT(stream_pair_holds(cudaStreamPerThread, 0x4e));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  g_main_thread = pthread_self();
  pthread_t worker;
  if (pthread_create(&worker, nullptr, outlive_main, nullptr) != 0) return 1;
  pthread_exit(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "main-exits") == 0) return main_exits();
  if (argc > 1 && std::strcmp(argv[1], "used-after-end") == 0) return used_after_end(argc > 2 ? std::atoi(argv[2]) : 50);
  if (argc > 1 && std::strcmp(argv[1], "busy-at-fork") == 0) {
    return busy_at_fork(argc > 2 ? std::atoi(argv[2]) : 3, argc > 3 ? std::atoi(argv[3]) : 50);
  }
  if (argc > 1 && std::strcmp(argv[1], "busy-at-exit") == 0) {
    return busy_at_exit(argc > 2 ? std::atoi(argv[2]) : 3, argc > 3 ? std::atoi(argv[3]) : 50);
  }
  if (argc > 1 && std::strcmp(argv[1], "come-and-go") == 0) return come_and_go(argc > 2 ? std::atoi(argv[2]) : 400);
  if (argc > 1 && std::strcmp(argv[1], "first-use-at-exit") == 0) {
    return first_use_at_exit(argc > 2 ? std::atoi(argv[2]) : 50);
  }
  const int producers = argc > 1 ? std::atoi(argv[1]) : 3;
  const int per_thread = argc > 2 ? std::atoi(argv[2]) : 400;
  std::vector<cudaStream_t> streams(static_cast<size_t>(producers));
  for (cudaStream_t& s : streams) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        Handoff h{nullptr, static_cast<size_t>(512 + (i * 7919 + t * 104729) % (3 << 20)),
                  static_cast<unsigned char>(1 + (t * 31 + i) % 250), streams[static_cast<size_t>(t)], i % 2 == 0};
        if (h.async) {
          CHECK_CUDA(cudaMallocAsync(&h.ptr, h.size, h.stream));
        } else {
          CHECK_CUDA(cudaMalloc(&h.ptr, h.size));
        }
        CHECK_CUDA(cudaMemsetAsync(h.ptr, h.tag, h.size, h.stream));
        CHECK_CUDA(cudaStreamSynchronize(h.stream));
        // Some are freed here, on this thread; the rest handed to the consumers.
        if (i % 3 == 0) {
          if (!testprog::holds_sampled(h.ptr, h.size, h.tag)) ++corrupted;
          CHECK_CUDA(h.async ? cudaFreeAsync(h.ptr, h.stream) : cudaFree(h.ptr));
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(h);
        cv.notify_one();
      }
    });
  }
  std::vector<std::thread> consumers;
  for (int c = 0; c < 2; ++c) {
    consumers.emplace_back([&, c] {
      for (;;) {
        Handoff h;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [] { return !queue.empty() || producers_done; });
          if (queue.empty()) return;
          h = queue.front();
          queue.pop_front();
        }
        if (!testprog::holds_sampled(h.ptr, h.size, h.tag)) ++corrupted;
        // Consumer 0 frees on the allocating stream, consumer 1 on the legacy stream.
        CHECK_CUDA(cudaFreeAsync(h.ptr, c == 0 ? h.stream : nullptr));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    producers_done = true;
  }
  cv.notify_all();
  for (std::thread& t : consumers) t.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  for (cudaStream_t s : streams) CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("threads: %d producers x %d blocks, %d corrupted\n", producers, per_thread, corrupted.load());
  return corrupted.load() == 0 ? 0 : 1;
}
