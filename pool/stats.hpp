// Statistics kept as PyTorch's memory_stats() keeps them, so that numbers and
// key names mean the same to users of both; plus what gpupool adds (cache hits,
// upstream time, histograms, per-stream counters, out-of-memory records).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/types.hpp"

namespace gpupool {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
};

// all / small_pool / large_pool, indexed like PyTorch's StatType.
enum StatIndex { kAll = 0, kSmallPool = 1, kLargePool = 2, kStatIndexes = 3 };
using StatArray = std::array<Stat, kStatIndexes>;

inline int stat_index(PoolKind kind) {
  return kind == PoolKind::Small ? kSmallPool : kLargePool;
}

// Adds to `all` and to the pool's own entry.
// Always inlined: a cache-hit pair makes ten of these, and GCC left them as
// calls (a tenth of the pair's instructions).
[[gnu::always_inline]] inline void increase(StatArray& stat, PoolKind kind, std::int64_t amount) {
  stat[kAll].increase(amount);
  stat[stat_index(kind)].increase(amount);
}
[[gnu::always_inline]] inline void decrease(StatArray& stat, PoolKind kind, std::int64_t amount) {
  stat[kAll].decrease(amount);
  stat[stat_index(kind)].decrease(amount);
}

// By `delta`, up or down.
[[gnu::always_inline]] inline void change(StatArray& stat, PoolKind kind, std::int64_t delta) {
  if (delta > 0) increase(stat, kind, delta);
  if (delta < 0) decrease(stat, kind, -delta);
}

// Power-of-two size buckets: bucket b holds sizes in [2^b, 2^(b+1)).
inline constexpr int kHistogramBuckets = 64;
struct SizeHistogram {
  std::array<std::uint64_t, kHistogramBuckets> count{};
  std::array<std::uint64_t, kHistogramBuckets> bytes{};
  void add(std::size_t size);
  bool empty() const;
};
int histogram_bucket(std::size_t size);

struct MemoryStats {
  StatArray allocation;
  StatArray segment;
  StatArray inactive_split;
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  Stat oversize_allocations;
  Stat oversize_segments;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  // gpupool's own
  std::int64_t cache_hits = 0;    // allocations served from cached blocks
  std::int64_t cache_misses = 0;  // allocations that needed a new segment
  std::int64_t num_device_alloc_failures = 0;
  std::int64_t num_device_free_failures = 0;  // segment frees the runtime refused: still reserved
  std::int64_t num_gc_releases = 0;  // segments returned by garbage collection
  std::int64_t num_retries_served = 0;  // retries (num_alloc_retries) whose allocation then succeeded
  std::int64_t num_page_maps = 0;    // expandable segments: map calls upstream
  std::int64_t num_page_unmaps = 0;
  std::int64_t num_page_unmap_failures = 0;  // unmaps the driver refused in part or whole: still reserved
  std::uint64_t upstream_alloc_ns = 0;  // time inside upstream allocate/release
  std::uint64_t upstream_free_ns = 0;
  std::uint64_t pool_ns_sampled = 0;   // time inside the pool, 1 op in kTimingSample
  std::uint64_t pool_ops_sampled = 0;
  std::uint64_t pool_ops = 0;          // allocations + frees served by the pool
  // Bytes of blocks allocated by stream-ordered calls (cudaMallocAsync): what
  // the runtime's default memory pool counts in use, which plain cudaMalloc
  // memory is not (cudaMemPoolAttrUsedMemCurrent).
  Stat stream_ordered_bytes;
  // The most bytes so allocated, and reserved (all pools), since a program
  // reset its memory pool's high watermarks (cudaMemPoolAttrUsedMemHigh,
  // ...); at most the peaks, which no reset touches. Only these two are ever
  // reset, so they are not a field of every Stat.
  std::int64_t stream_ordered_high = 0;
  std::int64_t reserved_high = 0;
};

// After an increase of `stat`: its high watermark follows.
inline void raise_high(std::int64_t& high, const StatArray& stat) {
  if (stat[kAll].current > high) high = stat[kAll].current;
}

// The device's memory is gone (a device reset): every current figure drops to
// zero as if freed, so that allocated - freed == current still holds; peaks
// and totals stay.
void end_current_figures(MemoryStats& s);

// The statistics with PyTorch's names, in one list: array(name, StatArray&)
// and single(name, Stat&) for each (MemoryStats may be const).
// PyTorch's "active" blocks are its allocated ones and those freed while
// uses recorded on other streams (record_stream) are pending. gpupool has no
// record_stream: a freed block is free in its stream's order at once, so its
// active figures are its allocated ones, kept once. A visitor that changes
// the figures meets those two arrays twice (end_current_figures may: its
// second pass finds nothing current).
template <typename Stats, typename Array, typename Single>
void for_each_stat(Stats& s, Array&& array, Single&& single) {
  array("allocation", s.allocation);
  array("segment", s.segment);
  array("active", s.allocation);
  array("inactive_split", s.inactive_split);
  array("allocated_bytes", s.allocated_bytes);
  array("reserved_bytes", s.reserved_bytes);
  array("active_bytes", s.allocated_bytes);
  array("inactive_split_bytes", s.inactive_split_bytes);
  array("requested_bytes", s.requested_bytes);
  single("oversize_allocations", s.oversize_allocations);
  single("oversize_segments", s.oversize_segments);
}

// Calls f(name, value) for every statistic under PyTorch's flat key names
// ("allocated_bytes.all.peak", "num_device_alloc", ...).
template <typename F>
void for_each_flat_stat(const MemoryStats& s, F&& f) {
  static constexpr const char* kIndexNames[kStatIndexes] = {"all", "small_pool", "large_pool"};
  auto single = [&](const std::string& prefix, const Stat& st) {
    f(prefix + "current", st.current);
    f(prefix + "peak", st.peak);
    f(prefix + "allocated", st.allocated);
    f(prefix + "freed", st.freed);
  };
  for_each_stat(
      s,
      [&](const char* name, const StatArray& a) {
        for (int i = 0; i < kStatIndexes; ++i) single(std::string(name) + "." + kIndexNames[i] + ".", a[i]);
      },
      [&](const char* name, const Stat& st) { single(std::string(name) + ".", st); });
  f(std::string("num_alloc_retries"), s.num_alloc_retries);
  f(std::string("num_ooms"), s.num_ooms);
  f(std::string("num_device_alloc"), s.num_device_alloc);
  f(std::string("num_device_free"), s.num_device_free);
}

// What the pool's free space looks like (computed on demand).
struct Fragmentation {
  std::size_t free_bytes = 0;          // free bytes inside reserved segments
  std::size_t largest_free_block = 0;  // the largest single free block
  std::size_t free_blocks = 0;
  double external = 0.0;               // 1 - largest / free; 0 when nothing is free
  std::size_t rounding_waste = 0;      // allocated - requested, now
  double peak_reserved_to_peak_requested = 0.0;
};

// Device resets (cudaDeviceReset), and the allocations the program still held
// at them: memory the reset freed that the program never did.
struct ResetLosses {
  struct Tally {
    std::uint64_t blocks = 0;
    std::uint64_t bytes = 0;
  };
  std::uint64_t resets = 0;
  std::int64_t segments = 0;  // num_device_alloc's segments the resets freed, not the pool
  Tally lost;
  std::unordered_map<std::uint32_t, Tally> by_site;  // by allocation call site, when recorded
};

// Per-stream ordering counters, for the report.
struct StreamCounters {
  std::uint64_t same_stream_reuses = 0;   // cached block reused on the stream that freed it
  std::uint64_t cross_stream_reuses = 0;  // cached block taken from another stream
  std::uint64_t event_waits = 0;          // waits so this stream could take another stream's block
  std::uint64_t destroyed_stream_waits = 0;  // of those, for a destroyed stream's last work
  std::uint64_t barrier_waits = 0;        // waits for device barriers (plain cudaFree then cudaMalloc)
  std::uint64_t idle_queries = 0;         // cudaStreamQuery calls of device barriers, to find it idle
  std::uint64_t caught_up_barriers = 0;   // device barriers that found the device caught up: no waits
  std::uint64_t searched_reuses = 0;      // plain reuses of a larger block's covered memory: a barrier saved
  std::uint64_t fences_recorded = 0;      // events recorded on this stream
  std::uint64_t host_syncs = 0;           // host waits involving this stream
  // Streams destroyed where gpupool could not see it (the driver's own call,
  // a library not taken over), found when the runtime refused a call naming
  // it or gave its handle to a new stream: 1 on such a stream's row.
  std::uint64_t destroyed_unseen = 0;

  StreamCounters& operator+=(const StreamCounters& o) {
    same_stream_reuses += o.same_stream_reuses;
    cross_stream_reuses += o.cross_stream_reuses;
    event_waits += o.event_waits;
    destroyed_stream_waits += o.destroyed_stream_waits;
    barrier_waits += o.barrier_waits;
    idle_queries += o.idle_queries;
    caught_up_barriers += o.caught_up_barriers;
    searched_reuses += o.searched_reuses;
    fences_recorded += o.fences_recorded;
    host_syncs += o.host_syncs;
    destroyed_unseen += o.destroyed_unseen;
    return *this;
  }
};

struct StreamReport {
  StreamId id = 0;
  StreamKind kind = StreamKind::Blocking;
  bool alive = true;
  // The streams the row stands for: 1, but for the row of every gone stream
  // past the first ones reported one by one (id 0).
  std::uint64_t streams = 1;
  std::size_t cached_blocks = 0;
  std::size_t cached_bytes = 0;
  StreamCounters counters;
};

// The pool's state when an allocation failed for good.
struct OomRecord {
  std::uint64_t time_ns = 0;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t segment_asked = 0;  // 0 when the request was refused without asking
  PoolKind kind = PoolKind::Large;
  StreamId stream = kAnyStream;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::size_t free_in_pool = 0;        // after releasing what could be released
  std::size_t largest_free_block = 0;
  // The largest free block the size rules let serve this request: there, but
  // not reusable yet (the work queued before its free was not known done).
  std::size_t largest_fitting_block = 0;
  bool during_capture = false;         // a stream capture was under way
  bool cache_kept_for_capture = false;  // a capture, on any device, kept the cache from going back
  std::size_t largest_free_before_release = 0;
  std::size_t free_before_release = 0;
  bool limit_reached = false;          // refused by memory_limit, not by the device
  std::size_t memory_limit = kUnlimited;
  std::size_t max_split_size = kUnlimited;
  std::size_t device_free = 0;         // from upstream, 0 when unknown
  std::size_t device_total = 0;
};

// Allocated, reserved and requested bytes over the run, in bounded memory.
struct TimelineSample {
  std::uint64_t time_ns = 0;
  std::uint64_t op = 0;
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
  std::int64_t requested = 0;
};

}  // namespace gpupool
