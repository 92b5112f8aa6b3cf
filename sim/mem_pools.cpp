// The stream-ordered allocator's memory pools: one per device, its default
// and current pool. Stream-ordered memory is given back as soon as a free
// runs here, so a pool reserves exactly what is in use; each keeps the
// figures programs read with cudaMemPoolGetAttribute (PyTorch's
// cudaMallocAsync backend and CuPy's async pool report memory from them).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "sim/memory.hpp"
#include "sim/mem_pools.hpp"

namespace simcuda {

namespace {

constexpr int kPools = 64;

struct Pool {
  std::uint64_t used = 0;
  std::uint64_t used_high = 0;
  std::uint64_t reserved_high = 0;
  std::uint64_t release_threshold = 0;
  int reuse[3] = {1, 1, 1};  // follow event dependencies, opportunistic, internal dependencies
};

struct Pools {
  std::mutex mu;
  Pool pools[kPools];
  struct Owned {
    std::size_t size;
    int device;
  };
  std::unordered_map<void*, Owned> allocations;
};

Pools& pools() {
  static auto* all = new Pools;  // never destroyed: frees may run at exit
  return *all;
}

int index_of(cudaMemPool_t pool) {
  auto* p = reinterpret_cast<Pool*>(pool);
  Pools& all = pools();
  if (p < all.pools || p >= all.pools + std::min(kPools, Memory::instance().devices())) return -1;
  return static_cast<int>(p - all.pools);
}

}  // namespace

cudaMemPool_t default_mem_pool(int device) {
  return reinterpret_cast<cudaMemPool_t>(&pools().pools[device % kPools]);
}

bool is_mem_pool(cudaMemPool_t pool) { return index_of(pool) >= 0; }

void mem_pool_allocated(void* p, std::size_t size, int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  all.allocations[p] = Pools::Owned{size, device};
  Pool& pool = all.pools[device % kPools];
  pool.used += size;
  pool.used_high = std::max(pool.used_high, pool.used);
  pool.reserved_high = std::max(pool.reserved_high, pool.used);
}

void mem_pool_freed(void* p) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const auto it = all.allocations.find(p);
  if (it == all.allocations.end()) return;
  all.pools[it->second.device % kPools].used -= it->second.size;
  all.allocations.erase(it);
}

void mem_pool_device_reset(int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  std::erase_if(all.allocations, [device](const auto& a) { return a.second.device == device; });
  all.pools[device % kPools].used = 0;
}

cudaError_t mem_pool_get(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  const int i = index_of(handle);
  if (i < 0 || value == nullptr) return cudaErrorInvalidValue;
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const Pool& pool = all.pools[i];
  auto* u64 = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: *static_cast<int*>(value) = pool.reuse[0]; break;
    case cudaMemPoolReuseAllowOpportunistic: *static_cast<int*>(value) = pool.reuse[1]; break;
    case cudaMemPoolReuseAllowInternalDependencies: *static_cast<int*>(value) = pool.reuse[2]; break;
    case cudaMemPoolAttrReleaseThreshold: *u64 = pool.release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: *u64 = pool.used; break;  // nothing kept
    case cudaMemPoolAttrReservedMemHigh: *u64 = pool.reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: *u64 = pool.used; break;
    case cudaMemPoolAttrUsedMemHigh: *u64 = pool.used_high; break;
    default: return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t mem_pool_set(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  const int i = index_of(handle);
  if (i < 0 || value == nullptr) return cudaErrorInvalidValue;
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool& pool = all.pools[i];
  auto u64 = [value] { return *static_cast<const std::uint64_t*>(value); };  // for those of that type
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: pool.reuse[0] = *static_cast<int*>(value); break;
    case cudaMemPoolReuseAllowOpportunistic: pool.reuse[1] = *static_cast<int*>(value); break;
    case cudaMemPoolReuseAllowInternalDependencies: pool.reuse[2] = *static_cast<int*>(value); break;
    case cudaMemPoolAttrReleaseThreshold: pool.release_threshold = u64(); break;
    // A high watermark can only be reset, to what is held now.
    case cudaMemPoolAttrReservedMemHigh:
      if (u64() != 0) return cudaErrorInvalidValue;
      pool.reserved_high = pool.used;
      break;
    case cudaMemPoolAttrUsedMemHigh:
      if (u64() != 0) return cudaErrorInvalidValue;
      pool.used_high = pool.used;
      break;
    default: return cudaErrorInvalidValue;  // the current figures are read-only
  }
  return cudaSuccess;
}

}  // namespace simcuda
