// Per-thread caches for stream-ordered reuse, so that threads allocating on
// their own streams do not queue on the device's lock.
//
// cudaFreeAsync(p, s) keeps p in the freeing thread's cache; that thread's
// next cudaMallocAsync on s of a size p fits takes it back with no device
// lock. Stream order makes that safe: the block is reused on the stream that
// freed it. The caches switch on only once a second thread makes
// stream-ordered calls (a single-threaded program is served exactly as
// before), hold at most kCapacity blocks and max_bytes() per thread
// (GPUPOOL_THREAD_CACHE_SIZE; 0 keeps them off), and go back to the pool for
// every report, before an allocation gives up, before their stream is
// destroyed, and when their thread ends. The runtime also sends them back
// whenever the pool has to take new memory from the device.
//
// A full cache does not simply push out its oldest block: a program cycling
// through more sizes than fit would then miss every time. It keeps the
// smaller blocks (more calls served per byte held) and lets a block go only
// when a smaller one comes, when a block of its stream up to a quarter larger
// comes (which serves its size), or when it has gone unused for kStaleOps
// calls. So a working set larger than the cache is served in part, and a new
// phase of the program replaces the old one's blocks. The last block that
// did not fit (of at most a quarter of the limit) stays as the spill until
// the thread next takes the device's lock for an allocation the cache could
// not serve, which gives it back there: such a working set then costs one
// lock per miss, not two.
//
// To free without the device lock, the shim keeps its own table of live
// stream-ordered allocations (address -> size, device) in stripes with their
// own locks. Plain cudaMalloc blocks are not in it, so none is ever kept: a
// kept block is one the pool counts as stream-ordered. A block waiting in a
// thread cache stays in it, marked parked, so that freeing it again is
// caught as the double free it is.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "pool/ptr_map.hpp"
#include "pool/size_rules.hpp"
#include "pool/types.hpp"
#include "shim/locks.hpp"

namespace gpupool::shim {

// A number for the calling thread, unique for the life of the process. Not a
// thread-local's address: a thread that ends frees its thread-local storage,
// and a thread that starts later can be given the same address. Read inline,
// with no initialization guard: constant-initialized, set at first use.
extern constinit thread_local std::uint64_t t_thread_number;
std::uint64_t new_thread_number();
inline std::uint64_t this_thread_number() {
  const std::uint64_t n = t_thread_number;
  return n != 0 ? n : new_thread_number();
}

// Plain data without initializers, so that arrays of them cost nothing to
// declare; value-initialize ({}) where zeros are wanted.
struct LiveBlock {
  std::size_t size;       // the block's size in the pool
  std::size_t requested;  // what the program asked for
  int device;
  bool parked;  // freed into a thread cache: the pool still counts it allocated
};

class LiveTable {
 public:
  void insert(DevicePtr ptr, const LiveBlock& block);
  // Removes and returns the entry for ptr; false when there is none.
  bool take(DevicePtr ptr, LiveBlock* out);
  // Returns the entry for ptr, leaving it; false when there is none.
  bool find(DevicePtr ptr, LiveBlock* out);
  // A free of ptr. A live entry is returned and either parked when it is
  // `park_device`'s block (it is going into a thread cache, and a second free
  // must be refused: the pool still counts the block allocated; out->parked
  // says so) or removed. A parked entry is left as it is. -1 parks nothing.
  enum class Freed { Unknown, Live, AlreadyParked };
  Freed release(DevicePtr ptr, int park_device, LiveBlock* out);
  // Drops every entry of the device (its memory is gone: cudaDeviceReset),
  // and returns them.
  std::vector<std::pair<DevicePtr, LiveBlock>> forget_device(int device);

 private:
  // Enough stripes that threads working on their own blocks seldom share
  // one: a stripe's lock line moving between cores costs more than the
  // lookup it guards. Each starts small (1024 x 16 slots, about 0.5 MiB).
  static constexpr int kStripeBits = 10;
  static constexpr std::size_t kSlotsPerStripe = 16;
  struct alignas(64) Stripe {
    SpinLock lock;
    AddressMap<LiveBlock> map{kSlotsPerStripe};
  };
  // Hashed: blocks at segment starts share their low address bits.
  Stripe& stripe(DevicePtr ptr) { return stripes_[((ptr >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - kStripeBits)]; }
  Stripe stripes_[1 << kStripeBits];
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
  // How much more the blocks lent again were asked for than the blocks they
  // were before: the pool counts the request it lent a block for until the
  // block comes back to it (see DeviceState::requested_returned_drift).
  std::int64_t requested_drift[kPoolKinds] = {};
  // Bytes of blocks kept in the cache (the pool counts them as allocated):
  // now, and the most at once in one thread. Summed over threads, the peaks
  // bound what was ever kept at once.
  std::int64_t kept_bytes = 0;
  std::int64_t kept_bytes_peak = 0;
  // Frees into the cache, and those that found it full; and the blocks that
  // went back to the pool for want of room (the block, or others to make
  // room), under the device's lock: at once, or as the spill at the thread's
  // next allocation the cache missed. A full cache need not send any back:
  // its spill may serve the thread's next request of that size.
  std::int64_t keeps = 0;
  std::int64_t keeps_full = 0;
  std::int64_t let_go = 0;
  void add(const CacheTraffic& o);
};

struct CachedBlock {
  DevicePtr ptr;
  LiveBlock block;
  StreamId stream;  // freed on, and reusable on, this stream
};

// Blocks sit in slots 0..63; a bit mask per size class (four per power of
// two) finds the blocks that can serve a size without scanning the rest.
struct ThreadCache {
  static constexpr int kCapacity = 64;  // one bit per slot
  static constexpr std::uint32_t kStaleOps = 4 * kCapacity;
  static constexpr int kSizeClasses = 256;
  static int size_class(std::size_t size) {
    if (size < 4) return static_cast<int>(size);
    const int e = 63 - __builtin_clzll(size);
    return e * 4 + static_cast<int>((size >> (e - 2)) & 3);
  }

  SpinLock lock;  // the owner takes it on every use; flushers from other threads
  std::uint64_t used = 0;                       // occupied slots
  std::uint64_t spill = 0;                      // the slot of the block kept past max_bytes(), if any
  std::uint64_t by_class[kSizeClasses] = {};    // slots by the size class of their block
  std::size_t sizes[kCapacity] = {};
  CachedBlock entries[kCapacity];
  std::uint32_t kept_at[kCapacity] = {};  // the thread's call count when kept
  int count = 0;
  std::size_t bytes = 0;
  std::uint32_t ops = 0;
  std::vector<CacheTraffic> traffic;  // by device

  CacheTraffic& traffic_of(int device) {
    if (traffic.size() <= static_cast<std::size_t>(device)) traffic.resize(static_cast<std::size_t>(device) + 1);
    return traffic[static_cast<std::size_t>(device)];
  }
  int add(const CachedBlock& block, std::uint32_t now) {
    const int i = __builtin_ctzll(~used);  // the caller checked count < kCapacity
    used |= std::uint64_t{1} << i;
    by_class[size_class(block.block.size)] |= std::uint64_t{1} << i;
    sizes[i] = block.block.size;
    entries[i] = block;
    kept_at[i] = now;
    ++count;
    bytes += block.block.size;
    CacheTraffic& t = traffic_of(block.block.device);
    t.kept_bytes += static_cast<std::int64_t>(block.block.size);
    t.kept_bytes_peak = std::max(t.kept_bytes_peak, t.kept_bytes);
    return i;
  }
  std::size_t spill_bytes() const { return spill == 0 ? 0 : sizes[__builtin_ctzll(spill)]; }
  void remove(int i) {
    used &= ~(std::uint64_t{1} << i);
    spill &= ~(std::uint64_t{1} << i);
    by_class[size_class(sizes[i])] &= ~(std::uint64_t{1} << i);
    --count;
    bytes -= sizes[i];
    traffic_of(entries[i].block.device).kept_bytes -= static_cast<std::int64_t>(sizes[i]);
  }
  template <typename F>
  static void for_each_bit(std::uint64_t mask, F&& f) {
    for (; mask != 0; mask &= mask - 1) f(__builtin_ctzll(mask));
  }
};

class StreamCaches {
 public:
  using GiveBack = void (*)(const CachedBlock&);
  explicit StreamCaches(GiveBack give_back) : give_back_(give_back) {}

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Most bytes one thread keeps, its spill aside; 0 keeps the caches off.
  // Set before any use.
  void set_max_bytes(std::size_t bytes) { max_bytes_ = bytes; }
  std::size_t max_bytes() const { return max_bytes_; }
  // Called on every stream-ordered call: the second distinct thread turns the
  // caches on, for good. Inline, the check is all it costs once they are on
  // (or can never be), and on the first caller's own calls, which are all of
  // a single-threaded program's while the caches may still come on.
  void note_caller() {
    if (!enabled() && !forked_ && max_bytes_ != 0 &&
        first_thread_.load(std::memory_order_relaxed) != this_thread_number()) {
      note_new_caller();
    }
  }

  // A cached block of this thread for `stream` on `device` with room for
  // `rounded` bytes and at most a quarter more, to serve `requested` bytes.
  bool take(StreamId stream, int device, std::size_t rounded, std::size_t requested, CachedBlock* out);
  // Every thread's cache traffic on `device`, ended threads' included.
  CacheTraffic traffic(int device);
  // Keeps a freed block; blocks pushed out to make room go back to the pool.
  void keep(const CachedBlock& block);
  // Takes this thread's spill, when it is `device`'s: the caller holds that
  // device's lock and gives it back to the pool there.
  bool take_spill(int device, CachedBlock* out);
  // Gives cached blocks back to the pool: every thread's, or those of one
  // stream. With `gone` (the runtime no longer knows the stream), as plain
  // frees: none may be keyed to its handle, which a new stream may get.
  void flush_all();
  void flush_stream(StreamId stream, bool gone = false);
  // cudaDeviceReset is taking the device's memory: its cached blocks go back
  // to the pool (which then holds as allocated only what the program does,
  // and forgets it all), and no live entry of it is kept. Returns the live
  // entries dropped (the blocks the program still held).
  std::vector<std::pair<DevicePtr, LiveBlock>> forget_device(int device);
  // Held across fork() so that the child never inherits them locked: the
  // flush lock before any pool's, the registry's after them (a report reads
  // the caches' traffic with a pool's lock held).
  std::mutex& flush_mutex() { return flush_mu_; }
  std::mutex& registry_mutex() { return registry_mu_; }
  // In a forked child (allocates nothing): the parent's caches, their
  // traffic and its live blocks belong to pools the child does not use. The
  // caches are set aside untouched (another thread may have held their
  // locks), the traffic forgotten, and caching stays off.
  void disable_after_fork();
  bool forked() const { return forked_; }

  LiveTable& live() { return live_; }
  // The calling thread is ending: its cache goes back to the pool, and its
  // later frees go there directly. Called by whichever of the thread's
  // exit hooks runs first (the runtime's ends its per-thread stream next,
  // which must find no block kept for it); the second call does nothing.
  void end_this_thread();

 private:
  void thread_exiting(ThreadCache* cache);
  // The calling thread's cache, made on first use; null once the thread has
  // handed it back (it is ending).
  ThreadCache* mine();
  // note_caller's look at the calling thread, made while the caches are off
  // and may still come on.
  void note_new_caller();
  template <typename Keep>
  void flush_if(Keep&& keep, bool as_plain_frees = false);

  static constexpr std::size_t kSpillFraction = 4;  // a spill is at most max_bytes() / 4

  GiveBack give_back_;
  std::size_t max_bytes_ = 256 * kMiB;
  std::atomic<bool> enabled_{false};
  bool forked_ = false;
  std::atomic<std::uint64_t> first_thread_{0};  // the first caller's this_thread_number()
  // Held from taking blocks out of caches until they are back in the pool, so
  // that a flush returns only once every block cached before it is there,
  // even those another thread's flush (or an ending thread) took first.
  std::mutex flush_mu_;
  std::mutex registry_mu_;
  std::vector<ThreadCache*> caches_;
  std::vector<ThreadCache*> parents_caches_;  // in a forked child: kept, never used
  std::vector<CacheTraffic> ended_;  // by device, of threads that have ended
  LiveTable live_;
};

}  // namespace gpupool::shim
