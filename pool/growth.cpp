// Growing the pool: a new segment on a miss, what a miss tries before it
// fails (another stream's block after a wait, oversize segments and then the
// whole cache given back, a block the host wait made free), and the record of
// a failure the report explains.
#include <memory>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"

namespace gpupool {

Block* DevicePool::grow(PoolKind kind, std::size_t rounded, StreamId consumer, bool last_try,
                        bool* limit_reached, Fragmentation* before) {
  if (options_.garbage_collection_threshold > 0.0) garbage_collect();
  const std::size_t bytes = segment_size(rounded, options_);
  auto new_memory = [&]() -> Block* {
    Block* b = expandable() ? grow_expandable(kind, rounded, consumer, limit_reached)
                            : new_segment(kind, bytes, consumer, limit_reached);
    if (b != nullptr) ++stats_.cache_misses;
    return b;
  };
  auto cached = [&](bool allow_wait) -> Block* {
    const Taken t = take_cached(kind, rounded, consumer, allow_wait);
    if (t.block == nullptr) return nullptr;
    if (t.listed) remove_free(t.block);
    ++stats_.cache_hits;
    return t.block;
  };
  Block* b = new_memory();
  if (b != nullptr || (!*limit_reached && !upstream_.failed_for_memory())) return b;
  // The caller first takes back the blocks it keeps elsewhere (no device
  // call); making a stream wait, or releasing the cache after a host wait,
  // is for the last try.
  if (!last_try) return nullptr;
  // A walk over the free blocks: only here, on the way to a failure, never
  // on an ordinary miss (a growing pool with many free blocks would pay it
  // on every new segment).
  *before = fragmentation();
  // Another stream's block after a device-side wait: allowed during a capture
  // too, between streams that are not capturing (the ordering checks each).
  if (options_.cross_stream_reuse == CrossStreamReuse::Auto) {
    if (Block* taken = cached(true); taken != nullptr) return taken;
  }
  if (!ordering_.unsafe_calls_allowed()) return b;  // cudaFree would break a capture
  // Like PyTorch: release oversize blocks that could make room, then all cache.
  if (!expandable() && release_oversize_for(rounded)) {
    b = new_memory();
    if (b != nullptr) return b;
  }
  ++stats_.num_alloc_retries;
  if (release_cached() > 0) b = new_memory();
  // The host waited for every free: a block that could not be ordered before
  // (pending under the "completed" policy, or with no barrier to be had) may
  // be taken now, though no segment was free to give back.
  if (b == nullptr) b = cached(false);
  if (b != nullptr) ++stats_.num_retries_served;
  return b;
}

Block* DevicePool::add_segment(PoolKind kind, DevicePtr base, std::size_t bytes, bool expandable) {
  auto seg = std::make_unique<Segment>();
  seg->base = base;
  seg->size = bytes;
  seg->kind = kind;
  seg->expandable = expandable;
  Block* b = new_block();
  b->addr = base;
  b->size = bytes;
  b->segment = seg.get();
  seg->head = b;
  try {
    segments_.emplace(base, seg.get());
  } catch (...) {
    delete_block(b);
    throw;
  }
  seg.release();  // owned by segments_ (see ~DevicePool)
  increase(stats_.segment, kind, 1);
  return b;
}

bool DevicePool::within_limit(std::size_t bytes) const {
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAll].current);
  return options_.memory_limit == kUnlimited ||
         (bytes <= options_.memory_limit && reserved <= options_.memory_limit - bytes);
}

Block* DevicePool::new_segment(PoolKind kind, std::size_t bytes, StreamId consumer,
                               bool* limit_reached) {
  *limit_reached = !within_limit(bytes);
  if (*limit_reached) return nullptr;
  const std::uint64_t start = now();
  const DevicePtr base = upstream_.allocate_segment(bytes);
  stats_.upstream_alloc_ns += now() - start;
  if (base == 0) {
    ++stats_.num_device_alloc_failures;
    return nullptr;
  }
  Block* b = nullptr;
  try {
    b = add_segment(kind, base, bytes, false);
  } catch (...) {
    upstream_.release_segment(base, bytes);  // no room to keep track of it
    throw;
  }
  ++stats_.num_device_alloc;
  b->stream = consumer;  // a fresh block carries no history: epochs stay 0
  increase(stats_.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  raise_high(stats_.reserved_high, stats_.reserved_bytes);
  if (bytes >= options_.max_split_size) stats_.oversize_segments.increase(1);
  return b;
}

void DevicePool::record_oom(std::size_t size, std::size_t rounded, PoolKind kind,
                            StreamId stream, std::size_t segment_asked, bool limit_reached,
                            const Fragmentation& before) {
  ++stats_.num_ooms;
  if (ooms_.size() >= kOomRecordsKept) return;
  const Fragmentation now_frag = fragmentation();
  OomRecord r;
  r.time_ns = now();
  r.requested = size;
  r.rounded = rounded;
  r.segment_asked = segment_asked;
  r.kind = kind;
  r.stream = stream;
  r.reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAll].current);
  r.allocated = static_cast<std::size_t>(stats_.allocated_bytes[kAll].current);
  r.free_in_pool = now_frag.free_bytes;
  r.largest_free_block = now_frag.largest_free_block;
  // A walk over the free blocks, on the way to a failure only.
  for (const Block* b : pool_of(kind).blocks()) {
    if (b->size >= rounded && b->size > r.largest_fitting_block && fits_size_rules(b, rounded)) {
      r.largest_fitting_block = b->size;
    }
  }
  r.during_capture = ordering_.capture_active();
  r.cache_kept_for_capture = !ordering_.unsafe_calls_allowed();
  r.free_before_release = before.free_bytes;
  r.largest_free_before_release = before.largest_free_block;
  r.limit_reached = limit_reached;
  r.memory_limit = options_.memory_limit;
  r.max_split_size = options_.max_split_size;
  upstream_.memory_info(&r.device_free, &r.device_total);
  ooms_.push_back(r);
}

}  // namespace gpupool
