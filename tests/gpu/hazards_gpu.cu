// The reuse hazards of tests/programs/hazard_cases.hpp with a real slow kernel
// as the old owner, on real streams, plus legacy-barrier-rule: the CUDA rule
// the device barrier rests on, checked without gpupool, and
// null-free-creates-context: cudaFree(NULL) as the first CUDA call leaves a
// current context, as programs expect of it (OptiX asks the driver for it),
// and device-fault: a kernel writes to an illegal address while the program
// holds a plain block, which it then frees; 0 when cudaFree reported the
// fault, 1 when it returned success, 3 when nothing reported it. Either way
// the process must end on its own. device-fault-release: the program frees
// 40 MiB, a kernel faults, then it asks for 48 MiB; 0 when the runtime
// reported the fault at the sync and refused the request. Under gpupool with
// a memory limit and a garbage collection threshold below 40 MiB, the pool
// gives the idle block back first: the report says whether CUDA took it.
// Exit codes as there.
//   hazards_gpu <case> [delay_ms]
// Built with nvcc -cudart shared so that LD_PRELOAD reaches its calls.
#include <cuda_runtime.h>
#include <dlfcn.h>

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

// 0 when cudaFree(NULL) left a current context; 1 when none; 2 when the
// driver cannot be asked.
int null_free_creates_context() {
  HAZARD_CHECK(cudaFree(nullptr));
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  auto get_current = driver == nullptr ? nullptr
                                       : reinterpret_cast<int (*)(void**)>(dlsym(driver, "cuCtxGetCurrent"));
  void* context = nullptr;
  if (get_current == nullptr || get_current(&context) != 0) return 2;
  return context != nullptr ? 0 : 1;
}

__global__ void write_to(int* p) { *p = 1; }

int device_fault() {
  void* p = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  write_to<<<1, 1>>>(reinterpret_cast<int*>(16));  // no memory there: a sticky cudaErrorIllegalAddress
  const cudaError_t freed = cudaFree(p);
  const cudaError_t synchronized = cudaDeviceSynchronize();
  std::printf("cudaFree: %s, cudaDeviceSynchronize: %s\n", cudaGetErrorName(freed), cudaGetErrorName(synchronized));
  if (synchronized == cudaSuccess) return 3;
  return freed != cudaSuccess ? 0 : 1;
}

int device_fault_release() {
  void* idle = nullptr;
  HAZARD_CHECK(cudaMalloc(&idle, 40 << 20));
  HAZARD_CHECK(cudaFree(idle));
  write_to<<<1, 1>>>(reinterpret_cast<int*>(16));
  const cudaError_t synchronized = cudaDeviceSynchronize();
  void* more = nullptr;
  const cudaError_t grown = cudaMalloc(&more, 48 << 20);
  std::printf("cudaDeviceSynchronize: %s, cudaMalloc: %s\n", cudaGetErrorName(synchronized), cudaGetErrorName(grown));
  return synchronized != cudaSuccess && grown != cudaSuccess ? 0 : 1;
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
  const int result = name == "legacy-barrier-rule"         ? hazards::legacy_barrier_rule()
                     : name == "null-free-creates-context" ? hazards::null_free_creates_context()
                     : name == "device-fault"              ? hazards::device_fault()
                     : name == "device-fault-release"      ? hazards::device_fault_release()
                                                           : hazards::run_case(name);
  if (result < 0) {
    std::fprintf(stderr, "hazards_gpu: unknown case %s\n", argv[1]);
    return 64;
  }
  return result;
}
