// Helpers for the integration test programs: plain CUDA runtime API programs
// that know nothing of gpupool and fail (exit 1) on any wrong byte.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "sim/simcuda.h"

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(err_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define EXPECT(cond)                                                                      \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace testprog {

// Every byte of [p, p+n) equals `tag`; reads it back through cudaMemcpy.
inline bool holds(const void* p, size_t n, unsigned char tag) {
  std::vector<unsigned char> host(n);
  CHECK_CUDA(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    if (host[i] != tag) return false;
  }
  return true;
}

// Samples: the first, middle and last 256 bytes.
inline bool holds_sampled(const void* p, size_t n, unsigned char tag) {
  const size_t k = n < 256 ? n : 256;
  const auto* c = static_cast<const char*>(p);
  return holds(c, k, tag) && holds(c + (n - k) / 2, k, tag) && holds(c + n - k, k, tag);
}

// Stream-ordered calls from a second thread: under gpupool, from now on each
// thread keeps the blocks it frees with cudaFreeAsync in its own cache.
inline void turn_thread_caches_on() {
  std::thread([] {
    void* warm = nullptr;
    CHECK_CUDA(cudaMallocAsync(&warm, 512, cudaStreamPerThread));
    CHECK_CUDA(cudaFreeAsync(warm, cudaStreamPerThread));
    CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  }).join();
}

// A memory pool of the program's own on `device` (its pinned memory): one
// gpupool leaves to the runtime.
inline cudaMemPool_t new_device_pool(int device) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
  return pool;
}

// Raises SIGUSR1, makes an intercepted call (under gpupool, the report it
// asks for is written then, to `report`) and prints that report; 1 when
// there is none.
inline int print_requested_report(const char* report) {
  raise(SIGUSR1);
  CHECK_CUDA(cudaFree(nullptr));
  FILE* in = std::fopen(report, "r");
  if (in == nullptr) {
    std::fprintf(stderr, "no report at %s after SIGUSR1\n", report);
    return 1;
  }
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, in)) > 0;) std::fwrite(buffer, 1, n, stdout);
  std::fclose(in);
  return 0;
}

// The simulated runtime's counters, when running on it.
inline bool sim_counters(simcuda_counters* out) {
  auto get = reinterpret_cast<void (*)(simcuda_counters*)>(dlsym(RTLD_DEFAULT, "simcuda_get_counters"));
  if (get == nullptr) return false;
  get(out);
  return true;
}

}  // namespace testprog
