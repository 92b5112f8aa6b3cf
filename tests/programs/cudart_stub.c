/* A library built as TensorFlow's and XLA's cudart stubs are: it links no
   runtime, defines the runtime's calls it uses itself, each forwarding to
   the function it fetched by name from the runtime it opens (at load, as
   those open it early), and its own code calls them by name.
   test-hidden-runtime loads it RTLD_LOCAL and runs hidden_runtime_exercise.
   Under gpupool its calls bind to gpupool's exports, and what it fetches is
   gpupool's too; this library counts as a runtime of its own, whose
   cudaGetLastError forwards to gpupool's. Built without tail calls (as at
   -O0): a forwarding tail call would leave gpupool's entry point its
   caller's caller, gpupool's own call, and hide the loop. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cuda_error; /* cudaError_t, without the runtime's headers */
enum { kSuccess = 0, kMemoryAllocation = 2 };

static void* runtime;

static void* fetch(const char* name) {
  if (runtime == NULL) runtime = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  return runtime != NULL ? dlsym(runtime, name) : NULL;
}

__attribute__((constructor)) static void open_runtime(void) { fetch("cudaGetLastError"); }

#define FORWARD(name, params, args)                  \
  EXPORT cuda_error name params {                    \
    cuda_error(*f) params = NULL;                    \
    void* found = fetch(#name);                      \
    if (found == NULL) return 35; /* no runtime */   \
    memcpy(&f, &found, sizeof found);                \
    return f args;                                   \
  }
FORWARD(cudaMalloc, (void** ptr, size_t size), (ptr, size))
FORWARD(cudaFree, (void* ptr), (ptr))
FORWARD(cudaGetLastError, (void), ())
FORWARD(cudaPeekAtLastError, (void), ())
#undef FORWARD

/* Returns 0, or the number of the first step that failed (*error: what it
   returned). A request larger than any device fails, and the failure is
   read back as the last error, once. */
EXPORT int hidden_runtime_exercise(cuda_error* error) {
  void* block = NULL;
  cuda_error got[6];
  got[0] = cudaMalloc(&block, 1 << 20);
  got[1] = cudaFree(block);
  got[2] = cudaMalloc(&block, (size_t)1 << 50);
  got[3] = cudaPeekAtLastError();
  got[4] = cudaGetLastError();
  got[5] = cudaGetLastError();
  static const cuda_error kExpected[6] = {kSuccess, kSuccess, kMemoryAllocation, kMemoryAllocation,
                                          kMemoryAllocation, kSuccess};
  for (int i = 0; i < 6; ++i) {
    if (got[i] != kExpected[i]) {
      *error = got[i];
      return i + 1;
    }
  }
  *error = kSuccess;
  return 0;
}
