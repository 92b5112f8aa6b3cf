#include "shim/thread_cache.hpp"

#include <algorithm>
#include <new>

namespace gpupool::shim {

constinit thread_local std::uint64_t t_thread_number = 0;

std::uint64_t new_thread_number() {
  static std::atomic<std::uint64_t> next{1};
  t_thread_number = next.fetch_add(1, std::memory_order_relaxed);
  return t_thread_number;
}

namespace {

// This thread's cache. Trivially destructible and constant-initialized, so
// a use is one thread-local lookup (no guard, no wrapper) and it stays valid
// while the thread's other thread-locals are destroyed.
struct CacheSlot {
  StreamCaches* owner;
  ThreadCache* cache;
  bool ended;  // the thread has handed its cache back: it is ending
};
thread_local CacheSlot t_slot{nullptr, nullptr, false};

// Hands the thread's cache back when the thread ends. A thread_local the
// program made before its first CUDA call is destroyed after this one, and
// may still free blocks: those go to the pool (t_slot.ended), not into the
// cache this deleted.
struct CacheHolder {
  bool armed = false;  // set on the cache's creation, which registers the destructor
  ~CacheHolder() {
    if (t_slot.owner != nullptr) t_slot.owner->end_this_thread();
  }
};
thread_local CacheHolder t_holder;

}  // namespace

void CacheTraffic::add(const CacheTraffic& o) {
  for (int k = 0; k < kPoolKinds; ++k) {
    allocations[k] += o.allocations[k];
    frees[k] += o.frees[k];
    allocated_bytes[k] += o.allocated_bytes[k];
    freed_bytes[k] += o.freed_bytes[k];
    requested_bytes[k] += o.requested_bytes[k];
    requested_freed[k] += o.requested_freed[k];
    requested_drift[k] += o.requested_drift[k];
  }
  kept_bytes += o.kept_bytes;
  kept_bytes_peak += o.kept_bytes_peak;
  keeps += o.keeps;
  keeps_full += o.keeps_full;
  let_go += o.let_go;
}

void LiveTable::insert(DevicePtr ptr, const LiveBlock& block) {
  Stripe& s = stripe(ptr);
  std::lock_guard<SpinLock> lock(s.lock);
  s.map.insert(ptr, block);
}

bool LiveTable::take(DevicePtr ptr, LiveBlock* out) {
  Stripe& s = stripe(ptr);
  std::lock_guard<SpinLock> lock(s.lock);
  const LiveBlock* b = s.map.find(ptr);
  if (b == nullptr) return false;
  *out = *b;
  s.map.erase(ptr);
  return true;
}

bool LiveTable::find(DevicePtr ptr, LiveBlock* out) {
  Stripe& s = stripe(ptr);
  std::lock_guard<SpinLock> lock(s.lock);
  const LiveBlock* b = s.map.find(ptr);
  if (b == nullptr) return false;
  *out = *b;
  return true;
}

LiveTable::Freed LiveTable::release(DevicePtr ptr, int park_device, LiveBlock* out) {
  Stripe& s = stripe(ptr);
  std::lock_guard<SpinLock> lock(s.lock);
  LiveBlock* b = s.map.find(ptr);
  if (b == nullptr) return Freed::Unknown;
  if (b->parked) return Freed::AlreadyParked;
  *out = *b;
  if (b->device == park_device) {
    b->parked = out->parked = true;
  } else {
    s.map.erase(ptr);
  }
  return Freed::Live;
}

std::vector<std::pair<DevicePtr, LiveBlock>> LiveTable::forget_device(int device) {
  std::vector<std::pair<DevicePtr, LiveBlock>> gone;
  for (Stripe& s : stripes_) {
    std::lock_guard<SpinLock> lock(s.lock);
    const std::size_t first = gone.size();
    s.map.for_each([&](DevicePtr ptr, const LiveBlock& b) {
      if (b.device == device) gone.emplace_back(ptr, b);
    });
    for (std::size_t i = first; i < gone.size(); ++i) s.map.erase(gone[i].first);
  }
  return gone;
}

void StreamCaches::note_new_caller() {
  const std::uint64_t me = this_thread_number();
  // A read first: a single-threaded program makes every call here, and an
  // atomic exchange on each cost it a tenth of a stream-ordered pair.
  const std::uint64_t first = first_thread_.load(std::memory_order_relaxed);
  if (first == me) return;
  std::uint64_t expected = 0;
  if (first == 0 && (first_thread_.compare_exchange_strong(expected, me) || expected == me)) return;
  enabled_.store(true, std::memory_order_relaxed);
}

ThreadCache* StreamCaches::mine() {
  CacheSlot& slot = t_slot;  // one thread-local lookup, not one per use
  if (slot.cache != nullptr && slot.owner == this) return slot.cache;
  if (slot.ended) return nullptr;
  auto* cache = new ThreadCache();
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    caches_.push_back(cache);
  }
  slot.owner = this;
  slot.cache = cache;
  t_holder.armed = true;
  return cache;
}

bool StreamCaches::take(StreamId stream, int device, std::size_t rounded, std::size_t requested,
                        CachedBlock* out) {
  ThreadCache* mine_or_none = mine();
  if (mine_or_none == nullptr) return false;
  ThreadCache& c = *mine_or_none;
  std::lock_guard<SpinLock> lock(c.lock);
  ++c.ops;
  // The closest fit, among the blocks of the size classes the request's
  // range (its size to a quarter more) spans.
  const std::size_t most = rounded + rounded / 4;
  int best = -1;
  for (int k = ThreadCache::size_class(rounded); k <= ThreadCache::size_class(most); ++k) {
    ThreadCache::for_each_bit(c.by_class[k], [&](int i) {
      const std::size_t size = c.sizes[i];
      if (size < rounded || size > most || (best >= 0 && size >= c.sizes[best])) return;
      if (c.entries[i].stream == stream && c.entries[i].block.device == device) best = i;
    });
  }
  if (best < 0) return false;
  *out = c.entries[best];
  c.remove(best);
  // Counted when a cached block is taken again: its free and this allocation.
  // A block that waits in a cache until a flush is freed by the pool instead.
  CacheTraffic& t = c.traffic_of(device);
  const int k = static_cast<int>(pool_kind(out->block.size));
  const auto bytes = static_cast<std::int64_t>(out->block.size);
  ++t.allocations[k];
  ++t.frees[k];
  t.allocated_bytes[k] += bytes;
  t.freed_bytes[k] += bytes;
  t.requested_bytes[k] += static_cast<std::int64_t>(requested);
  t.requested_freed[k] += static_cast<std::int64_t>(out->block.requested);
  t.requested_drift[k] += static_cast<std::int64_t>(requested) - static_cast<std::int64_t>(out->block.requested);
  return true;
}

CacheTraffic StreamCaches::traffic(int device) {
  const auto d = static_cast<std::size_t>(device);
  CacheTraffic total;
  std::lock_guard<std::mutex> registry(registry_mu_);
  if (d < ended_.size()) total.add(ended_[d]);
  for (ThreadCache* c : caches_) {
    std::lock_guard<SpinLock> lock(c->lock);
    if (d < c->traffic.size()) total.add(c->traffic[d]);
  }
  return total;
}

void StreamCaches::keep(const CachedBlock& block) {
  ThreadCache* mine_or_none = mine();
  if (mine_or_none == nullptr) {  // the thread is ending
    give_back_(block);
    return;
  }
  ThreadCache& c = *mine_or_none;
  CachedBlock out[ThreadCache::kCapacity + 1];
  int n = 0;
  {
    std::lock_guard<SpinLock> lock(c.lock);
    const std::uint32_t now = ++c.ops;
    const std::size_t size = block.block.size;
    auto full = [&] { return c.count == ThreadCache::kCapacity || c.bytes - c.spill_bytes() + size > max_bytes_; };
    CacheTraffic& t = c.traffic_of(block.block.device);
    ++t.keeps;
    t.keeps_full += full() ? 1 : 0;
    // Blocks unused for kStaleOps calls go first, the oldest first. Then a
    // block this one can stand in for, when that alone makes room: one of
    // its stream and device, smaller by at most a quarter, whose size this
    // one serves (see take), the largest such. Then larger blocks make way
    // for a smaller one, the largest first.
    // Why the middle step: a thread cycling through sizes a little apart
    // kept near twins (44 and 48 MiB) and let its largest block go instead,
    // whose size then missed on every cycle. The traces' 60 sizes up to 64
    // MiB (519 MiB) are all served by blocks that take 224 MiB.
    while (size <= max_bytes_ && full()) {
      int stale = -1;
      int stand_in_for = -1;
      int larger = -1;
      std::uint32_t oldest = ThreadCache::kStaleOps;
      std::size_t largest = size;
      const std::size_t held = c.bytes - c.spill_bytes();
      const std::size_t bytes_needed = held + size > max_bytes_ ? held + size - max_bytes_ : 0;
      ThreadCache::for_each_bit(c.used & ~c.spill, [&](int i) {
        const std::uint32_t age = now - c.kept_at[i];
        stale = age > oldest ? i : stale;
        oldest = age > oldest ? age : oldest;
        const std::size_t s = c.sizes[i];
        if (s < size && size <= s + s / 4 && s >= bytes_needed &&
            c.entries[i].stream == block.stream && c.entries[i].block.device == block.block.device &&
            (stand_in_for < 0 || s > c.sizes[stand_in_for])) {
          stand_in_for = i;
        }
        larger = s > largest ? i : larger;
        largest = s > largest ? s : largest;
      });
      const int victim = stale >= 0 ? stale : stand_in_for >= 0 ? stand_in_for : larger;
      if (victim < 0) break;
      out[n++] = c.entries[victim];
      c.remove(victim);
    }
    if (!full()) {
      c.add(block, now);
    } else if (c.count < ThreadCache::kCapacity && size <= max_bytes_ / kSpillFraction) {
      // Past the limit, kept as the spill: the thread's next allocation that
      // the cache cannot serve gives it back under the device lock it takes
      // anyway (one lock instead of two per miss, for a working set larger
      // than the cache). A spill already there goes back now.
      if (c.spill != 0) {
        const int old = __builtin_ctzll(c.spill);
        out[n++] = c.entries[old];
        c.remove(old);
      }
      c.spill = std::uint64_t{1} << c.add(block, now);
    } else {
      out[n++] = block;  // the cache keeps what it holds; this one goes to the pool
    }
    for (int i = 0; i < n; ++i) ++c.traffic_of(out[i].block.device).let_go;
  }
  for (int i = 0; i < n; ++i) give_back_(out[i]);
}

bool StreamCaches::take_spill(int device, CachedBlock* out) {
  const CacheSlot& slot = t_slot;
  if (slot.cache == nullptr || slot.owner != this) return false;
  ThreadCache& c = *slot.cache;
  std::lock_guard<SpinLock> lock(c.lock);
  if (c.spill == 0) return false;
  const int i = __builtin_ctzll(c.spill);
  if (c.entries[i].block.device != device) return false;
  *out = c.entries[i];
  c.remove(i);
  ++c.traffic_of(device).let_go;
  return true;
}

template <typename Keep>
void StreamCaches::flush_if(Keep&& keep, bool as_plain_frees) {
  std::lock_guard<std::mutex> flushing(flush_mu_);
  std::vector<CachedBlock> out;
  {
    std::lock_guard<std::mutex> registry(registry_mu_);
    for (ThreadCache* c : caches_) {
      std::lock_guard<SpinLock> lock(c->lock);
      ThreadCache::for_each_bit(c->used, [&](int i) {
        if (keep(c->entries[i])) return;
        out.push_back(c->entries[i]);
        c->remove(i);
      });
    }
  }
  for (CachedBlock& b : out) {
    if (as_plain_frees) b.stream = kAnyStream;
    give_back_(b);
  }
}

void StreamCaches::flush_all() {
  flush_if([](const CachedBlock&) { return false; });
}

void StreamCaches::flush_stream(StreamId stream, bool gone) {
  flush_if([stream](const CachedBlock& b) { return b.stream != stream; }, gone);
}

std::vector<std::pair<DevicePtr, LiveBlock>> StreamCaches::forget_device(int device) {
  if (forked_) return {};  // the live table is the parent's, and the child caches nothing
  flush_if([device](const CachedBlock& b) { return b.block.device != device; });
  return live_.forget_device(device);
}

void StreamCaches::end_this_thread() {
  CacheSlot& slot = t_slot;
  if (slot.owner == this && slot.cache != nullptr) thread_exiting(slot.cache);
  slot.cache = nullptr;
  slot.ended = true;
}

void StreamCaches::thread_exiting(ThreadCache* cache) {
  std::lock_guard<std::mutex> flushing(flush_mu_);
  {
    std::lock_guard<std::mutex> registry(registry_mu_);
    caches_.erase(std::remove(caches_.begin(), caches_.end(), cache), caches_.end());
    // Nothing may throw out of a thread's exit: with no room for its figures,
    // the report leaves them out.
    try {
      if (ended_.size() < cache->traffic.size()) ended_.resize(cache->traffic.size());
      for (std::size_t d = 0; d < cache->traffic.size(); ++d) {
        cache->traffic[d].kept_bytes = 0;  // all given back below
        ended_[d].add(cache->traffic[d]);
      }
    } catch (const std::bad_alloc&) {
    }
  }
  // The thread is ending: nothing else can use this cache any more.
  ThreadCache::for_each_bit(cache->used, [&](int i) { give_back_(cache->entries[i]); });
  delete cache;
}

void StreamCaches::disable_after_fork() {
  forked_ = true;
  enabled_.store(false);
  t_slot.cache = nullptr;  // the parent thread's cache stays with the parent's pools
  // A forked process makes no cache, so a grandchild finds none here.
  if (parents_caches_.empty()) parents_caches_.swap(caches_);
  for (CacheTraffic& t : ended_) t = CacheTraffic{};
}

}  // namespace gpupool::shim
