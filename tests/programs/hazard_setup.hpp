// What the reuse-hazard cases share (hazard_cases.hpp, hazard_handle_cases.hpp):
// CUDA calls checked, the old and new owners' bytes, the verdict on them, the
// streams and blocks a case sets up. The includer of hazard_cases.hpp defines
// kBytes and old_owner_writes (see there).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#define HAZARD_CHECK(call)                                                                          \
  do {                                                                                              \
    const cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(err_)); \
      std::exit(3);                                                                                 \
    }                                                                                               \
  } while (0)

namespace hazards {

constexpr unsigned char kOld = 0xAA;
constexpr unsigned char kNew = 0x55;
extern const size_t kBytes;
inline unsigned delay_ms = 100;  // how long the old owner's write waits
void old_owner_writes(void* p, cudaStream_t stream, size_t bytes = kBytes);

// The new owner's `bytes` at new_ptr, written on its stream, must survive.
// The old owner's work ran on the current device, or on `old_device`.
inline int verdict(void* old_ptr, void* new_ptr, cudaStream_t new_stream, size_t bytes = kBytes,
                   int old_device = -1) {
  if (new_ptr != old_ptr) {
    std::printf("not reused: the pool handed out %p, not %p\n", new_ptr, old_ptr);
    HAZARD_CHECK(cudaDeviceSynchronize());
    return 2;
  }
  HAZARD_CHECK(cudaMemsetAsync(new_ptr, kNew, bytes, new_stream));
  HAZARD_CHECK(cudaDeviceSynchronize());
  if (old_device >= 0) {
    int current = 0;
    HAZARD_CHECK(cudaGetDevice(&current));
    HAZARD_CHECK(cudaSetDevice(old_device));
    HAZARD_CHECK(cudaDeviceSynchronize());
    HAZARD_CHECK(cudaSetDevice(current));
  }
  std::vector<unsigned char> host(bytes);
  HAZARD_CHECK(cudaMemcpy(host.data(), new_ptr, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : host) {
    if (c != kNew) {
      std::printf("HAZARD: the old owner's write landed last\n");
      return 1;
    }
  }
  std::printf("ordered: the new owner's bytes are intact\n");
  return 0;
}

// With HAZARDS_PRIORITY=N set, streams are made at priority N with
// cudaStreamCreateWithPriority, as PyTorch makes every stream of its pool.
inline cudaStream_t stream(unsigned flags) {
  cudaStream_t s;
  if (const char* priority = std::getenv("HAZARDS_PRIORITY")) {
    HAZARD_CHECK(cudaStreamCreateWithPriority(&s, flags, std::atoi(priority)));
  } else {
    HAZARD_CHECK(cudaStreamCreateWithFlags(&s, flags));
  }
  return s;
}

// A block (cudaMalloc) whose segment's other block stays allocated: under
// the simulated device's hazard tests (1 MiB blocks, 2 MiB segments, a 2 MiB
// limit) its room is the only room, once freed. Not for the GPU's sizes.
inline void* only_room() {
  void* p = nullptr;
  void* rest = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  HAZARD_CHECK(cudaMalloc(&rest, kBytes));
  return p;
}

// On `s`: a block the old owner is still writing, freed at once, beside a
// second block held for good, so that under pressure the first block's bytes
// are the only free room. Returns the first.
inline void* busy_freed_block(cudaStream_t s) {
  void* p = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&p, kBytes, s));
  void* rest = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&rest, kBytes, s));
  old_owner_writes(p, s);
  HAZARD_CHECK(cudaFreeAsync(p, s));
  return p;
}

// This thread's default stream: in a per-thread build (-DCUDA_API_PER_THREAD_DEFAULT_STREAM,
// whose calls are the _ptsz entry points) stream 0 itself, otherwise cudaStreamPerThread.
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
inline const cudaStream_t kThreadStream = nullptr;
#else
inline const cudaStream_t kThreadStream = cudaStreamPerThread;
#endif

}  // namespace hazards
