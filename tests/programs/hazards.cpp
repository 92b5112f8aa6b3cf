// Reuse hazards, one case per way a cached block can change hands. In each, a
// slow "kernel" (a host function on the simulated device, which writes device
// memory directly) fills a block with pattern A on the first stream; the
// program frees the block at once and allocates the same size again; if the
// pool hands back the same block, the new owner writes pattern B on its own
// stream. Unless the pool ordered the new owner after the old work, A lands
// last. Exit 0: the block was reused and holds B. Exit 1: it holds A (a
// hazard). Exit 2: the pool did not reuse the block, so nothing was shown.
//   hazards <case> [delay_ms]
#include <chrono>
#include <string>
#include <thread>

#include "common.hpp"

namespace {

constexpr size_t kBytes = 1 << 20;
constexpr unsigned char kOld = 0xAA;
constexpr unsigned char kNew = 0x55;
int g_delay_ms = 100;

struct SlowWrite {
  void* ptr;
  unsigned char value;
};

void slow_write(void* arg) {
  auto* w = static_cast<SlowWrite*>(arg);
  std::this_thread::sleep_for(std::chrono::milliseconds(g_delay_ms));
  std::memset(w->ptr, w->value, kBytes);
}

// Queues the old owner's slow write of pattern A on `stream`.
void old_owner_writes(void* p, cudaStream_t stream) {
  static SlowWrite w;
  w = SlowWrite{p, kOld};
  CHECK_CUDA(cudaLaunchHostFunc(stream, slow_write, &w));
}

int verdict(void* old_ptr, void* new_ptr, cudaStream_t new_stream) {
  if (new_ptr != old_ptr) {
    std::printf("not reused: the pool handed out %p, not %p\n", new_ptr, old_ptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    return 2;
  }
  CHECK_CUDA(cudaMemsetAsync(new_ptr, kNew, kBytes, new_stream));
  CHECK_CUDA(cudaDeviceSynchronize());
  const bool ok = testprog::holds(new_ptr, kBytes, kNew);
  std::printf("%s\n", ok ? "ordered: the new owner's bytes are intact" : "HAZARD: the old owner's write landed last");
  return ok ? 0 : 1;
}

cudaStream_t stream(unsigned flags) {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, flags));
  return s;
}

// cudaFree promised a device-wide synchronization: a plain cudaMalloc after a
// plain cudaFree may be used on any stream.
int cudafree_then_cudamalloc(unsigned old_flags, unsigned new_flags) {
  cudaStream_t s1 = stream(old_flags), s2 = stream(new_flags);
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, kBytes));
  old_owner_writes(p, s1);
  CHECK_CUDA(cudaFree(p));
  void* q = nullptr;
  CHECK_CUDA(cudaMalloc(&q, kBytes));
  return verdict(p, q, s2);
}

int same_stream() {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, s));
  old_owner_writes(p, s);
  CHECK_CUDA(cudaFreeAsync(p, s));
  void* q = nullptr;
  CHECK_CUDA(cudaMallocAsync(&q, kBytes, s));
  return verdict(p, q, s);
}

int cross_stream(bool wait_first) {
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, s1));
  old_owner_writes(p, s1);
  CHECK_CUDA(cudaFreeAsync(p, s1));
  if (wait_first) CHECK_CUDA(cudaStreamSynchronize(s1));
  void* q = nullptr;
  CHECK_CUDA(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

int destroyed_stream() {
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, s1));
  old_owner_writes(p, s1);
  CHECK_CUDA(cudaFreeAsync(p, s1));
  CHECK_CUDA(cudaStreamDestroy(s1));  // returns at once; the write is still queued
  void* q = nullptr;
  CHECK_CUDA(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

// This thread's default stream: in a per-thread build (-DCUDA_API_PER_THREAD_DEFAULT_STREAM,
// whose calls are the _ptsz entry points) stream 0 itself, otherwise cudaStreamPerThread.
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
const cudaStream_t kThreadStream = nullptr;
#else
const cudaStream_t kThreadStream = cudaStreamPerThread;
#endif

// Per-thread default streams on two threads: thread A frees, thread B reuses.
int per_thread_streams() {
  void* p = nullptr;
  std::thread a([&] {
    CHECK_CUDA(cudaMallocAsync(&p, kBytes, kThreadStream));
    old_owner_writes(p, kThreadStream);
    CHECK_CUDA(cudaFreeAsync(p, kThreadStream));
  });
  a.join();
  int result = 0;
  std::thread b([&] {
    void* q = nullptr;
    CHECK_CUDA(cudaMallocAsync(&q, kBytes, kThreadStream));
    result = verdict(p, q, kThreadStream);
  });
  b.join();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hazards <case> [delay_ms]\n");
    return 64;
  }
  if (argc > 2) g_delay_ms = std::atoi(argv[2]);
  const std::string c = argv[1];
  if (c == "cudafree-blocking") return cudafree_then_cudamalloc(cudaStreamDefault, cudaStreamDefault);
  if (c == "cudafree-nonblocking") return cudafree_then_cudamalloc(cudaStreamNonBlocking, cudaStreamNonBlocking);
  if (c == "same-stream") return same_stream();
  if (c == "cross-stream-completed") return cross_stream(true);
  if (c == "cross-stream-pending") return cross_stream(false);
  if (c == "destroyed-stream") return destroyed_stream();
  if (c == "per-thread") return per_thread_streams();
  std::fprintf(stderr, "hazards: unknown case %s\n", c.c_str());
  return 64;
}
