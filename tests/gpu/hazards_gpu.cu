// The reuse hazards of tests/programs/hazards.cpp with real kernels on real
// streams: a slow kernel writes pattern A into a block on the first stream,
// the program frees the block at once and allocates the same size again; if
// the pool hands back the same block, the new owner writes pattern B on its
// own stream. Unless the pool ordered the new owner after the kernel, A lands
// last. Exit 0: reused, and B intact. 1: a hazard. 2: not reused.
//   hazards_gpu <case> [delay_ms]
// Built with nvcc -cudart shared so that LD_PRELOAD reaches its calls.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(3);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

constexpr size_t kBytes = 16 << 20;
constexpr unsigned char kOld = 0xAA;
constexpr unsigned char kNew = 0x55;
unsigned g_delay_ms = 200;

// Sleeps on the device for `ns`, then fills the buffer with `value`.
__global__ void slow_fill(unsigned char* p, size_t n, unsigned char value, unsigned long long ns) {
  if (threadIdx.x == 0) {
    unsigned long long begin = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(begin));
    do {
      __nanosleep(100000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - begin < ns);
  }
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

void old_owner_writes(void* p, cudaStream_t s) {
  // One block waits, then every block writes: a single block is enough.
  slow_fill<<<1, 1024, 0, s>>>(static_cast<unsigned char*>(p), kBytes, kOld, g_delay_ms * 1000000ull);
  CHECK(cudaGetLastError());
}

int verdict(void* old_ptr, void* new_ptr, cudaStream_t new_stream) {
  if (new_ptr != old_ptr) {
    std::printf("not reused: %p instead of %p\n", new_ptr, old_ptr);
    CHECK(cudaDeviceSynchronize());
    return 2;
  }
  CHECK(cudaMemsetAsync(new_ptr, kNew, kBytes, new_stream));
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> host(kBytes);
  CHECK(cudaMemcpy(host.data(), new_ptr, kBytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : host) {
    if (c != kNew) {
      std::printf("HAZARD: the old owner's kernel wrote last\n");
      return 1;
    }
  }
  std::printf("ordered: the new owner's bytes are intact\n");
  return 0;
}

cudaStream_t stream(unsigned flags) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, flags));
  return s;
}

int cudafree_then_cudamalloc(unsigned old_flags, unsigned new_flags) {
  cudaStream_t s1 = stream(old_flags), s2 = stream(new_flags);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kBytes));
  old_owner_writes(p, s1);
  CHECK(cudaFree(p));
  void* q = nullptr;
  CHECK(cudaMalloc(&q, kBytes));
  return verdict(p, q, s2);
}

int same_stream() {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, kBytes, s));
  old_owner_writes(p, s);
  CHECK(cudaFreeAsync(p, s));
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, kBytes, s));
  return verdict(p, q, s);
}

int cross_stream(bool wait_first) {
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, kBytes, s1));
  old_owner_writes(p, s1);
  CHECK(cudaFreeAsync(p, s1));
  if (wait_first) CHECK(cudaStreamSynchronize(s1));
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

int destroyed_stream() {
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, kBytes, s1));
  old_owner_writes(p, s1);
  CHECK(cudaFreeAsync(p, s1));
  CHECK(cudaStreamDestroy(s1));
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

int per_thread_streams() {
  void* p = nullptr;
  std::thread a([&] {
    CHECK(cudaMallocAsync(&p, kBytes, cudaStreamPerThread));
    old_owner_writes(p, cudaStreamPerThread);
    CHECK(cudaFreeAsync(p, cudaStreamPerThread));
  });
  a.join();
  int result = 0;
  std::thread b([&] {
    void* q = nullptr;
    CHECK(cudaMallocAsync(&q, kBytes, cudaStreamPerThread));
    result = verdict(p, q, cudaStreamPerThread);
  });
  b.join();
  return result;
}

// Checks, without gpupool, the CUDA rule the device barrier rests on: an event
// recorded on the legacy stream waits for earlier work of blocking streams,
// and later work of blocking streams waits for it.
int legacy_barrier_rule() {
  cudaStream_t s1 = stream(cudaStreamDefault), s2 = stream(cudaStreamDefault);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kBytes));
  cudaEvent_t barrier;
  CHECK(cudaEventCreateWithFlags(&barrier, cudaEventDisableTiming));
  old_owner_writes(p, s1);
  CHECK(cudaEventRecord(barrier, cudaStreamLegacy));
  return verdict(p, p, s2);  // writes B on s2: after the barrier, so after the kernel
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hazards_gpu <case> [delay_ms]\n");
    return 64;
  }
  if (argc > 2) g_delay_ms = static_cast<unsigned>(std::atoi(argv[2]));
  const std::string c = argv[1];
  if (c == "legacy-barrier-rule") return legacy_barrier_rule();
  if (c == "cudafree-blocking") return cudafree_then_cudamalloc(cudaStreamDefault, cudaStreamDefault);
  if (c == "cudafree-nonblocking") return cudafree_then_cudamalloc(cudaStreamNonBlocking, cudaStreamNonBlocking);
  if (c == "same-stream") return same_stream();
  if (c == "cross-stream-completed") return cross_stream(true);
  if (c == "cross-stream-pending") return cross_stream(false);
  if (c == "destroyed-stream") return destroyed_stream();
  if (c == "per-thread") return per_thread_streams();
  std::fprintf(stderr, "hazards_gpu: unknown case %s\n", c.c_str());
  return 64;
}
