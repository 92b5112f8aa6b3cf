/* A second CUDA runtime in the process, standing in for CUDA 12's beside the
   simulated CUDA 13 one: as where PyTorch built for one major version loads a
   library built for the other. test-two-runtimes needs of it what matters
   there: a last error of its own per thread, which its callers'
   cudaGetLastError reads (set here by a kernel launch it refuses, as the
   runtime refuses a bad launch configuration), and the calls that gpupool
   intercepts, which reach it only without gpupool: allocations from host
   memory (its callers never touch them) and peer access (no peer); and its
   own way to the driver's functions, which fetches at its own version (CUDA
   12's signatures), so gpupool must pass a fetch to it: here every function
   it fetches is one that answers CUDA_ERROR_NOT_PERMITTED. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static __thread cudaError_t last_error;

static cudaError_t result(cudaError_t err) {
  if (err != cudaSuccess) last_error = err;
  return err;
}

EXPORT cudaError_t cudaGetLastError(void) {
  const cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

EXPORT cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                                    cudaStream_t stream) {
  (void)func, (void)grid, (void)block, (void)args, (void)shared_bytes, (void)stream;
  return result(cudaErrorInvalidConfiguration);
}

EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == NULL) return result(cudaErrorInvalidValue);
  *ptr = size <= ((size_t)1 << 40) ? malloc(size) : NULL;
  return *ptr != NULL ? cudaSuccess : result(cudaErrorMemoryAllocation);
}

EXPORT cudaError_t cudaFree(void* ptr) {
  free(ptr);
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)peer, (void)flags;
  return result(cudaErrorInvalidDevice);
}

EXPORT cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == NULL) return result(cudaErrorInvalidValue);
  *version = 12080;
  return cudaSuccess;
}

static int fetched_here(void) { return 800; /* CUDA_ERROR_NOT_PERMITTED */ }

EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult* status) {
  (void)flags;
  if (symbol == NULL || fn == NULL) return result(cudaErrorInvalidValue);
  int (*here)(void) = fetched_here;
  memcpy(fn, &here, sizeof here);
  if (status != NULL) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
