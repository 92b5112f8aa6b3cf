// Per-thread caches for stream-ordered reuse, so that threads allocating on
// their own streams do not queue on the device's lock.
//
// cudaFreeAsync(p, s) keeps p in the freeing thread's cache; that thread's
// next cudaMallocAsync on s of a size p fits takes it back with no device
// lock. Stream order makes that safe: the block is reused on the stream that
// freed it. The caches switch on only once a second thread makes
// stream-ordered calls (a single-threaded program is served exactly as
// before), hold at most kCapacity blocks and kMaxBytes per thread, and go
// back to the pool for every report, before an allocation gives up, before
// their stream is destroyed, and when their thread ends.
//
// To free without the device lock, the shim keeps its own table of live
// allocations (address -> size, device) in stripes with their own locks.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "pool/ptr_map.hpp"
#include "pool/size_rules.hpp"
#include "pool/types.hpp"
#include "shim/locks.hpp"

namespace gpupool::shim {

struct LiveBlock {
  std::size_t size = 0;       // the block's size in the pool
  std::size_t requested = 0;  // what the program asked for
  int device = 0;
};

class LiveTable {
 public:
  void insert(DevicePtr ptr, const LiveBlock& block);
  // Removes and returns the entry for ptr; false when there is none.
  bool take(DevicePtr ptr, LiveBlock* out);
  void clear();

 private:
  static constexpr int kStripes = 64;
  struct alignas(64) Stripe {
    SpinLock lock;
    AddressMap<LiveBlock> map{256};
  };
  Stripe& stripe(DevicePtr ptr) { return stripes_[(ptr >> 9) % kStripes]; }
  Stripe stripes_[kStripes];
};

// Allocations and frees a thread's cache served, which the pool does not see
// (it holds their blocks as allocated): added to its totals in reports.
// Kept per thread so that counting them costs no shared cache line.
struct CacheTraffic {
  std::int64_t allocations[kPoolKinds] = {};
  std::int64_t frees[kPoolKinds] = {};
  std::int64_t allocated_bytes[kPoolKinds] = {};
  std::int64_t freed_bytes[kPoolKinds] = {};
  std::int64_t requested_bytes[kPoolKinds] = {};
  std::int64_t requested_freed[kPoolKinds] = {};
  void add(const CacheTraffic& o);
};

struct CachedBlock {
  DevicePtr ptr = 0;
  LiveBlock block;
  StreamId stream = 0;  // freed on, and reusable on, this stream
};

struct ThreadCache {
  static constexpr int kCapacity = 8;
  static constexpr std::size_t kMaxBytes = 64 * kMiB;
  SpinLock lock;  // the owner takes it on every use; flushers from other threads
  CachedBlock entries[kCapacity];
  int count = 0;
  std::size_t bytes = 0;
  std::vector<CacheTraffic> traffic;  // by device
};

class StreamCaches {
 public:
  using GiveBack = void (*)(const CachedBlock&);
  explicit StreamCaches(GiveBack give_back) : give_back_(give_back) {}

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Called on every stream-ordered call: the second distinct thread turns the
  // caches on, for good.
  void note_caller();

  // A cached block of this thread for `stream` on `device` with room for
  // `rounded` bytes and at most a quarter more, to serve `requested` bytes.
  bool take(StreamId stream, int device, std::size_t rounded, std::size_t requested, CachedBlock* out);
  // Every thread's cache traffic on `device`, ended threads' included.
  CacheTraffic traffic(int device);
  // Keeps a freed block; blocks pushed out to make room go back to the pool.
  void keep(const CachedBlock& block);
  // Gives cached blocks back to the pool: every thread's, or those of one stream.
  void flush_all();
  void flush_stream(StreamId stream);
  // In a forked child: the parent's caches belong to pools the child does not
  // use; they are left alone (their locks may be held) and caching stays off.
  void disable_after_fork();

  LiveTable& live() { return live_; }
  void thread_exiting(ThreadCache* cache);  // the owner's thread ends

 private:
  ThreadCache& mine();
  template <typename Keep>
  void flush_if(Keep&& keep);

  GiveBack give_back_;
  std::atomic<bool> enabled_{false};
  bool forked_ = false;
  std::atomic<const void*> first_thread_{nullptr};
  std::mutex registry_mu_;
  std::vector<ThreadCache*> caches_;
  std::vector<CacheTraffic> ended_;  // by device, of threads that have ended
  LiveTable live_;
};

}  // namespace gpupool::shim
