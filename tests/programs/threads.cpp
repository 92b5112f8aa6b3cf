// RMM-style multithreaded use: blocks allocated on one thread and freed on
// another, on the same stream and on different streams, plain and
// stream-ordered, while other threads allocate and free on their own. Every
// block carries a pattern checked by the thread that frees it.
//   threads [threads] [blocks per thread]
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

}  // namespace

int main(int argc, char** argv) {
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
