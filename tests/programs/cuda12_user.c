/* A library built against the CUDA 12 runtime (second_runtime.c stands in for
   it), which test-two-runtimes loads RTLD_LOCAL as Python loads an extension
   module. Built without sibling calls: each CUDA call returns here, so that
   the call is this library's (as it is in a library that checks the result). */
#include <cuda_runtime_api.h>

#define EXPORT __attribute__((visibility("default")))

static const char kernel; /* the runtime refuses the launch before it looks */

EXPORT cudaError_t cuda12_launch(void) {
  const dim3 one = {1, 1, 1};
  return cudaLaunchKernel(&kernel, one, one, NULL, 0, NULL);
}

EXPORT cudaError_t cuda12_get_last_error(void) { return cudaGetLastError(); }

EXPORT cudaError_t cuda12_peek_at_last_error(void) { return cudaPeekAtLastError(); }

/* Allocates size bytes and frees them again (on success). */
EXPORT cudaError_t cuda12_malloc_free(size_t size) {
  void* ptr = NULL;
  const cudaError_t err = cudaMalloc(&ptr, size);
  if (err != cudaSuccess) return err;
  return cudaFree(ptr);
}

EXPORT cudaError_t cuda12_enable_peer_access(int peer) { return cudaDeviceEnablePeerAccess(peer, 0); }

/* The driver's function `symbol` as this library's runtime fetches it (see
   second_runtime.c), into fn. */
EXPORT cudaError_t cuda12_fetch_driver_function(const char* symbol, void** fn) {
  enum cudaDriverEntryPointQueryResult status;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return cudaGetDriverEntryPoint(symbol, fn, cudaEnableDefault, &status);
#pragma GCC diagnostic pop
}
