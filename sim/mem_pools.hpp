// The memory pools of the simulated stream-ordered allocator, and the
// figures cudaMemPoolGetAttribute reads (mem_pools.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace simcuda {

// False for the device SIMCUDA_POOLLESS_DEVICE names (a GPU without
// stream-ordered allocation: cudaDevAttrMemoryPoolsSupported is 0, and its
// pool calls fail with cudaErrorNotSupported).
bool mem_pools_supported(int device);
cudaMemPool_t default_mem_pool(int device);
cudaMemPool_t current_mem_pool(int device);
bool is_mem_pool(cudaMemPool_t pool);
int mem_pool_device(cudaMemPool_t pool);  // -1: not a pool
cudaError_t create_mem_pool(cudaMemPool_t* pool, const cudaMemPoolProps* props);
cudaError_t destroy_mem_pool(cudaMemPool_t pool);
cudaError_t set_current_mem_pool(int device, cudaMemPool_t pool);
// cudaMemPoolSetAccess and cudaMemPoolGetAccess (devices only: the simulated
// runtime has no host pools).
cudaError_t set_mem_pool_access(cudaMemPool_t pool, const cudaMemAccessDesc* descs, std::size_t count);
cudaError_t get_mem_pool_access(cudaMemAccessFlags* flags, cudaMemPool_t pool, const cudaMemLocation* location);
// How `device` may access the stream-ordered allocation holding ptr (a
// cudaMemAccessFlags value), or -1 where ptr lies in none.
int mem_pool_access(const void* ptr, int device);
// Stream-ordered memory taken from `from` (null: the device's current pool),
// and given back. A free of other memory is ignored.
void mem_pool_allocated(void* p, std::size_t size, int device, cudaMemPool_t from);
void mem_pool_freed(void* p);
void mem_pool_device_reset(int device);
// cudaMemPoolGetAttribute and cudaMemPoolSetAttribute, without the error
// bookkeeping of the runtime's entry points.
cudaError_t mem_pool_get(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
cudaError_t mem_pool_set(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);

}  // namespace simcuda
