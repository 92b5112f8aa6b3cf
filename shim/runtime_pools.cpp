// gpupool's memory as each device's default memory pool: which pool is
// current, trimming, the pool's figures, peer access and IPC.
#include <algorithm>
#include <string>
#include <vector>

#include "report/diagnosis.hpp"
#include "shim/messages.hpp"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"

namespace gpupool::shim {

// gpupool's memory stands for each device's default pool: the pool
// cudaMallocAsync draws from unless the program made another one current
// (then the runtime serves those calls).
template <typename F>
void Runtime::for_each_device_of_pool(cudaMemPool_t pool, F&& f) {
  if (pool == nullptr) return;
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* d = existing(i);
    if (d != nullptr && is_default_pool(pool, i)) f(*d);
  }
}

bool Runtime::is_default_pool(cudaMemPool_t pool, int device) {
  if (pool == nullptr || device < 0 || device >= kMaxDevices) return false;
  cudaMemPool_t known = default_pools_[device].load(std::memory_order_acquire);
  if (known == nullptr) {
    if (real().cudaDeviceGetDefaultMemPool == nullptr ||
        internal([&](const RealCuda& r) { return r.cudaDeviceGetDefaultMemPool(&known, device); }) != cudaSuccess) {
      return false;
    }
    default_pools_[device].store(known, std::memory_order_release);
  }
  return pool == known;
}

void Runtime::current_pool_set(int device, cudaMemPool_t pool) {
  if (device < 0 || device >= kMaxDevices) return;
  // Unsure which pool it is: the runtime serves the calls, as without gpupool.
  own_pool_current_[device].store(!is_default_pool(pool, device), std::memory_order_relaxed);
}

int Runtime::device_of_default_pool(cudaMemPool_t pool) {
  int count = 0;
  if (pool == nullptr || real().cudaGetDeviceCount == nullptr ||
      internal([&](const RealCuda& r) { return r.cudaGetDeviceCount(&count); }) != cudaSuccess) {
    return -1;
  }
  for (int i = 0; i < count && i < kMaxDevices; ++i) {
    if (is_default_pool(pool, i)) return i;
  }
  return -1;
}

void Runtime::pool_access_set(cudaMemPool_t pool, const cudaMemAccessDesc* descs, std::size_t count) {
  if (descs == nullptr) return;
  const int owner = device_of_default_pool(pool);
  if (owner < 0) return;  // a pool the program made: the runtime's memory
  bool opened = false;
  for (std::size_t i = 0; i < count; ++i) {
    const cudaMemAccessDesc& desc = descs[i];
    if (desc.location.type != cudaMemLocationTypeDevice || desc.location.id == owner) continue;
    if (desc.flags == cudaMemAccessFlagsProtNone) {
      access_revoked(desc.location.id, owner, kAnyPoolAccess);
    } else {
      access_granted(desc.location.id, owner,
                     desc.flags == cudaMemAccessFlagsProtRead ? kPoolReadAccess : kPoolAccess);
      opened = true;
    }
  }
  if (!opened) return;
  DeviceState* d = nullptr;
  {
    // With make_device's lock: a pool made meanwhile follows it there.
    std::lock_guard<std::mutex> lock(devices_mu_);
    default_pool_opened_[owner].store(true, std::memory_order_relaxed);
    d = existing(owner);
  }
  if (d != nullptr) follow_opened_pool(*d);
}

void Runtime::follow_opened_pool(DeviceState& d) {
  std::int64_t lent = 0;
  {
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    if (d.pool->options().expandable_segments) return;  // its pages were opened (access_granted)
    lent = d.pool->stats().stream_ordered_bytes.current;
  }
  if (opened_pool_to_runtime_[d.device].exchange(true, std::memory_order_relaxed)) return;
  const std::string device = std::to_string(d.device);
  message(config::LogLevel::Warn,
          "gpupool: cudaMemPoolSetAccess opened device " + device +
              "'s default memory pool to other devices, but gpupool's memory there is fixed segments from "
              "cudaMalloc, which only peer access (cudaDeviceEnablePeerAccess) opens: device " + device +
              "'s stream-ordered allocations go to the runtime from now on, unpooled" +
              (lent > 0 ? "; the " + report::human_bytes(static_cast<double>(lent)) +
                              " of stream-ordered blocks gpupool lent before stay closed to them"
                        : "") +
              ". GPUPOOL_EXPANDABLE_SEGMENTS=1 keeps them pooled");
}

void Runtime::end_grants_at_reset(int dev) {
  std::vector<AccessGrant> ending;  // each with the reasons that end
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    for (const AccessGrant& g : access_grants_) {
      unsigned reasons = 0;
      if (g.owner == dev) reasons |= g.reasons & kAnyPoolAccess;
      if (g.owner == dev || g.accessor == dev) reasons |= g.reasons & kPeerAccess;
      if (reasons != 0) ending.push_back({g.accessor, g.owner, reasons});
    }
  }
  for (const AccessGrant& g : ending) access_revoked(g.accessor, g.owner, g.reasons);
}

void Runtime::pool_destroyed() {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (!own_pool_current_[i].load(std::memory_order_relaxed)) continue;
    cudaMemPool_t current = nullptr;
    if (real().cudaDeviceGetMemPool != nullptr &&
        internal([&](const RealCuda& r) { return r.cudaDeviceGetMemPool(&current, i); }) == cudaSuccess) {
      current_pool_set(i, current);
    }
  }
}

void Runtime::trim(cudaMemPool_t pool, std::size_t keep) {
  bool flushed = false;
  for_each_device_of_pool(pool, [&](DeviceState& d) {
    if (!flushed && caches_.enabled()) caches_.flush_all();  // before the pool's lock, as allocate does
    flushed = true;
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    if (!d.foreign_frees.empty()) return_foreign_frees(d, false);
    if (static_cast<std::size_t>(d.pool->stats().reserved_bytes[kAll].current) > keep) d.pool->release_cached();
  });
}

void Runtime::add_pool_figure(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  const bool used = attr == cudaMemPoolAttrUsedMemCurrent || attr == cudaMemPoolAttrUsedMemHigh;
  const bool high = attr == cudaMemPoolAttrReservedMemHigh || attr == cudaMemPoolAttrUsedMemHigh;
  if (!used && !high && attr != cudaMemPoolAttrReservedMemCurrent) return;
  std::uint64_t added = 0;
  for_each_device_of_pool(pool, [&](DeviceState& d) {
    // Not in use. (The high watermark counts them, as the report's peaks do.)
    const std::int64_t kept = used && !high ? kept_by_threads(d.device) : 0;
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    const MemoryStats& s = d.pool->stats();
    const std::int64_t figure = high ? (used ? s.stream_ordered_high : s.reserved_high)
                                     : (used ? s.stream_ordered_bytes.current : s.reserved_bytes[kAll].current) - kept;
    // `kept` was read before this lock: a thread may have taken a kept block
    // back since, so the figure can read low, even below 0.
    if (figure > 0) added += static_cast<std::uint64_t>(figure);
  });
  *static_cast<std::uint64_t*>(value) += added;
}

void Runtime::reset_pool_high(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  if (attr != cudaMemPoolAttrUsedMemHigh && attr != cudaMemPoolAttrReservedMemHigh) return;
  const auto which =
      attr == cudaMemPoolAttrUsedMemHigh ? DevicePool::Watermark::StreamOrdered : DevicePool::Watermark::Reserved;
  bool flushed = false;
  for_each_device_of_pool(pool, [&](DeviceState& d) {
    // Blocks threads keep go back first, so that the watermark starts from
    // what the program holds.
    if (!flushed && caches_.enabled()) caches_.flush_all();
    flushed = true;
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    d.pool->reset_high(which);
  });
}

std::vector<Runtime::AccessGrant>::iterator Runtime::grant_of(int accessor, int owner) {
  return std::find_if(access_grants_.begin(), access_grants_.end(),
                      [&](const AccessGrant& a) { return a.accessor == accessor && a.owner == owner; });
}

// How gpupool's pages are open to a device for a grant's reasons.
CUmemAccess_flags Runtime::access_flags(unsigned reasons) {
  if ((reasons & (kPeerAccess | kPoolAccess)) != 0) return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return (reasons & kPoolReadAccess) != 0 ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

// The books and the pages change under devices_mu_ together (it comes before
// a device's lock, as in before_fork), so that a grant and a revoke of one
// pair on two threads leave them agreeing.
void Runtime::access_granted(int accessor, int owner, AccessReason reason) {
  if (owner < 0 || owner >= kMaxDevices || accessor < 0 || accessor >= kMaxDevices || accessor == owner) return;
  std::lock_guard<std::mutex> books(devices_mu_);
  auto g = grant_of(accessor, owner);
  if (g == access_grants_.end()) g = access_grants_.insert(g, {accessor, owner, 0});
  if ((reason & kAnyPoolAccess) != 0) g->reasons &= ~kAnyPoolAccess;  // the pool's new grant replaces its last
  g->reasons |= reason;
  if (DeviceState* d = existing(owner)) {
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    d->upstream.set_accessor(accessor, access_flags(g->reasons));
  }
}

void Runtime::access_revoked(int accessor, int owner, unsigned reasons) {
  if (owner < 0 || owner >= kMaxDevices) return;
  std::lock_guard<std::mutex> books(devices_mu_);
  const auto g = grant_of(accessor, owner);
  if (g == access_grants_.end()) return;
  g->reasons &= ~reasons;
  const unsigned left = g->reasons;
  if (left == 0) access_grants_.erase(g);
  if (DeviceState* d = existing(owner)) {
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    if (left == 0) {
      d->upstream.remove_accessor(accessor);
    } else {
      d->upstream.set_accessor(accessor, access_flags(left));  // peer access gone, a read-only pool left: read only
    }
  }
}

bool Runtime::ipc_exportable(const void* ptr, const char* call, const char* refusal) {
  const auto p = reinterpret_cast<DevicePtr>(ptr);
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* d = existing(i);
    if (d == nullptr) continue;
    std::string why;
    {
      std::lock_guard<AdaptiveMutex> lock(d->mu);
      const Segment* seg = d->pool->segment_of(p);
      if (seg == nullptr) continue;
      const Block* b = seg->head;
      while (b->next != nullptr && b->next->addr <= p) b = b->next;
      if (seg->expandable) {
        why = "this block lies in an expandable segment, which CUDA IPC cannot share";
      } else if (b->addr != seg->base) {
        why = "this block starts " + std::to_string(b->addr - seg->base) +
              " bytes into a pooled segment, and a handle would make the other process map the segment's start";
      } else {
        return true;  // the handle names the segment, which starts where the block does
      }
    }
    message(config::LogLevel::Warn, std::string("gpupool: ") + call + ": " + why + "; refused with " + refusal +
                                        ". Run programs that share device memory over CUDA IPC with "
                                        "GPUPOOL_DISABLE=1");
    return false;
  }
  return true;  // not gpupool's memory: the runtime judges
}

}  // namespace gpupool::shim
