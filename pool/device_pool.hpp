// The caching allocator for one device: best-fit block pools with splitting and
// coalescing, stream-aware reuse (see ordering.hpp), retry on upstream failure,
// garbage collection, and statistics. Not thread-safe: the caller locks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pool/block_pool.hpp"
#include "pool/node_recycler.hpp"
#include "pool/options.hpp"
#include "pool/ordering.hpp"
#include "pool/ptr_map.hpp"
#include "pool/stats.hpp"
#include "pool/timeline.hpp"
#include "pool/upstream.hpp"

namespace gpupool {

struct Allocation {
  DevicePtr ptr = 0;
  bool ok = false;
  bool device_error = false;  // failed for a reason other than memory (Upstream::failed_for_memory)
};

enum class FreeResult {
  Freed,
  NotOwned,      // not inside any segment of this pool: someone else's pointer
  NotAllocated,  // inside a segment but not a live allocation: double or interior free
};

class DevicePool {
 public:
  // `device_capacity` is what garbage_collection_threshold is a fraction of,
  // when no memory_limit is set (the device's total memory).
  DevicePool(Upstream& upstream, const PoolOptions& options, std::size_t device_capacity,
             Clock* clock = nullptr);
  // Frees bookkeeping only: never calls upstream (at exit the device may be gone).
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // consumer: the stream the program named, or kAnyStream (plain cudaMalloc).
  // size 0 succeeds with a null pointer. `site` tags the block (0: none).
  // last_try false: the caller will try again once it has returned blocks it
  // holds elsewhere, so a failure is not recorded as an out-of-memory yet.
  Allocation allocate(std::size_t size, StreamId consumer, std::uint32_t site = 0, bool last_try = true);
  // site: the stream of a stream-ordered free, or kAnyStream (plain cudaFree).
  FreeResult deallocate(DevicePtr ptr, StreamId site);
  // Returns every entirely free segment upstream; returns the bytes released.
  std::size_t release_cached();
  // Restarts a high watermark of the bytes allocated or reserved from what is
  // held now: a program reset its memory pool's (cudaMemPoolSetAttribute).
  enum class Watermark { StreamOrdered, Reserved };
  void reset_high(Watermark which) {
    if (which == Watermark::StreamOrdered) {
      stats_.stream_ordered_high = stats_.stream_ordered_bytes.current;
    } else {
      stats_.reserved_high = stats_.reserved_bytes[kAll].current;
    }
  }
  // On a fresh pool replacing `before` after a device reset freed all its
  // memory (device_reset.cpp): its statistics, histograms, out-of-memory
  // records, timeline and streams' counters go on here, current figures at
  // zero, and the blocks it still had allocated count as lost to the reset.
  // Calls no upstream function. Call before any other use but stream_created.
  void continue_history(const DevicePool& before);
  std::size_t device_capacity() const { return device_capacity_; }

  const Block* find_allocated(DevicePtr ptr) const { return allocated_.find(ptr); }
  bool owns(DevicePtr ptr) const { return segment_of(ptr) != nullptr; }
  const Segment* segment_of(DevicePtr ptr) const;  // the segment holding ptr, or null

  // False when the new stream could not be ordered after the latest barrier
  // (see StreamOrdering::stream_created). A handle the pool knows names a new
  // stream: the old one's cached blocks then need the device barrier, and its
  // unfenced work a device wait.
  bool stream_created(StreamId id, StreamKind kind);
  void stream_destroying(StreamId id) {
    stream_destroy_begin(id);
    stream_destroy_end(id, true);
  }
  // In two steps, around a destroy the runtime may refuse (see
  // StreamOrdering::stream_destroy_begin): its cached blocks are re-keyed at
  // the first either way.
  void stream_destroy_begin(StreamId id);
  void stream_destroy_end(StreamId id, bool destroyed) { ordering_.stream_destroy_end(id, destroyed); }
  // The thread of this per-thread default stream has ended (see
  // StreamOrdering::thread_stream_ended). Never throws.
  void thread_stream_ended(StreamId id, bool again = false) { ordering_.thread_stream_ended(id, again); }
  // Streams the runtime said it no longer knows (destroyed where gpupool
  // could not see it), whose books the pool has closed since the last call:
  // a stream named with one of these handles later is a new one, for the
  // caller to introduce with stream_created. (The caller's own books of
  // these streams go too: blocks it keeps for them, the handle's device.)
  bool streams_forgotten() const { return !forgotten_streams_.empty(); }
  std::vector<StreamId> take_forgotten_streams() { return std::exchange(forgotten_streams_, {}); }
  void capture_began(StreamId id) { ordering_.capture_began(id); }
  void capture_ended(StreamId id) { ordering_.capture_ended(id); }
  bool is_capturing(StreamId id) const { return ordering_.is_capturing(id); }
  bool capture_active() const { return ordering_.capture_active(); }

  // --- observation (pool_inspect.cpp) ---
  const MemoryStats& stats() const { return stats_; }
  const PoolOptions& options() const { return options_; }
  Fragmentation fragmentation() const;
  // The address of some device memory the pool holds (a segment's, a mapped
  // page's), or 0 if it holds none: whether the device still has it tells
  // whether a reset the runtime answered with an error took place.
  DevicePtr held_address() const;
  // When reserved memory peaked (within 1/64 of the peak: see allocate).
  const Fragmentation& fragmentation_at_peak() const { return fragmentation_at_peak_; }
  std::vector<StreamReport> streams() const;
  const SizeHistogram& request_histogram() const { return request_histogram_; }
  SizeHistogram free_block_histogram() const;
  const SizeHistogram& free_blocks_at_peak() const { return free_blocks_at_peak_; }
  const std::vector<OomRecord>& ooms() const { return ooms_; }
  const Timeline& timeline() const { return timeline_; }
  std::size_t quarantined_bytes() const { return quarantined_bytes_; }
  const ResetLosses& reset_losses() const { return reset_losses_; }

  template <typename F>
  void for_each_allocated(F&& f) const {
    allocated_.for_each([&](DevicePtr, Block* b) { f(*b); });
  }

  // Checks every invariant; on failure describes the first broken one.
  bool validate(std::string* error = nullptr) const;

 private:
  BlockPool& pool_of(PoolKind kind) { return pools_[static_cast<int>(kind)]; }
  const BlockPool& pool_of(PoolKind kind) const { return pools_[static_cast<int>(kind)]; }
  // Makes the next `n` new_block calls allocate nothing (see NodeRecycler).
  void reserve_blocks(std::size_t n) { block_nodes_.reserve(n, sizeof(Block)); }
  // The most blocks one allocation makes: a new expandable segment's, the
  // split of the pages it maps, and carve's remainder.
  static constexpr std::size_t kMostNewBlocks = 3;
  Block* new_block();
  // A free block with `like`'s segment, state and history. Copied, not
  // built fresh: GCC zeroes a fresh Block with `rep stos`, whose start-up
  // cost was 16% of a plain pair (split_off makes one or two a pair).
  Block* new_block(const Block& like) {
    Block* b = new (block_nodes_.take(sizeof(Block))) Block(like);  // links not copied: in no pool
    b->requested = 0;
    b->site = 0;
    b->allocated = false;
    b->quarantined = false;
    return b;
  }
  void delete_block(Block* b);

  // The work of allocate() and deallocate(), inlined there: their calls and
  // returns were a tenth of the pool's share of a cache-hit pair.
  [[gnu::always_inline]] inline Allocation allocate_unsampled(std::size_t size, StreamId consumer,
                                                                std::uint32_t site, bool last_try);
  [[gnu::always_inline]] inline FreeResult deallocate_unsampled(DevicePtr ptr, StreamId site);
  bool fits_size_rules(const Block* b, std::size_t rounded) const;
  // Whether b can serve `consumer` now, recording the ordering it needs.
  // Without allow_wait, another stream's block only if its use is complete.
  bool ready_for(Block* b, StreamId consumer, bool allow_wait);
  // A free block chosen to serve a request. Still listed: it is in its free
  // list yet, and carve() gives its place there to the remainder.
  struct Taken {
    Block* block = nullptr;
    bool listed = false;
  };
  Taken take_cached(PoolKind kind, std::size_t rounded, StreamId consumer, bool allow_wait);
  // Plain reuse without a new barrier (plain_reuse.cpp). Which bytes of a
  // free block a barrier already covers: those outside [hot_begin, hot_end).
  struct Cover {
    DevicePtr hot_begin = 0;  // begin == end: no hot bytes
    DevicePtr hot_end = 0;
    std::uint64_t cold_epoch = 0;  // the latest free of a byte outside the hot range
    std::uint64_t epoch = 0;       // the block's newest free (device_epoch)
  };
  [[gnu::always_inline]] inline Cover cover_of(const Block* b) const;
  // The cover of `merged` (the lower block, absorbing `high`), from the two
  // blocks' covers before the merge.
  // (Both inlined: their calls were 2% of a pair's instructions.)
  [[gnu::always_inline]] static inline void join_covers(Block* merged, const Block* high_block, const Cover& low,
                                                        const Cover& high);
  // After a split: the hot range kept within the block.
  [[gnu::always_inline]] static inline void clip_hot(Block* b);
  // From a free block of the plain pool that a barrier does not cover, the
  // part a plain request of `rounded` bytes can use without a new one: the
  // block itself, or its upper part (the lower part staying listed). None if
  // neither. With `done_only`, for a stream-ordered request that may not
  // wait: only bytes whose work is known complete, wherever they lie.
  [[gnu::always_inline]] inline Taken take_covered_part(Block* b, std::size_t rounded, bool done_only = false);
  // The covered part of one of the next plain_search_length() plain blocks
  // larger than `own` (the best fit, which a barrier does not cover).
  Taken take_covered_larger(const Block* own, std::size_t rounded);
  // options_.plain_reuse_search, with kSearchAuto resolved for now.
  std::uint32_t plain_search_length() const;
  // The common case inline: blocks of one stream, or a side never used.
  bool mergeable(const Block* low, const Block* high) {
    return low->stream == high->stream || low->device_epoch == 0 || high->device_epoch == 0 ||
           mergeable_across_streams(low, high);
  }
  bool mergeable_across_streams(const Block* low, const Block* high);
  // Whether `bytes` more may be reserved under memory_limit.
  bool within_limit(std::size_t bytes) const;
  // Merges free b (in no list) with its free neighbours, and lists the result.
  Block* merge_and_list(Block* b, const std::unordered_set<const Block*>* skip = nullptr);
  static bool entirely_free(const Segment* seg);
  // Merges free neighbours kept apart whose work is now known done (a walk
  // over the free blocks: for the release paths only). all_done: a host wait
  // has just seen every free complete, so they join whatever the cross-stream
  // policy (kept apart, they would pin their pages and segments for good).
  void coalesce_free(bool all_done);
  // `before`: the pool's state once new memory has failed, before the cache is
  // released to retry (what an out-of-memory diagnosis describes). Only a
  // last try goes on past new memory (see allocate).
  Block* grow(PoolKind kind, std::size_t rounded, StreamId consumer, bool last_try, bool* limit_reached,
              Fragmentation* before);
  // Expandable segments (expandable.cpp).
  bool expandable() const { return options_.expandable_segments; }  // settled at construction
  Block* grow_expandable(PoolKind kind, std::size_t rounded, StreamId consumer, bool* limit_reached);
  Segment* new_expandable_segment(PoolKind kind, std::size_t min_bytes);
  Block* map_front(Block* hole, std::size_t bytes);
  // Inlined, as absorb_next, take_covered_part and cover_of are (the pool is
  // one translation unit): their calls were 5% of a plain pair's instructions.
  [[gnu::always_inline]] inline Block* split_off(Block* b, std::size_t offset);
  void add_hole(Block* b);
  // Unmaps the whole pages inside free blocks of expandable segments, largest
  // blocks first, until `budget` bytes are unmapped; with `wait`, after waiting
  // for every free to complete, else only blocks already known complete.
  // Skips `keep` and blocks used within the last `min_idle` allocations.
  // Returns the bytes unmapped.
  std::size_t unmap_free_pages(bool wait, std::size_t budget = kUnlimited, std::uint64_t min_idle = 0,
                               const Block* keep = nullptr);
  // How an expandable pool of `kind` gets `rounded` more mapped bytes most
  // cheaply: a hole alone, or a free block grown into the hole after it.
  struct Growth {
    Block* hole = nullptr;   // nullptr: none fits, a new segment
    Block* grown = nullptr;  // the free block that grows into the hole, if any
    std::size_t pages = 0;   // pages to map
  };
  Growth plan_growth(PoolKind kind, std::size_t rounded, StreamId consumer);
  Block* new_segment(PoolKind kind, std::size_t bytes, StreamId consumer, bool* limit_reached);
  // Registers [base, base+bytes) as a segment of one block (returned, in no pool yet).
  Block* add_segment(PoolKind kind, DevicePtr base, std::size_t bytes, bool expandable);
  // Takes t.block out of the free lists, splitting off what the request
  // does not need.
  void carve(Taken t, std::size_t rounded, StreamId consumer);
  void add_free(Block* b);
  void remove_free(Block* b);
  // The inactive-split ("non-releasable") statistics of a free block
  // entering or leaving a list.
  void count_listed(const Block* b);
  void uncount_listed(const Block* b);
  // Whether a free block counts there: a piece of a split segment that holds
  // it until its neighbours are free. Not in an expandable segment, whose
  // free pages are unmapped whatever their neighbours (PyTorch leaves those
  // out too). The segment first: expandable is the default.
  static bool non_releasable(const Block* b) { return !b->segment->expandable && b->is_split(); }
  // What listed blocks add to them. A split or merge of listed blocks changes
  // them by the difference only, as PyTorch's allocator does, so that their
  // totals (allocated, freed) mean what PyTorch's do: net changes, not every
  // block's size going out and coming back.
  struct ListedFigure {
    std::int64_t blocks = 0;
    std::int64_t bytes = 0;
  };
  static ListedFigure listed_figure(const Block* b) {
    return non_releasable(b) ? ListedFigure{1, static_cast<std::int64_t>(b->size)} : ListedFigure{};
  }
  [[gnu::always_inline]] void relisted(PoolKind kind, const ListedFigure& before, const ListedFigure& after) {
    change(stats_.inactive_split, kind, after.blocks - before.blocks);
    change(stats_.inactive_split_bytes, kind, after.bytes - before.bytes);
  }
  [[gnu::always_inline]] inline void absorb_next(Block* low);
  void rekey(StreamId id, StreamId key);  // the cached blocks of a stream being destroyed
  // Streams the runtime said are gone (see StreamOrdering::found_gone),
  // before and after each allocation and before each free: their cached
  // blocks re-keyed as at a destroy, before a call that names the handle
  // again can take them as its own stream's, and their books closed.
  void forget_gone_streams();
  // False where the runtime refused: the segment stays as it was, reserved.
  bool release_segment(Segment* seg);
  bool release_oversize_for(std::size_t rounded);
  void garbage_collect();
  void record_oom(std::size_t size, std::size_t rounded, PoolKind kind, StreamId stream,
                  std::size_t segment_asked, bool limit_reached, const Fragmentation& before);
  // A timeline sample when one is due (on every operation: the check inline).
  void observe(bool new_peak) {
    if (timeline_.wants(stats_.pool_ops, new_peak)) record_sample();
  }
  [[gnu::noinline]] void record_sample();
  std::uint64_t now() { return clock_ != nullptr ? clock_->now_ns() : 0; }

  Upstream& upstream_;
  PoolOptions options_;
  std::size_t device_capacity_;
  Clock* clock_;
  StreamOrdering ordering_;
  BlockPool pools_[kPoolKinds] = {BlockPool(PoolKind::Small), BlockPool(PoolKind::Large)};
  // Expandable segments' unmapped free blocks (address space, not memory).
  BlockPool holes_[kPoolKinds] = {BlockPool(PoolKind::Small), BlockPool(PoolKind::Large)};
  NodeRecycler block_nodes_;
  PtrMap allocated_;
  std::map<DevicePtr, Segment*> segments_;
  MemoryStats stats_;
  SizeHistogram request_histogram_;
  SizeHistogram free_blocks_at_peak_;
  Fragmentation fragmentation_at_peak_;
  // Out-of-memory records kept (the count is exact; details of the first ones).
  static constexpr std::size_t kOomRecordsKept = 32;
  std::vector<OomRecord> ooms_;
  Timeline timeline_;
  std::uint64_t reuse_attempts_ = 0;  // garbage-collection clock
  std::int64_t peak_snapshot_ = 0;    // reserved bytes when the peak picture was taken
  std::size_t quarantined_bytes_ = 0;
  ResetLosses reset_losses_;
  std::vector<StreamId> forgotten_streams_;  // see take_forgotten_streams
};

}  // namespace gpupool
