// The reuse hazards of tests/programs/hazard_cases.hpp with a real slow kernel
// as the old owner, on real streams, plus legacy-barrier-rule: the CUDA rule
// the device barrier rests on, checked without gpupool. Exit codes as there.
//   hazards_gpu <case> [delay_ms]
// Built with nvcc -cudart shared so that LD_PRELOAD reaches its calls.
#include <cuda_runtime.h>

#include "../programs/hazard_cases.hpp"

namespace hazards {

extern const size_t kBytes = 16 << 20;

namespace {
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

}  // namespace

void old_owner_writes(void* p, cudaStream_t s, size_t bytes) {
  // One block waits, then every block writes: a single block is enough.
  slow_fill<<<1, 1024, 0, s>>>(static_cast<unsigned char*>(p), bytes, kOld, delay_ms * 1000000ull);
  HAZARD_CHECK(cudaGetLastError());
}

namespace {
// Checks, without gpupool, the CUDA rule the device barrier rests on: an event
// recorded on the legacy stream waits for earlier work of blocking streams,
// and later work of blocking streams waits for it.
int legacy_barrier_rule() {
  cudaStream_t s1 = stream(cudaStreamDefault), s2 = stream(cudaStreamDefault);
  void* p = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  cudaEvent_t barrier;
  HAZARD_CHECK(cudaEventCreateWithFlags(&barrier, cudaEventDisableTiming));
  old_owner_writes(p, s1);
  HAZARD_CHECK(cudaEventRecord(barrier, cudaStreamLegacy));
  return verdict(p, p, s2);  // writes B on s2: after the barrier, so after the kernel
}

}  // namespace

}  // namespace hazards

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hazards_gpu <case> [delay_ms]\n");
    return 64;
  }
  hazards::delay_ms = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 200;
  const std::string name = argv[1];
  const int result = name == "legacy-barrier-rule" ? hazards::legacy_barrier_rule() : hazards::run_case(name);
  if (result < 0) {
    std::fprintf(stderr, "hazards_gpu: unknown case %s\n", argv[1]);
    return 64;
  }
  return result;
}
