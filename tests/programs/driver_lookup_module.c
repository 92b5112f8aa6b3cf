/* A library that reaches the driver itself, as a library carrying its own
   static runtime does (NCCL, or CUDA code CMake linked statically): gpupool
   leaves it alone unless static_runtime_libraries names it. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <string.h>

void* lookup_in(void* handle, const char* name) { return dlsym(handle, name); }

/* n cuMemAlloc/cuMemFree pairs through entry points fetched as a static
   runtime fetches them; 0 when every call succeeded. */
int library_pairs(int n) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == NULL) return 1;
  CUresult (*get)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  void* symbol = dlsym(driver, "cuGetProcAddress_v2");
  if (symbol == NULL) return 1;
  memcpy(&get, &symbol, sizeof symbol);
  void* alloc_fn = NULL;
  void* free_fn = NULL;
  if (get("cuMemAlloc", &alloc_fn, 3020, 0, NULL) != CUDA_SUCCESS ||
      get("cuMemFree", &free_fn, 3020, 0, NULL) != CUDA_SUCCESS) {
    return 1;
  }
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  memcpy(&mem_alloc, &alloc_fn, sizeof alloc_fn);
  memcpy(&mem_free, &free_fn, sizeof free_fn);
  for (int i = 0; i < n; ++i) {
    CUdeviceptr p = 0;
    if (mem_alloc(&p, (size_t)(i % 7 + 1) << 16) != CUDA_SUCCESS || mem_free(p) != CUDA_SUCCESS) return 1;
  }
  return 0;
}
