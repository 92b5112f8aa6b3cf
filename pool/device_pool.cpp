#include "pool/device_pool.hpp"

#include <algorithm>
#include <new>

#include "pool/size_rules.hpp"

namespace gpupool {

namespace {
// One operation in this many is timed, so the pool's own cost can be reported
// without two clock reads on every call.
constexpr std::uint64_t kTimingSample = 64;
}  // namespace

DevicePool::DevicePool(Upstream& upstream, const PoolOptions& options,
                       std::size_t device_capacity, Clock* clock)
    : upstream_(upstream),
      options_(options),
      device_capacity_(device_capacity),
      clock_(clock),
      ordering_(upstream, options_) {
  ooms_.reserve(kOomRecordsKept);
  // options() says what the pool runs with. Expandable segments need an
  // upstream with virtual memory.
  options_.expandable_segments = options_.expandable_segments && upstream_.page_size() != 0;
  // A split limit keeps fixed segments whole for large requests. In an
  // expandable segment free neighbours join whatever their size and idle
  // pages are remapped where a request fits, so the limit only keeps large
  // free blocks from serving: replayed, max_split_size_mb:256 took
  // multistream-10's peak from 1.05x to 2.01x of live bytes, and raised the
  // other traces' by 8-43% (PyTorch stops splitting them but keeps the rule).
  if (options_.expandable_segments) options_.max_split_size = kUnlimited;
}

DevicePool::~DevicePool() {
  for (auto& [base, seg] : segments_) {
    Block* b = seg->head;
    while (b != nullptr) {
      Block* next = b->next;
      delete_block(b);
      b = next;
    }
    delete seg;
  }
}

Block* DevicePool::new_block() { return new (block_nodes_.take(sizeof(Block))) Block(); }

void DevicePool::delete_block(Block* b) {
  b->~Block();
  block_nodes_.give_back(b, sizeof(Block));
}

const Segment* DevicePool::segment_of(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return nullptr;
  --it;
  return ptr < it->second->base + it->second->size ? it->second : nullptr;
}

// ---------------------------------------------------------------- allocation

Allocation DevicePool::allocate(std::size_t size, StreamId consumer, std::uint32_t site, bool last_try) {
  if (size == 0) return Allocation{0, true};
  ++stats_.pool_ops;
  // Streams found gone are forgotten before (found by another call) and
  // after (found by this one): the caller learns of it at once.
  if (ordering_.streams_found_gone()) forget_gone_streams();
  // One call site, so that the work is inlined once.
  const bool timed = clock_ != nullptr && stats_.pool_ops % kTimingSample == 0;
  const std::uint64_t start = timed ? clock_->now_ns() : 0;
  const std::uint64_t upstream_before = timed ? stats_.upstream_alloc_ns + stats_.upstream_free_ns : 0;
  const Allocation a = allocate_unsampled(size, consumer, site, last_try);
  if (timed) {
    const std::uint64_t upstream_spent = stats_.upstream_alloc_ns + stats_.upstream_free_ns - upstream_before;
    const std::uint64_t spent = clock_->now_ns() - start;
    stats_.pool_ns_sampled += spent > upstream_spent ? spent - upstream_spent : 0;
    ++stats_.pool_ops_sampled;
  }
  // Once per request, however many tries it took.
  if (a.ok || a.device_error || last_try) request_histogram_.add(size);
  if (ordering_.streams_found_gone()) forget_gone_streams();
  return a;
}

Allocation DevicePool::allocate_unsampled(std::size_t size, StreamId consumer,
                                          std::uint32_t site, bool last_try) {
  if (size > kMaxRequest) {
    if (last_try) record_oom(size, size, PoolKind::Large, consumer, 0, false, fragmentation());
    return Allocation{};
  }
  const std::size_t rounded = round_size(size, options_.roundup_divisions);
  const PoolKind kind = pool_kind(rounded);
  const std::int64_t reserved_peak_before = stats_.reserved_bytes[kAll].peak;
  // What the allocation may need from the host, had before anything changes:
  // should the host be out of memory, it fails here and leaves the pool as it
  // was (a block out of every list would be merged as free later).
  reserve_blocks(kMostNewBlocks);
  allocated_.reserve_one();

  // Cached blocks first, but none that would make this stream wait for work
  // of another; then new memory; under pressure, blocks whose reuse makes this
  // stream wait on the device for the other stream's work (never the host).
  Taken taken = take_cached(kind, rounded, consumer, false);
  if (taken.block != nullptr) {
    ++stats_.cache_hits;
  } else {
    Fragmentation before;
    bool limit_reached = false;
    taken.block = grow(kind, rounded, consumer, last_try, &limit_reached, &before);
    if (taken.block == nullptr && !limit_reached && !upstream_.failed_for_memory()) {
      return Allocation{0, false, true};  // not an out-of-memory: no diagnosis of one
    }
    if (taken.block == nullptr) {
      if (last_try) {
        record_oom(size, rounded, kind, consumer, segment_size(rounded, options_), limit_reached, before);
      }
      return Allocation{};
    }
  }
  carve(taken, rounded, consumer);
  Block* b = taken.block;

  b->allocated = true;
  b->requested = size;
  b->stream = consumer;
  b->site = site;
  allocated_.insert(b->addr, b);
  increase(stats_.allocation, kind, 1);
  increase(stats_.allocated_bytes, kind, static_cast<std::int64_t>(b->size));
  increase(stats_.requested_bytes, kind, static_cast<std::int64_t>(size));
  if (b->size >= options_.max_split_size) stats_.oversize_allocations.increase(1);
  if (consumer != kAnyStream) {
    stats_.stream_ordered_bytes.increase(static_cast<std::int64_t>(b->size));
    stats_.stream_ordered_high = std::max(stats_.stream_ordered_high, stats_.stream_ordered_bytes.current);
  }

  const std::int64_t peak = stats_.reserved_bytes[kAll].peak;
  const bool new_peak = peak > reserved_peak_before;
  // The picture at the peak costs a walk over the free blocks: taken again
  // only once the peak has grown by 1/64 since the last one, so a program
  // growing through thousands of segments pays for a few hundred walks.
  if (new_peak && peak - peak_snapshot_ >= std::max<std::int64_t>(peak_snapshot_ / 64, 1)) {
    free_blocks_at_peak_ = free_block_histogram();
    fragmentation_at_peak_ = fragmentation();
    peak_snapshot_ = peak;
  }
  observe(new_peak);
  return Allocation{b->addr, true};
}

bool DevicePool::fits_size_rules(const Block* b, std::size_t rounded) const {
  const std::size_t max_split = options_.max_split_size;
  // Oversize blocks never serve smaller requests, and serve oversize requests
  // only when the waste stays under max_non_split_rounding.
  if (rounded < max_split && b->size >= max_split) return false;
  if (rounded >= max_split && b->size - rounded >= options_.max_non_split_rounding) return false;
  return true;
}

bool DevicePool::ready_for(Block* b, StreamId consumer, bool allow_wait) {
  // Another stream's block: at once if its last use is known complete (or,
  // under "auto", a barrier recorded since its free covers it); else only
  // when waits are allowed, and never under the "completed" policy.
  const bool may_wait = allow_wait && options_.cross_stream_reuse == CrossStreamReuse::Auto;
  auto ordered = [&] {
    return (StreamOrdering::is_retired_key(b->stream) && ordering_.retired_done(b->stream, true)) ||
           ordering_.complete_or_covered(b->device_epoch);
  };
  auto complete_or_wait = [&](auto&& wait) {
    if (ordered()) return true;
    if (may_wait) return wait();
    ordering_.fence_frees();  // so that it can be seen complete later
    return ordered();
  };
  if (consumer == kAnyStream) {
    // Plain cudaMalloc: the block may be used on any stream. cudaFree's own
    // blocks always go through the barrier (its promise to the program).
    if (b->stream == kAnyStream) return ordering_.plain_ready(b->device_epoch);
    return complete_or_wait([&] { return ordering_.plain_ready(b->device_epoch); });
  }
  if (b->stream == consumer) return true;
  auto through_barrier = [&] { return ordering_.device_ready(b->device_epoch); };
  if (b->stream == kAnyStream) return complete_or_wait(through_barrier);
  if (StreamOrdering::is_retired_key(b->stream)) {
    // A destroyed stream's block (see StreamOrdering::retired_done) not
    // known done: the consumer waits for that stream's last event, even with
    // room to grow, where a plain free's block would get a barrier (which
    // makes it wait for every busy stream); as a plain free's where it cannot.
    if (ordered()) return true;
    if (options_.cross_stream_reuse == CrossStreamReuse::Auto && ordering_.wait_for_retired(b->stream, consumer)) {
      return true;
    }
    return complete_or_wait(through_barrier);
  }
  return ordering_.stream_ready(b->stream, b->stream_epoch, b->device_epoch, consumer, may_wait);
}

DevicePool::Taken DevicePool::take_cached(PoolKind kind, std::size_t rounded, StreamId consumer,
                                          bool allow_wait) {
  BlockPool& pool = pool_of(kind);
  ++reuse_attempts_;
  StreamCounters& counters =
      consumer == kAnyStream ? ordering_.device().counters : ordering_.stream(consumer).counters;

  // Blocks keyed to the consumer's own stream first: no cross-stream ordering.
  Block* own = pool.best_fit(consumer, rounded);
  if (own != nullptr && consumer == kAnyStream && !ordering_.device_ordered(own->device_epoch)) {
    // Reusing it would need a new barrier. A block as good (at most 1/8
    // larger) freed before the last barrier needs none: a few are looked at.
    const std::size_t limit = own->size + own->size / 8;
    Block* b = own;
    for (int i = 0; i < 4 && (b = pool.next(b)) != nullptr && b->stream == consumer && b->size <= limit; ++i) {
      if (ordering_.device_ordered(b->device_epoch)) {
        own = b;
        break;
      }
    }
  }
  const bool own_fits = own != nullptr && fits_size_rules(own, rounded);
  if (own_fits && consumer == kAnyStream && !ordering_.device_ordered(own->device_epoch)) {
    // Or the part of it that the last barrier covers, or, where allowed, of
    // a larger block.
    Taken part = take_covered_part(own, rounded);
    if (part.block == nullptr) part = take_covered_larger(own, rounded);
    if (part.block != nullptr) {
      ++counters.same_stream_reuses;
      return part;
    }
  }
  if (own_fits && ready_for(own, consumer, true)) {
    ++counters.same_stream_reuses;
    return Taken{own, true};
  }
  if (options_.cross_stream_reuse == CrossStreamReuse::Never) return Taken{};

  // Then every other stream's blocks that fit, smallest first: the best fit
  // of each stream's, then, while there is room, a few more of each, since a
  // best fit may still be in use where a larger block is done. (Blocks of
  // destroyed streams come under kAnyStream where merged with each other
  // while pending, or where no event of their own could be had: a program
  // that makes a stream for each task would find only the newest one's block
  // there, pending, and grow the pool at every task.)
  constexpr int kLookedAtPerStream = 4;
  Block* candidates[64];
  int found = 0;
  StreamId key = 0;
  for (bool first = true; found < 64 && pool.next_stream(key, &key, first); first = false) {
    if (key == consumer) continue;
    Block* c = pool.best_fit(key, rounded);
    if (c != nullptr && fits_size_rules(c, rounded)) candidates[found++] = c;
  }
  const int best_fits = found;
  for (int i = 0; i < best_fits && found < 64; ++i) {
    Block* c = candidates[i];
    // Past one the size rules refuse, all larger are refused too.
    for (int more = 1; more < kLookedAtPerStream && found < 64; ++more) {
      c = pool.next(c);
      if (c == nullptr || c->stream != candidates[i]->stream || !fits_size_rules(c, rounded)) break;
      candidates[found++] = c;
    }
  }
  std::sort(candidates, candidates + found, [](const Block* a, const Block* b) {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  });
  for (int i = 0; i < found; ++i) {
    if (ready_for(candidates[i], consumer, allow_wait)) {
      ++counters.cross_stream_reuses;
      return Taken{candidates[i], true};
    }
  }
  // None is ready: the part of one whose work is known done. A free merged
  // into a free block gives all of it its history, though the rest may be
  // long done (a thread that freed and ended just before: each thread after
  // it would otherwise grow the pool).
  if (consumer != kAnyStream && options_.cross_stream_reuse == CrossStreamReuse::Auto) {
    for (int i = 0; i < found; ++i) {
      if (const Taken part = take_covered_part(candidates[i], rounded, true); part.block != nullptr) {
        ++counters.cross_stream_reuses;
        return part;
      }
    }
  }
  return Taken{};
}

void DevicePool::carve(Taken t, std::size_t rounded, StreamId consumer) {
  Block* b = t.block;
  const PoolKind kind = b->segment->kind;
  // In an expandable segment a small remainder is not stranded: it joins its
  // neighbours once they are free and can grow into the pages after it. So a
  // stream-ordered request splits off any remainder of 512 B or more, as
  // PyTorch does there: replayed, lm-train-a's peak went from 1.0088x to
  // 1.0024x of live bytes, lora-finetune-1.3b's from 1.0279x to 1.0179x, and
  // stayed there over 40 passes. Not a plain request: the sweep through
  // covered memory (plain_reuse.cpp) and page recycling then made them creep;
  // lora-finetune-1.3b replayed plain went from 1.0247x at 2 passes to
  // 1.0354x at 40, with about 25 page mappings and unmappings a pass, where
  // whole remainders hold 1.0283x with 14 in all after the second pass.
  const bool fine_remainders = expandable() && consumer != kAnyStream;
  if (!should_split(b->size, rounded, kind, options_, fine_remainders)) {
    if (t.listed) remove_free(b);
    return;
  }
  const ListedFigure before = t.listed ? listed_figure(b) : ListedFigure{};  // before its size changes
  // The remainder was part of the same freed block: same history.
  Block* rest = split_off(b, rounded);
  // Its pages were not needed now: recycling may take them at once (keeping
  // the parent's free time instead raised multistream-10's peak 1.051 -> 1.078).
  rest->freed_at = 0;
  // The remainder may sit next to a free block: one kept apart from the block
  // it came from, or (growing an expandable segment) a block before a hole.
  // Each merge may change its history, so look again (b, before it, is taken).
  while (rest->next != nullptr && rest->next->is_free_mapped() && mergeable(rest, rest->next)) {
    remove_free(rest->next);
    absorb_next(rest);
  }
  if (t.listed) {
    BlockPool& pool = pool_of(kind);
    pool.take_place(b, rest);  // (erasing rest->next above compared no keys)
    pool.rekeyed(rest);
    relisted(kind, before, listed_figure(rest));
  } else {
    add_free(rest);
  }
}

void DevicePool::add_free(Block* b) {
  pool_of(b->segment->kind).insert(b);
  count_listed(b);
}

void DevicePool::remove_free(Block* b) {
  pool_of(b->segment->kind).erase(b);
  uncount_listed(b);
}

void DevicePool::count_listed(const Block* b) {
  if (non_releasable(b)) {
    increase(stats_.inactive_split, b->segment->kind, 1);
    increase(stats_.inactive_split_bytes, b->segment->kind, static_cast<std::int64_t>(b->size));
  }
}

void DevicePool::uncount_listed(const Block* b) {
  if (non_releasable(b)) {
    decrease(stats_.inactive_split, b->segment->kind, 1);
    decrease(stats_.inactive_split_bytes, b->segment->kind, static_cast<std::int64_t>(b->size));
  }
}

// ---------------------------------------------------------------- free

FreeResult DevicePool::deallocate(DevicePtr ptr, StreamId site) {
  ++stats_.pool_ops;
  // (A free makes no call that could find a stream gone: before only.)
  if (ordering_.streams_found_gone()) forget_gone_streams();
  const bool timed = clock_ != nullptr && stats_.pool_ops % kTimingSample == 0;
  const std::uint64_t start = timed ? clock_->now_ns() : 0;
  const FreeResult r = deallocate_unsampled(ptr, site);
  if (timed) {
    stats_.pool_ns_sampled += clock_->now_ns() - start;
    ++stats_.pool_ops_sampled;
  }
  return r;
}

FreeResult DevicePool::deallocate_unsampled(DevicePtr ptr, StreamId site) {
  Block* b = allocated_.find(ptr);
  if (b == nullptr) return owns(ptr) ? FreeResult::NotAllocated : FreeResult::NotOwned;
  // Stamped before anything changes: the stream's first free makes its state.
  const bool captured = site != kAnyStream && ordering_.is_capturing(site);
  const StreamOrdering::FreeStamp stamp = captured ? StreamOrdering::FreeStamp{} : ordering_.stamp_free(site);
  allocated_.erase(ptr);
  const PoolKind kind = b->segment->kind;
  decrease(stats_.allocation, kind, 1);
  decrease(stats_.allocated_bytes, kind, static_cast<std::int64_t>(b->size));
  decrease(stats_.requested_bytes, kind, static_cast<std::int64_t>(b->requested));
  if (b->size >= options_.max_split_size) stats_.oversize_allocations.decrease(1);
  if (b->stream != kAnyStream) stats_.stream_ordered_bytes.decrease(static_cast<std::int64_t>(b->size));
  b->allocated = false;
  b->requested = 0;

  if (captured) {
    // A stream-ordered free inside a capture happens when the graph runs.
    b->quarantined = true;
    quarantined_bytes_ += b->size;
    observe(false);
    return FreeResult::Freed;
  }
  b->stream = site;
  b->stream_epoch = stamp.stream_epoch;
  b->device_epoch = stamp.device_epoch;
  b->freed_at = reuse_attempts_;
  b->hot_begin = b->fresh_begin = b->addr;  // none of it is covered by a barrier yet
  b->hot_end = b->fresh_end = b->addr + b->size;
  b->cold_epoch = b->older_epoch = 0;

  b = merge_and_list(b);
  if (!b->is_split()) b->segment->idle_since = reuse_attempts_;
  observe(false);
  return FreeResult::Freed;
}

// Two free neighbours merge unless that would tie together pending work of
// two streams: the merged block would belong to neither, and every later
// free joining it would keep it looking busy, so neither stream could reuse
// it without a device-wide wait. Such neighbours stay apart (each reusable at
// once by its own stream) until one of them is freed again with the other's
// work known done. Under the "never" policy streams never share a block.
bool DevicePool::mergeable_across_streams(const Block* low, const Block* high) {
  if (options_.cross_stream_reuse == CrossStreamReuse::Never) return false;
  return ordering_.known_complete(low->stream, low->stream_epoch, low->device_epoch) ||
         ordering_.known_complete(high->stream, high->stream_epoch, high->device_epoch);
}

// Merges b (not in a free list) with its free neighbours while they are
// mergeable: a merge can change b's history so that a neighbour kept apart so
// far joins too. Neighbours in `skip` are left alone. The merged block takes
// the place in the free list of the first neighbour it absorbs (usually still
// in order: see BlockPool::rekeyed). Returns the merged block, listed.
Block* DevicePool::merge_and_list(Block* b, const std::unordered_set<const Block*>* skip) {
  BlockPool& pool = pool_of(b->segment->kind);
  auto joins = [&](const Block* n) {
    return n != nullptr && n->is_free_mapped() && (skip == nullptr || skip->count(n) == 0);
  };
  bool listed = false;  // b holds a place in the list; its key is settled at the end
  ListedFigure absorbed;  // what the listed blocks b takes in added to the statistics
  auto absorb = [&absorbed](const Block* n) {
    const ListedFigure f = listed_figure(n);
    absorbed.blocks += f.blocks;
    absorbed.bytes += f.bytes;
  };
  for (bool merged = true; merged;) {
    merged = false;
    if (joins(b->prev) && mergeable(b->prev, b)) {
      Block* prev = b->prev;  // listed: it keeps its place
      absorb(prev);
      if (listed) pool.erase(b);
      absorb_next(prev);
      b = prev;
      listed = true;
      merged = true;
    }
    if (joins(b->next) && mergeable(b, b->next)) {
      Block* next = b->next;
      absorb(next);
      if (listed) {
        pool.erase(next);
      } else {
        pool.take_place(next, b);
        listed = true;
      }
      absorb_next(b);
      merged = true;
    }
  }
  if (listed) {
    pool.rekeyed(b);
  } else {
    pool.insert(b);
  }
  relisted(b->segment->kind, absorbed, listed_figure(b));
  return b;
}

// Merges low->next into low. The merged block keeps the strictest history: a
// side whose work is known done (or that was never used) adds nothing; two
// histories on one stream keep that stream; different streams leave only the
// device barrier as a safe way to reuse it. Dropping finished histories
// matters: a free region that frees of two streams keep joining would
// otherwise always look busy, and the streams would grow instead of reusing it.
void DevicePool::absorb_next(Block* low) {
  Block* high = low->next;
  const Cover low_cover = cover_of(low);
  const Cover high_cover = cover_of(high);
  // (Under the "never" policy a stream's memory stays its own, done or not.)
  const bool drop_finished = options_.cross_stream_reuse != CrossStreamReuse::Never;
  auto done = [&](const Block* b) {
    return b->device_epoch == 0 ||
           (drop_finished && ordering_.known_complete(b->stream, b->stream_epoch, b->device_epoch));
  };
  if (low->stream == high->stream) {  // the common case: no lookups
    low->stream_epoch = std::max(low->stream_epoch, high->stream_epoch);
    low->device_epoch = std::max(low->device_epoch, high->device_epoch);
  } else if (done(low)) {
    low->stream = high->stream;
    low->stream_epoch = high->stream_epoch;
    low->device_epoch = high->device_epoch;
  } else if (!done(high)) {
    low->stream = kAnyStream;
    low->stream_epoch = 0;
    low->device_epoch = std::max(low->device_epoch, high->device_epoch);
  }
  low->freed_at = std::max(low->freed_at, high->freed_at);
  join_covers(low, high, low_cover, high_cover);
  low->size += high->size;
  low->next = high->next;
  if (high->next != nullptr) high->next->prev = low;
  delete_block(high);
}

void DevicePool::record_sample() { timeline_.record(stats_.pool_ops, now(), stats_); }

}  // namespace gpupool
