// Each device's memory pool of the simulated stream-ordered allocator, and
// the figures cudaMemPoolGetAttribute reads (mem_pools.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace simcuda {

cudaMemPool_t default_mem_pool(int device);
bool is_mem_pool(cudaMemPool_t pool);
// Stream-ordered memory taken from, and given back to, a device's pool. A
// free of other memory is ignored.
void mem_pool_allocated(void* p, std::size_t size, int device);
void mem_pool_freed(void* p);
void mem_pool_device_reset(int device);
// cudaMemPoolGetAttribute and cudaMemPoolSetAttribute, without the error
// bookkeeping of the runtime's entry points.
cudaError_t mem_pool_get(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
cudaError_t mem_pool_set(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);

}  // namespace simcuda
