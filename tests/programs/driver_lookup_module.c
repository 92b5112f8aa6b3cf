/* A library that reaches the driver itself, as a library carrying its own
   static runtime does (NCCL, or CUDA code CMake linked statically), or as
   XLA's CUDA stubs do, fetching each function with dlsym by its exported
   name: gpupool leaves it alone unless static_runtime_libraries names it,
   but for the calls it watches. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <string.h>

void* lookup_in(void* handle, const char* name) { return dlsym(handle, name); }

/* The driver's function `base` at `version` with `flags`, fetched through the
   cuGetProcAddress this library looked up in `handle` itself, as NVIDIA's
   cuda-python bindings fetch every driver function: NULL where not found. */
void* proc_address_in(void* handle, const char* base, int version, cuuint64_t flags) {
  CUresult (*get)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  void* symbol = dlsym(handle, "cuGetProcAddress_v2");
  if (symbol == NULL) return NULL;
  memcpy(&get, &symbol, sizeof symbol);
  void* found = NULL;
  return get(base, &found, version, flags, NULL) == CUDA_SUCCESS ? found : NULL;
}

/* n cuMemAlloc/cuMemFree pairs through entry points fetched as a static
   runtime fetches them (cuGetProcAddress found with dlsym, fetched again
   through itself, every other function through that); 0 when every call
   succeeded. */
int library_pairs(int n) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == NULL) return 1;
  CUresult (*get)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  void* symbol = dlsym(driver, "cuGetProcAddress_v2");
  if (symbol == NULL) return 1;
  memcpy(&get, &symbol, sizeof symbol);
  if (get("cuGetProcAddress", &symbol, 12000, 0, NULL) != CUDA_SUCCESS) return 1;
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

/* Fills the block with a pattern and reads it back: 0 when it held. */
static int write_and_check(CUresult (*htod)(CUdeviceptr, const void*, size_t),
                           CUresult (*dtoh)(void*, CUdeviceptr, size_t), CUdeviceptr p, size_t size, int seed) {
  static unsigned char in[1 << 19], back[1 << 19];
  if (size > sizeof in) return 1;
  for (size_t i = 0; i < size; ++i) in[i] = (unsigned char)(i * 7 + (size_t)seed);
  if (htod(p, in, size) != CUDA_SUCCESS || dtoh(back, p, size) != CUDA_SUCCESS) return 1;
  return memcmp(in, back, size) != 0;
}

#define FETCH_OR(var, name, failed)                   \
  do {                                                \
    void* f_ = dlsym(driver, name);                   \
    if (f_ == NULL) return failed;                    \
    memcpy(&var, &f_, sizeof f_);                     \
  } while (0)
#define FETCH(var, name) FETCH_OR(var, name, 1)

/* Makes device 0's primary context current, as XLA does (a real driver
   needs a current context): 0 when it is. */
static int use_primary_context(void* driver) {
  CUresult (*init)(unsigned int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  FETCH(init, "cuInit");
  FETCH(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  FETCH(ctx_set_current, "cuCtxSetCurrent");
  CUcontext ctx = NULL;
  return init(0) != CUDA_SUCCESS || primary_ctx_retain(&ctx, 0) != CUDA_SUCCESS || ctx_set_current(ctx) != CUDA_SUCCESS;
}

/* n pairs of each: cuMemAlloc/cuMemFree, stream-ordered on a stream of its
   own, stream-ordered on the per-thread default stream, and pitched rows,
   and one block from the default memory pool named; one from a pool of its
   own made current, one after that pool is destroyed, one from another pool
   made current with CUDA 13's cuMemSetMemPool (set back before it is
   destroyed; skipped by a driver older than 13.0), and a reset of the default pool's high watermark with nothing
   held;
   every function fetched with dlsym under the name the driver exports it by
   (cuMemAlloc_v2, ...), each block written and read back; the default memory
   pool's figure of bytes in use read while the first stream-ordered block is
   held. 0 when every call succeeded, every block held its pattern and the
   figure counted the block. */
int library_by_name(int n) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == NULL) return 1;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  CUresult (*mem_alloc_async_ptsz)(CUdeviceptr*, size_t, CUstream);
  CUresult (*mem_free_async_ptsz)(CUdeviceptr, CUstream);
  CUresult (*mem_alloc_pitch)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
  CUresult (*mem_get_info)(size_t*, size_t*);
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*stream_create)(CUstream*, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*device_get_default_mem_pool)(CUmemoryPool*, CUdevice);
  CUresult (*mem_pool_get_attribute)(CUmemoryPool, CUmemPool_attribute, void*);
  CUresult (*mem_alloc_from_pool_async)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  CUresult (*mem_pool_set_attribute)(CUmemoryPool, CUmemPool_attribute, void*);
  CUresult (*mem_pool_create)(CUmemoryPool*, const CUmemPoolProps*);
  CUresult (*mem_pool_destroy)(CUmemoryPool);
  CUresult (*device_set_mem_pool)(CUdevice, CUmemoryPool);
  CUresult (*mem_set_mem_pool)(CUmemLocation*, CUmemAllocationType, CUmemoryPool) = NULL;
  FETCH(mem_alloc, "cuMemAlloc_v2");
  FETCH(mem_free, "cuMemFree_v2");
  FETCH(mem_alloc_async, "cuMemAllocAsync");
  FETCH(mem_free_async, "cuMemFreeAsync");
  FETCH(mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz");
  FETCH(mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
  FETCH(mem_alloc_pitch, "cuMemAllocPitch_v2");
  FETCH(mem_get_info, "cuMemGetInfo_v2");
  FETCH(htod, "cuMemcpyHtoD_v2");
  FETCH(dtoh, "cuMemcpyDtoH_v2");
  FETCH(stream_create, "cuStreamCreate");
  FETCH(stream_destroy, "cuStreamDestroy_v2");
  FETCH(stream_synchronize, "cuStreamSynchronize");
  FETCH(device_get_default_mem_pool, "cuDeviceGetDefaultMemPool");
  FETCH(mem_pool_get_attribute, "cuMemPoolGetAttribute");
  FETCH(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync");
  FETCH(mem_pool_set_attribute, "cuMemPoolSetAttribute");
  FETCH(mem_pool_create, "cuMemPoolCreate");
  FETCH(mem_pool_destroy, "cuMemPoolDestroy");
  FETCH(device_set_mem_pool, "cuDeviceSetMemPool");
  void* set_by_location = dlsym(driver, "cuMemSetMemPool");
  if (set_by_location != NULL) memcpy(&mem_set_mem_pool, &set_by_location, sizeof set_by_location);
  if (use_primary_context(driver) != 0) return 1;
  CUstream s = NULL;
  if (stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 1;
  CUmemoryPool pool = NULL;
  if (device_get_default_mem_pool(&pool, 0) != CUDA_SUCCESS) return 1;
  for (int i = 0; i < n; ++i) {
    const size_t size = (size_t)(i % 7 + 1) << 16;
    CUdeviceptr p = 0;
    if (mem_alloc(&p, size) != CUDA_SUCCESS || write_and_check(htod, dtoh, p, size, i) != 0) return 1;
    if (mem_free(p) != CUDA_SUCCESS) return 1;
    if (mem_alloc_async(&p, size, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS) return 1;
    cuuint64_t used = 0;
    if (i == 0 && (mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS ||
                   used < size)) {
      return 1;
    }
    if (write_and_check(htod, dtoh, p, size, i + 1) != 0 || mem_free_async(p, s) != CUDA_SUCCESS) return 1;
    /* The per-thread default stream's twins (a null stream names it), and rows. */
    if (mem_alloc_async_ptsz(&p, size, NULL) != CUDA_SUCCESS || stream_synchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS) {
      return 1;
    }
    if (write_and_check(htod, dtoh, p, size, i + 2) != 0 || mem_free_async_ptsz(p, NULL) != CUDA_SUCCESS) return 1;
    size_t pitch = 0;
    if (mem_alloc_pitch(&p, &pitch, 1000, 64, 4) != CUDA_SUCCESS || pitch < 1000) return 1;
    if (write_and_check(htod, dtoh, p, pitch * 64, i + 3) != 0 || mem_free(p) != CUDA_SUCCESS) return 1;
  }
  /* One more from the default pool named, as XLA's async allocator asks. */
  CUdeviceptr named = 0;
  if (mem_alloc_from_pool_async(&named, 1 << 19, pool, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS) {
    return 1;
  }
  if (write_and_check(htod, dtoh, named, 1 << 19, 7) != 0 || mem_free_async(named, s) != CUDA_SUCCESS) return 1;
  /* A pool of its own made current: that block is the pool's (the runtime's);
     the pool destroyed, the next block is the default pool's again. */
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool own = NULL;
  cuuint64_t own_used = 0;
  if (mem_pool_create(&own, &props) != CUDA_SUCCESS || device_set_mem_pool(0, own) != CUDA_SUCCESS) return 1;
  for (int i = 0; i < 2; ++i) {
    CUdeviceptr p = 0;
    if (mem_alloc_async(&p, 1 << 19, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS) return 1;
    if (i == 0 && (mem_pool_get_attribute(own, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &own_used) != CUDA_SUCCESS ||
                   own_used < (1 << 19))) {
      return 1;
    }
    if (mem_free_async(p, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS) return 1;
    if (i == 0 && mem_pool_destroy(own) != CUDA_SUCCESS) return 1;
  }
  /* The same made current by location: that block is the pool's too. */
  if (mem_set_mem_pool != NULL) {
    CUmemLocation zero_location;
    memset(&zero_location, 0, sizeof zero_location);
    zero_location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    zero_location.id = 0;
    CUdeviceptr p = 0;
    if (mem_pool_create(&own, &props) != CUDA_SUCCESS ||
        mem_set_mem_pool(&zero_location, CU_MEM_ALLOCATION_TYPE_PINNED, own) != CUDA_SUCCESS ||
        mem_alloc_async(&p, 1 << 19, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS ||
        mem_pool_get_attribute(own, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &own_used) != CUDA_SUCCESS ||
        own_used < (1 << 19) || mem_free_async(p, s) != CUDA_SUCCESS || stream_synchronize(s) != CUDA_SUCCESS ||
        mem_set_mem_pool(&zero_location, CU_MEM_ALLOCATION_TYPE_PINNED, pool) != CUDA_SUCCESS ||
        mem_pool_destroy(own) != CUDA_SUCCESS) {
      return 1;
    }
  }
  /* With nothing held, a reset high watermark reads 0. */
  cuuint64_t zero = 0, high = 1;
  if (mem_pool_set_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero) != CUDA_SUCCESS ||
      mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high) != CUDA_SUCCESS || high != 0) {
    return 1;
  }
  size_t free_bytes = 0, total = 0;
  if (mem_get_info(&free_bytes, &total) != CUDA_SUCCESS || free_bytes > total) return 1;
  if (stream_synchronize(s) != CUDA_SUCCESS || stream_destroy(s) != CUDA_SUCCESS) return 1;
  return 0;
}

/* A block freed into the pool, the device reset through `reset_name` fetched by
   name (its first or second version), then a block of the same size written
   and read back: 0 when nothing from before the reset came back. */
int library_reset_by_name(const char* reset_name) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == NULL) return 1;
  CUresult (*reset)(CUdevice);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  FETCH(reset, reset_name);
  FETCH(mem_alloc, "cuMemAlloc_v2");
  FETCH(mem_free, "cuMemFree_v2");
  FETCH(htod, "cuMemcpyHtoD_v2");
  FETCH(dtoh, "cuMemcpyDtoH_v2");
  if (use_primary_context(driver) != 0) return 1;
  const size_t size = (size_t)256 << 10;
  CUdeviceptr p = 0;
  if (mem_alloc(&p, size) != CUDA_SUCCESS || write_and_check(htod, dtoh, p, size, 1) != 0) return 1;
  if (mem_free(p) != CUDA_SUCCESS) return 1;
  if (reset(0) != CUDA_SUCCESS || use_primary_context(driver) != 0) return 1;
  if (mem_alloc(&p, size) != CUDA_SUCCESS || write_and_check(htod, dtoh, p, size, 2) != 0) return 1;
  return mem_free(p) != CUDA_SUCCESS;
}

/* The driver, and the simulated driver's query of who may use a block: 0
   when both were found. */
static int driver_and_access_query(void** driver, int (**accessible)(const void*, int)) {
  *driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (*driver == NULL) return 1;
  void* query = dlsym(*driver, "simcuda_accessible");
  if (query == NULL) return 1;
  memcpy(accessible, &query, sizeof query);
  return 0;
}

/* As XLA's async allocator on two devices: a block from device 0's default
   memory pool named, then the pool opened to device 1 (cuMemPoolSetAccess),
   then a larger block from it, every function fetched by name. Which blocks
   device 1 may use, as the simulated driver says: bit 0 the first, bit 1 the
   second; -1 where a call failed or the driver cannot say. */
int library_pool_access_by_name(void) {
  void* driver = NULL;
  int (*accessible)(const void*, int) = NULL;
  if (driver_and_access_query(&driver, &accessible) != 0) return -1;
  CUresult (*stream_create)(CUstream*, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*device_get_default_mem_pool)(CUmemoryPool*, CUdevice);
  CUresult (*mem_alloc_from_pool_async)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  CUresult (*mem_pool_set_access)(CUmemoryPool, const CUmemAccessDesc*, size_t);
  FETCH_OR(stream_create, "cuStreamCreate", -1);
  FETCH_OR(stream_destroy, "cuStreamDestroy_v2", -1);
  FETCH_OR(stream_synchronize, "cuStreamSynchronize", -1);
  FETCH_OR(device_get_default_mem_pool, "cuDeviceGetDefaultMemPool", -1);
  FETCH_OR(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync", -1);
  FETCH_OR(mem_free_async, "cuMemFreeAsync", -1);
  FETCH_OR(mem_pool_set_access, "cuMemPoolSetAccess", -1);
  if (use_primary_context(driver) != 0) return -1;
  CUstream s = NULL;
  CUmemoryPool pool = NULL;
  if (stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      device_get_default_mem_pool(&pool, 0) != CUDA_SUCCESS) {
    return -1;
  }
  CUdeviceptr blocks[2] = {0, 0};
  if (mem_alloc_from_pool_async(&blocks[0], (size_t)1 << 20, pool, s) != CUDA_SUCCESS) return -1;
  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 1;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (mem_pool_set_access(pool, &desc, 1) != CUDA_SUCCESS) return -1;
  if (mem_alloc_from_pool_async(&blocks[1], (size_t)8 << 20, pool, s) != CUDA_SUCCESS) return -1;
  int open = 0;
  for (int i = 0; i < 2; ++i) {
    if (accessible((const void*)(uintptr_t)blocks[i], 1)) open |= 1 << i;
    if (mem_free_async(blocks[i], s) != CUDA_SUCCESS) return -1;
  }
  if (stream_synchronize(s) != CUDA_SUCCESS || stream_destroy(s) != CUDA_SUCCESS) return -1;
  return open;
}

/* Peer access between two devices' primary contexts, cuCtxEnablePeerAccess
   and cuCtxDisablePeerAccess fetched by name: a block of device 1's, device 0
   given access, then the access taken away. Whether device 0 may use the
   block, as the simulated driver says: bit 0 with access, bit 1 after it was
   taken away; -1 where a call failed or the driver cannot say. */
int library_peer_by_name(void) {
  void* driver = NULL;
  int (*accessible)(const void*, int) = NULL;
  if (driver_and_access_query(&driver, &accessible) != 0) return -1;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*ctx_enable_peer_access)(CUcontext, unsigned int);
  CUresult (*ctx_disable_peer_access)(CUcontext);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  FETCH_OR(primary_ctx_retain, "cuDevicePrimaryCtxRetain", -1);
  FETCH_OR(ctx_set_current, "cuCtxSetCurrent", -1);
  FETCH_OR(ctx_enable_peer_access, "cuCtxEnablePeerAccess", -1);
  FETCH_OR(ctx_disable_peer_access, "cuCtxDisablePeerAccess", -1);
  FETCH_OR(mem_alloc, "cuMemAlloc_v2", -1);
  FETCH_OR(mem_free, "cuMemFree_v2", -1);
  if (use_primary_context(driver) != 0) return -1;  /* device 0's, and cuInit */
  CUcontext zero = NULL;
  CUcontext one = NULL;
  if (primary_ctx_retain(&zero, 0) != CUDA_SUCCESS || primary_ctx_retain(&one, 1) != CUDA_SUCCESS) return -1;
  if (ctx_enable_peer_access(one, 0) != CUDA_SUCCESS || ctx_set_current(one) != CUDA_SUCCESS) return -1;
  CUdeviceptr p = 0;
  if (mem_alloc(&p, (size_t)4 << 20) != CUDA_SUCCESS) return -1;
  int open = accessible((const void*)(uintptr_t)p, 0) ? 1 : 0;
  if (ctx_set_current(zero) != CUDA_SUCCESS || ctx_disable_peer_access(one) != CUDA_SUCCESS) return -1;
  open |= accessible((const void*)(uintptr_t)p, 0) ? 2 : 0;
  if (ctx_set_current(one) != CUDA_SUCCESS || mem_free(p) != CUDA_SUCCESS) return -1;
  return open;
}

/* Destroys `stream` through cuStreamDestroy_v2 fetched by name, as a library
   that destroys through the driver a stream another one used with the
   runtime does (gpupool watches such a lookup): the driver's answer (the
   type hazard_cases.hpp calls it with). */
CUresult destroy_stream_by_name(CUstream stream) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == NULL) return CUDA_ERROR_NOT_FOUND;
  CUresult (*destroy)(CUstream);
  FETCH(destroy, "cuStreamDestroy_v2");
  return destroy(stream);
}
