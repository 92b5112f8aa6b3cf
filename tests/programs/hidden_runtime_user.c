/* A library whose CUDA runtime is a renamed copy (libsimrt-1a2b.so, or
   libcudart-1a2b3c4d.so as a wheel's repair tool renames the one it
   bundles; one library per name) that only this library's
   own scope reaches: test-hidden-runtime loads it RTLD_LOCAL, as Python loads
   an extension module, and links no runtime itself. Its CUDA calls bind to
   gpupool's entry points (the preload comes first in every scope), which
   must find this runtime to serve them or pass them on. */
#include <cuda_runtime_api.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* Runs each step and returns 0, or the number of the first that failed
   (*error: what it returned). */
EXPORT int hidden_runtime_exercise(cudaError_t* error) {
  enum { kSize = 1 << 20 };
  static unsigned char host[kSize];
  void* block = NULL;
  cudaStream_t stream = NULL;
  size_t free_bytes = 0, total_bytes = 0;
  int device = -1;
#define STEP(n, call)                             \
  do {                                            \
    const cudaError_t err_ = (call);              \
    if (err_ != cudaSuccess) {                    \
      *error = err_;                              \
      return (n);                                 \
    }                                             \
  } while (0)
  STEP(1, cudaGetDevice(&device));
  for (int i = 0; i < 8; ++i) {
    STEP(2, cudaMalloc(&block, kSize));
    STEP(3, cudaMemset(block, 0x40 + i, kSize));
    STEP(4, cudaMemcpy(host, block, kSize, cudaMemcpyDeviceToHost));
    for (int j = 0; j < kSize; j += 4096) {
      if (host[j] != 0x40 + i) {
        *error = cudaErrorUnknown;
        return 5;
      }
    }
    STEP(6, cudaFree(block));
  }
  STEP(7, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 8; ++i) {
    STEP(8, cudaMallocAsync(&block, kSize, stream));
    STEP(9, cudaFreeAsync(block, stream));
  }
  STEP(10, cudaStreamSynchronize(stream));
  STEP(11, cudaStreamDestroy(stream));
  STEP(12, cudaMemGetInfo(&free_bytes, &total_bytes));
  STEP(13, cudaDeviceSynchronize());
  STEP(14, cudaGetLastError());
#undef STEP
  *error = cudaSuccess;
  return 0;
}
