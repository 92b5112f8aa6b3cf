// Plain cudaMalloc reuses memory freed since the last device barrier only
// after recording a new one (see ordering.hpp): one cudaEventRecord on the
// legacy stream, about 1.25 us on an H200, five times the rest of a pair.
// A loop of plain pairs frees each block into the free block it came from,
// and the merged block then looks freed just now although nearly all of it
// was covered by the last barrier. So each free block keeps the span of its
// bytes that may not be covered (its hot range, one interval), and a plain
// request takes covered memory when it can:
// - at the block's start, where it would go anyway, when that part is cold;
// - else right after the hot range. A loop of plain pairs then sweeps up
//   through covered memory and records one barrier per sweep, not per pair.
// Taking memory further up can strand the hot bytes below while the new
// block lives, so that is not done where a block's place matters more than a
// barrier: for requests over 64 MiB (work on them takes far longer than a
// barrier; replayed plain, multistream-10's peak/live went from 1.0456 to
// 1.0549 when its 256 MiB-1 GiB requests skipped too), and when the hot
// bytes fit the request as a best fit would (a block freed and asked for
// again at its size: it goes back where it was, like PyTorch's allocator
// would place it, warm in caches; skipping those took gpt-medium-ctx512 from
// 1.0124 to 1.0296). But not where the block has room past its hot bytes for
// 8 or more such requests: a loop of one size (a scratch buffer taken and
// freed per call) would otherwise record a barrier at every pair in a block
// nearly all covered; it sweeps instead, one barrier per sweep (80 KiB pairs
// in a 2 MiB segment: 0.04 a pair, not 1). Replayed plain, the traces' peaks
// are the same at 8; at 4, gpt-medium-ctx512's went to 1.0296 again.
// A barrier makes every live non-blocking stream wait for it, so beside many
// (PyTorch's stream pool) it costs dozens of calls. Most plain barriers come
// from a block freed and asked for again at its size, whose bytes are all hot:
// plain_reuse_search lets such a request take covered memory from a larger
// block instead, at the cost of splitting it; by default only beside many
// non-blocking streams (see PoolOptions).
// A stream-ordered request that may not wait uses the same covers: it takes
// another stream's cold bytes, wherever they lie, but only once their work is
// known complete (a barrier's cover is not enough there: a new stream that
// could not wait for it voids it). Completion fences reach a block's older
// hot bytes before the newest free's, so those are told apart.
#include <algorithm>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"

namespace gpupool {

DevicePool::Cover DevicePool::cover_of(const Block* b) const {
  // Never used, or covered whole: nothing is hot.
  if (b->device_epoch == 0) return Cover{};
  if (ordering_.device_ordered(b->device_epoch)) return Cover{0, 0, b->device_epoch, b->device_epoch};
  return Cover{b->hot_begin, b->hot_end, b->cold_epoch, b->device_epoch};
}

void DevicePool::join_covers(Block* merged, const Block* high_block, const Cover& low, const Cover& high) {
  // One interval: the span of both hot ranges (a cold gap between them turns
  // hot, which is safe). A byte outside it is outside both.
  const bool low_hot = low.hot_begin != low.hot_end;
  const bool high_hot = high.hot_begin != high.hot_end;
  merged->hot_begin = low_hot ? low.hot_begin : high.hot_begin;
  merged->hot_end = high_hot ? high.hot_end : low.hot_end;
  if (!low_hot && !high_hot) merged->hot_begin = merged->hot_end = 0;
  merged->cold_epoch = std::max(low.cold_epoch, high.cold_epoch);
  // The side freed last keeps its newest free's bytes apart (both sides',
  // if freed in one epoch); the other side's hot bytes count as older.
  // (merged is the lower block: its own fields are still the lower side's.)
  // A hot side has an epoch, so equal nonzero epochs mean two hot sides.
  const std::uint64_t low_epoch = low_hot ? low.epoch : 0;
  const std::uint64_t high_epoch = high_hot ? high.epoch : 0;
  if (high_epoch > low_epoch) {
    merged->fresh_begin = high_block->fresh_begin;
    merged->fresh_end = high_block->fresh_end;
    merged->older_epoch = std::max(high_block->older_epoch, low_epoch);
  } else if (high_epoch < low_epoch) {
    merged->older_epoch = std::max(merged->older_epoch, high_epoch);
  } else if (high_hot) {
    merged->fresh_begin = std::min(merged->fresh_begin, high_block->fresh_begin);
    merged->fresh_end = std::max(merged->fresh_end, high_block->fresh_end);
    merged->older_epoch = std::max(merged->older_epoch, high_block->older_epoch);
  }
}

void DevicePool::clip_hot(Block* b) {
  // (The fresh range is left as it is: the hot range bounds it where used.)
  const DevicePtr end = b->addr + b->size;
  if (b->hot_end <= b->addr || b->hot_begin >= end) {
    b->hot_begin = b->hot_end = 0;
    return;
  }
  b->hot_begin = std::max(b->hot_begin, b->addr);
  b->hot_end = std::min(b->hot_end, end);
}

DevicePool::Taken DevicePool::take_covered_part(Block* b, std::size_t rounded, bool done_only) {
  constexpr std::size_t kLargestSkipping = 64 * kMiB;
  if (options_.unsafe_skip_ordering) return Taken{};
  Cover cover = cover_of(b);
  if (done_only) {
    if (cover.hot_begin == cover.hot_end) return Taken{};  // all of it as done as its last free
    // The hot bytes but the newest free's may be done already: a look's
    // completion fence is pending when the free after it merges in (a stream
    // made for each task on an idle device), so they stayed hot.
    const std::uint64_t older = std::max(b->older_epoch, cover.cold_epoch);
    if (ordering_.device_complete(older)) {
      const DevicePtr begin = std::max(b->fresh_begin, cover.hot_begin);
      const DevicePtr end = std::min(b->fresh_end, cover.hot_end);
      cover = begin < end ? Cover{begin, end, older} : Cover{0, 0, older};
    }
  }
  const std::size_t hot = cover.hot_end - cover.hot_begin;
  const PoolKind kind = b->segment->kind;
  const DevicePtr end = b->addr + b->size;
  // The bytes carve() hands out from a block [start, end).
  auto taken = [&](DevicePtr start) {
    const std::size_t size = end - start;
    return should_split(size, rounded, kind, options_) ? rounded : size;
  };
  // Skipping the hot bytes for a plain request instead of a new barrier can
  // strand them (see above); for one that may not wait, the choice is new memory.
  constexpr std::size_t kSweepRoom = 8;  // requests' room past the hot bytes for a loop of one size to sweep
  const bool returns_to_place = !done_only && hot >= rounded && hot <= rounded + rounded / 8 &&
                              (end - cover.hot_end) / rounded < kSweepRoom;
  DevicePtr start = 0;
  if (hot == 0 || b->addr + taken(b->addr) <= cover.hot_begin) {
    start = b->addr;
  } else if ((done_only || rounded <= kLargestSkipping) && !returns_to_place &&
             end - cover.hot_end >= rounded && should_split(b->size, end - cover.hot_end, kind, options_)) {
    // The part below stays a free block: a remainder the size rules allow.
    start = cover.hot_end;
  } else {
    return Taken{};
  }
  if (done_only ? !ordering_.device_complete(cover.cold_epoch) : !ordering_.device_ready(cover.cold_epoch)) {
    return Taken{};
  }
  if (start == b->addr) return Taken{b, true};
  const ListedFigure before = listed_figure(b);  // b keeps the lower part, and its place in the list
  Block* upper = split_off(b, start - b->addr);
  pool_of(kind).rekeyed(b);
  relisted(kind, before, listed_figure(b));
  return Taken{upper, false};
}

std::uint32_t DevicePool::plain_search_length() const {
  if (options_.plain_reuse_search != PoolOptions::kSearchAuto) return options_.plain_reuse_search;
  // Counted only where a barrier is otherwise due, which walks the streams too.
  return ordering_.non_blocking_streams() >= PoolOptions::kAutoSearchStreams ? PoolOptions::kAutoSearchLength : 0;
}

DevicePool::Taken DevicePool::take_covered_larger(const Block* own, std::size_t rounded) {
  const std::uint32_t length = plain_search_length();
  if (length == 0) return Taken{};  // off: not even a step through the tree
  const BlockPool& pool = pool_of(own->segment->kind);
  Block* b = pool.next(own);
  // Larger plain blocks, smallest first; past one the size rules refuse, all
  // larger are refused too.
  for (std::uint32_t looked = 0; looked < length && b != nullptr; ++looked, b = pool.next(b)) {
    if (b->stream != kAnyStream || !fits_size_rules(b, rounded)) break;
    if (const Taken part = take_covered_part(b, rounded); part.block != nullptr) {
      ++ordering_.device().counters.searched_reuses;
      return part;
    }
  }
  return Taken{};
}

}  // namespace gpupool
