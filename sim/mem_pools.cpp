// The stream-ordered allocator's memory pools: each device's default pool,
// pools the program creates (cudaMemPoolCreate), and each device's current
// pool, the one cudaMallocAsync draws from (cudaDeviceSetMemPool, or CUDA
// 13's cudaMemSetMemPool). A pool's allocations are accessible from its own
// device and the devices cudaMemPoolSetAccess names, never through peer
// access (cudaDeviceEnablePeerAccess), as CUDA documents. Stream-
// ordered memory is given back as soon as a free runs here, so a pool
// reserves exactly what is in use; each keeps the figures programs read with
// cudaMemPoolGetAttribute (PyTorch's cudaMallocAsync backend and CuPy's async
// pool report memory from them).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <vector>

#include "sim/memory.hpp"
#include "sim/mem_pools.hpp"

namespace simcuda {

namespace {

constexpr int kDevices = 64;

struct Pool {
  int device = 0;
  bool destroyed = false;
  std::uint64_t used = 0;
  std::uint64_t used_high = 0;
  std::uint64_t reserved_high = 0;
  std::uint64_t release_threshold = 0;
  std::uint64_t accessors = 0;  // a bit per other device cudaMemPoolSetAccess granted
  std::uint64_t readers_only = 0;  // those of them granted cudaMemAccessFlagsProtRead

  cudaMemAccessFlags access_of(int accessor) const {
    if (accessor == device) return cudaMemAccessFlagsProtReadWrite;
    if ((accessors >> accessor & 1u) == 0) return cudaMemAccessFlagsProtNone;
    return (readers_only >> accessor & 1u) != 0 ? cudaMemAccessFlagsProtRead : cudaMemAccessFlagsProtReadWrite;
  }
  int reuse[3] = {1, 1, 1};  // follow event dependencies, opportunistic, internal dependencies
};

struct Pools {
  std::mutex mu;
  Pool defaults[kDevices];
  Pool* current[kDevices] = {};              // null: the default pool
  std::vector<std::unique_ptr<Pool>> created;  // kept after destruction: handles stay comparable
  struct Owned {
    std::size_t size;
    Pool* pool;
  };
  std::map<std::uintptr_t, Owned> allocations;  // by address: access is asked of any byte

  Pools() {
    for (int i = 0; i < kDevices; ++i) defaults[i].device = i;
  }
  // The live pool behind a handle, or null. Under mu.
  Pool* find(cudaMemPool_t handle) {
    auto* p = reinterpret_cast<Pool*>(handle);
    if (p >= defaults && p < defaults + std::min(kDevices, Memory::instance().devices())) return p;
    for (const auto& c : created) {
      if (c.get() == p && !c->destroyed) return p;
    }
    return nullptr;
  }
  Pool& current_of(int device) {
    Pool* p = current[device % kDevices];
    return p != nullptr ? *p : defaults[device % kDevices];
  }
};

Pools& pools() {
  static auto* all = new Pools;  // never destroyed: frees may run at exit
  return *all;
}

cudaMemPool_t handle(Pool* p) { return reinterpret_cast<cudaMemPool_t>(p); }

bool valid_device(int device) { return device >= 0 && device < Memory::instance().devices(); }

}  // namespace

cudaMemPool_t default_mem_pool(int device) { return handle(&pools().defaults[device % kDevices]); }

cudaMemPool_t current_mem_pool(int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  return handle(&all.current_of(device));
}

bool is_mem_pool(cudaMemPool_t pool) { return mem_pool_device(pool) >= 0; }

int mem_pool_device(cudaMemPool_t pool) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const Pool* p = all.find(pool);
  return p != nullptr ? p->device : -1;
}

bool mem_pools_supported(int device) {
  static const int poolless = [] {
    const char* v = std::getenv("SIMCUDA_POOLLESS_DEVICE");
    return v != nullptr && *v != '\0' ? std::atoi(v) : -1;
  }();
  return device != poolless;
}

cudaError_t create_mem_pool(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (pool == nullptr || props == nullptr || props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice || !valid_device(props->location.id)) {
    return cudaErrorInvalidValue;
  }
  if (!mem_pools_supported(props->location.id)) return cudaErrorNotSupported;
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  all.created.push_back(std::make_unique<Pool>());
  all.created.back()->device = props->location.id;
  *pool = handle(all.created.back().get());
  return cudaSuccess;
}

cudaError_t destroy_mem_pool(cudaMemPool_t pool) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool* p = all.find(pool);
  if (p == nullptr || (p >= all.defaults && p < all.defaults + kDevices)) return cudaErrorInvalidValue;
  p->destroyed = true;
  // A device whose current pool it was draws from its default one again.
  if (all.current[p->device] == p) all.current[p->device] = nullptr;
  return cudaSuccess;
}

cudaError_t set_current_mem_pool(int device, cudaMemPool_t pool) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool* p = all.find(pool);
  if (p == nullptr || p->device != device) return cudaErrorInvalidValue;  // a pool of that device only
  all.current[device] = p == &all.defaults[device] ? nullptr : p;
  return cudaSuccess;
}

cudaError_t set_mem_pool_access(cudaMemPool_t pool, const cudaMemAccessDesc* descs, std::size_t count) {
  if (descs == nullptr && count > 0) return cudaErrorInvalidValue;
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool* p = all.find(pool);
  if (p == nullptr) return cudaErrorInvalidValue;
  // Every descriptor is checked before any takes effect.
  for (std::size_t i = 0; i < count; ++i) {
    const cudaMemAccessDesc& d = descs[i];
    if (d.location.type != cudaMemLocationTypeDevice || !valid_device(d.location.id)) return cudaErrorInvalidValue;
    if (d.flags != cudaMemAccessFlagsProtNone && d.flags != cudaMemAccessFlagsProtRead &&
        d.flags != cudaMemAccessFlagsProtReadWrite) {
      return cudaErrorInvalidValue;
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descs[i].location.id;
    if (device == p->device) continue;  // its own device keeps its access
    const std::uint64_t bit = std::uint64_t{1} << device;
    p->accessors = descs[i].flags == cudaMemAccessFlagsProtNone ? p->accessors & ~bit : p->accessors | bit;
    p->readers_only = descs[i].flags == cudaMemAccessFlagsProtRead ? p->readers_only | bit : p->readers_only & ~bit;
  }
  return cudaSuccess;
}

cudaError_t get_mem_pool_access(cudaMemAccessFlags* flags, cudaMemPool_t pool, const cudaMemLocation* location) {
  if (flags == nullptr || location == nullptr || location->type != cudaMemLocationTypeDevice ||
      !valid_device(location->id)) {
    return cudaErrorInvalidValue;
  }
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const Pool* p = all.find(pool);
  if (p == nullptr) return cudaErrorInvalidValue;
  *flags = p->access_of(location->id);
  return cudaSuccess;
}

int mem_pool_access(const void* ptr, int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = all.allocations.upper_bound(at);
  if (it == all.allocations.begin()) return -1;
  --it;
  if (at >= it->first + it->second.size) return -1;
  return it->second.pool->access_of(device);
}

void mem_pool_allocated(void* p, std::size_t size, int device, cudaMemPool_t from) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool* pool = from != nullptr ? all.find(from) : &all.current_of(device);
  if (pool == nullptr) return;  // destroyed meanwhile
  all.allocations[reinterpret_cast<std::uintptr_t>(p)] = Pools::Owned{size, pool};
  pool->used += size;
  pool->used_high = std::max(pool->used_high, pool->used);
  pool->reserved_high = std::max(pool->reserved_high, pool->used);
}

void mem_pool_freed(void* p) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const auto it = all.allocations.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == all.allocations.end()) return;
  it->second.pool->used -= it->second.size;
  all.allocations.erase(it);
}

void mem_pool_device_reset(int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  std::erase_if(all.allocations, [device](const auto& a) {
    if (a.second.pool->device != device) return false;
    a.second.pool->used -= a.second.size;
    return true;
  });
  // The reset destroys the pools made on the device.
  for (const auto& c : all.created) {
    if (c->device == device) c->destroyed = true;
  }
  all.current[device % kDevices] = nullptr;
  all.defaults[device % kDevices].accessors = 0;  // its default pool starts afresh
  all.defaults[device % kDevices].readers_only = 0;
}

cudaError_t mem_pool_get(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  const Pool* pool = all.find(handle);
  if (pool == nullptr || value == nullptr) return cudaErrorInvalidValue;
  auto* u64 = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: *static_cast<int*>(value) = pool->reuse[0]; break;
    case cudaMemPoolReuseAllowOpportunistic: *static_cast<int*>(value) = pool->reuse[1]; break;
    case cudaMemPoolReuseAllowInternalDependencies: *static_cast<int*>(value) = pool->reuse[2]; break;
    case cudaMemPoolAttrReleaseThreshold: *u64 = pool->release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: *u64 = pool->used; break;  // nothing kept
    case cudaMemPoolAttrReservedMemHigh: *u64 = pool->reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: *u64 = pool->used; break;
    case cudaMemPoolAttrUsedMemHigh: *u64 = pool->used_high; break;
    default: return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t mem_pool_set(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mu);
  Pool* pool = all.find(handle);
  if (pool == nullptr || value == nullptr) return cudaErrorInvalidValue;
  auto u64 = [value] { return *static_cast<const std::uint64_t*>(value); };  // for those of that type
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: pool->reuse[0] = *static_cast<int*>(value); break;
    case cudaMemPoolReuseAllowOpportunistic: pool->reuse[1] = *static_cast<int*>(value); break;
    case cudaMemPoolReuseAllowInternalDependencies: pool->reuse[2] = *static_cast<int*>(value); break;
    case cudaMemPoolAttrReleaseThreshold: pool->release_threshold = u64(); break;
    // A high watermark can only be reset, to what is held now.
    case cudaMemPoolAttrReservedMemHigh:
      if (u64() != 0) return cudaErrorInvalidValue;
      pool->reserved_high = pool->used;
      break;
    case cudaMemPoolAttrUsedMemHigh:
      if (u64() != 0) return cudaErrorInvalidValue;
      pool->used_high = pool->used;
      break;
    default: return cudaErrorInvalidValue;  // the current figures are read-only
  }
  return cudaSuccess;
}

}  // namespace simcuda
