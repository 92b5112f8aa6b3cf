// Read-only views of a DevicePool: fragmentation, per-stream figures,
// histograms, and the invariant checker the tests run after every operation.
#include <map>
#include <sstream>
#include <tuple>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"

namespace gpupool {

DevicePtr DevicePool::held_address() const {
  for (const auto& [base, seg] : segments_) {
    if (!seg->expandable) return base;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      if (b->mapped) return b->addr;
    }
  }
  return 0;
}

Fragmentation DevicePool::fragmentation() const {
  Fragmentation f;
  for (const BlockPool& pool : pools_) {
    for (const Block* b : pool.blocks()) {
      f.free_bytes += b->size;
      ++f.free_blocks;
      if (b->size > f.largest_free_block) f.largest_free_block = b->size;
    }
  }
  f.external = f.free_bytes == 0 ? 0.0
                                 : 1.0 - static_cast<double>(f.largest_free_block) /
                                             static_cast<double>(f.free_bytes);
  f.rounding_waste = static_cast<std::size_t>(stats_.allocated_bytes[kAll].current -
                                              stats_.requested_bytes[kAll].current);
  const std::int64_t peak_requested = stats_.requested_bytes[kAll].peak;
  f.peak_reserved_to_peak_requested =
      peak_requested == 0 ? 0.0
                          : static_cast<double>(stats_.reserved_bytes[kAll].peak) /
                                static_cast<double>(peak_requested);
  return f;
}

SizeHistogram DevicePool::free_block_histogram() const {
  SizeHistogram h;
  for (const BlockPool& pool : pools_) {
    for (const Block* b : pool.blocks()) h.add(b->size);
  }
  return h;
}

// Every cached block is counted in one row, so that the rows add up to the
// cache: a live stream's row, else the row of the gone stream that freed it
// (an ended thread's per-thread stream, whose blocks keep its id, or a
// destroyed stream whose blocks a failure kept from being re-keyed), else the
// row of every later gone stream; a destroyed stream's blocks re-keyed to
// their own key, the plain frees' row. A destroyed stream's handle may be a
// live stream's now: live rows are looked up first.
std::vector<StreamReport> DevicePool::streams() const {
  std::vector<StreamReport> reports = ordering_.stream_reports();
  std::map<StreamId, StreamReport*> live;
  std::map<StreamId, StreamReport*> gone;
  StreamReport* later = nullptr;
  for (StreamReport& r : reports) {
    if (r.alive) {
      live.emplace(r.id, &r);
    } else if (r.id == 0) {
      later = &r;
    } else {
      gone.emplace(r.id, &r);  // the first row, should a handle have gone twice
    }
  }
  auto row_of = [&](StreamId id) -> StreamReport* {
    if (StreamOrdering::is_retired_key(id)) id = kAnyStream;  // with the plain frees' row, as before its key
    if (const auto it = live.find(id); it != live.end()) return it->second;
    if (const auto it = gone.find(id); it != gone.end()) return it->second;
    return later;
  };
  for (const BlockPool& pool : pools_) {
    for (const Block* b : pool.blocks()) {
      StreamReport* r = row_of(b->stream);
      if (r == nullptr) continue;  // the rows then fall short of the cache: the tests check they do not
      ++r->cached_blocks;
      r->cached_bytes += b->size;
    }
  }
  return reports;
}

namespace {

// Accumulates the current value of each statistic from the blocks themselves.
struct Recount {
  StatArray allocation, segment, inactive_split, allocated_bytes, reserved_bytes, inactive_split_bytes,
      requested_bytes;
  std::int64_t oversize_allocations = 0;
  std::int64_t oversize_segments = 0;
};

bool check_array(const char* name, const StatArray& kept, const StatArray& counted,
                 std::ostringstream& why) {
  static constexpr const char* kNames[kStatIndexes] = {"all", "small_pool", "large_pool"};
  for (int i = 0; i < kStatIndexes; ++i) {
    const Stat& s = kept[i];
    if (s.current != counted[i].current) {
      why << name << "." << kNames[i] << ".current is " << s.current << " but recount gives "
          << counted[i].current;
      return false;
    }
    if (s.peak < s.current || s.allocated - s.freed != s.current || s.current < 0) {
      why << name << "." << kNames[i] << " is inconsistent (current " << s.current << ", peak "
          << s.peak << ", allocated " << s.allocated << ", freed " << s.freed << ")";
      return false;
    }
  }
  return true;
}

}  // namespace

bool DevicePool::validate(std::string* error) const {
  std::ostringstream why;
  auto fail = [&]() {
    if (error != nullptr) *error = why.str();
    return false;
  };
  Recount rc;
  auto add = [](StatArray& a, PoolKind kind, std::int64_t v) {
    a[kAll].current += v;
    a[stat_index(kind)].current += v;
  };
  std::size_t free_seen[kPoolKinds] = {0, 0};
  std::size_t holes_seen[kPoolKinds] = {0, 0};
  std::size_t allocated_seen = 0;
  std::int64_t stream_ordered_bytes = 0;  // of blocks allocated by stream-ordered calls
  std::int64_t regular_segments = 0;
  DevicePtr previous_end = 0;
  const std::size_t page = upstream_.page_size();
  // First: the lookups below rely on the order.
  for (int k = 0; k < kPoolKinds; ++k) {
    if (!pools_[k].ordered() || !holes_[k].ordered()) {
      why << "the free or unmapped blocks of pool " << k << " are out of order";
      return fail();
    }
  }

  for (const auto& [base, seg] : segments_) {
    if (seg->base != base || base % kMinBlockSize != 0) {
      why << "segment at " << base << " is misfiled or misaligned";
      return fail();
    }
    if (base < previous_end) {
      why << "segment at " << base << " overlaps the previous one";
      return fail();
    }
    previous_end = base + seg->size;
    add(rc.segment, seg->kind, 1);
    if (!seg->expandable) {
      ++regular_segments;
      add(rc.reserved_bytes, seg->kind, static_cast<std::int64_t>(seg->size));
      if (seg->size >= options_.max_split_size) ++rc.oversize_segments;
    }
    std::size_t mapped = 0;

    DevicePtr expected = base;
    const Block* prev = nullptr;
    for (const Block* b = seg->head; b != nullptr; prev = b, b = b->next) {
      if (b->prev != prev || b->segment != seg) {
        why << "block at " << b->addr << " has broken links";
        return fail();
      }
      if (b->addr != expected || b->size == 0 || b->size % kMinBlockSize != 0) {
        why << "block at " << b->addr << " (size " << b->size << ") does not tile its segment";
        return fail();
      }
      expected += b->size;
      // Free neighbours stay apart only when each holds another stream's history.
      const bool kept_apart = prev != nullptr && prev->mapped && b->mapped && prev->stream != b->stream &&
                              prev->device_epoch != 0 && b->device_epoch != 0;
      if (prev != nullptr && prev->is_free() && b->is_free() && prev->mapped == b->mapped && !kept_apart) {
        why << "free blocks at " << prev->addr << " and " << b->addr << " were not merged (streams " << prev->stream
            << ", " << b->stream << "; device epochs " << prev->device_epoch << ", " << b->device_epoch << ")";
        return fail();
      }
      if (!b->mapped && (!seg->expandable || b->allocated || b->addr % page != 0 || b->size % page != 0)) {
        why << "unmapped block at " << b->addr << " is allocated or not page-aligned";
        return fail();
      }
      if (b->mapped) mapped += b->size;
      const bool in_pool = pool_of(seg->kind).contains(b);
      if (b->is_free_mapped() != in_pool) {
        why << "block at " << b->addr << (in_pool ? " is cached but not free" : " is free but not cached");
        return fail();
      }
      const bool in_holes = holes_[static_cast<int>(seg->kind)].contains(b);
      if ((b->is_free() && !b->mapped) != in_holes) {
        why << "block at " << b->addr << " is misfiled among the unmapped blocks";
        return fail();
      }
      if (in_holes) ++holes_seen[static_cast<int>(seg->kind)];
      if (b->allocated) {
        ++allocated_seen;
        if (allocated_.find(b->addr) != b) {
          why << "allocated block at " << b->addr << " is missing from the address map";
          return fail();
        }
        if (b->requested == 0 || b->requested > b->size) {
          why << "allocated block at " << b->addr << " has requested size " << b->requested
              << " for a block of " << b->size;
          return fail();
        }
        add(rc.allocation, seg->kind, 1);
        add(rc.allocated_bytes, seg->kind, static_cast<std::int64_t>(b->size));
        add(rc.requested_bytes, seg->kind, static_cast<std::int64_t>(b->requested));
        if (b->size >= options_.max_split_size) ++rc.oversize_allocations;
        if (b->stream != kAnyStream) stream_ordered_bytes += static_cast<std::int64_t>(b->size);
      } else if (b->is_free_mapped()) {
        ++free_seen[static_cast<int>(seg->kind)];
        if (b->hot_begin != b->hot_end &&
            (b->hot_begin < b->addr || b->hot_end > b->addr + b->size || b->hot_begin > b->hot_end)) {
          why << "free block at " << b->addr << " (size " << b->size << ") has a hot range outside it";
          return fail();
        }
        if (non_releasable(b)) {
          add(rc.inactive_split, seg->kind, 1);
          add(rc.inactive_split_bytes, seg->kind, static_cast<std::int64_t>(b->size));
        }
      }
    }
    if (expected != base + seg->size) {
      why << "blocks of segment at " << base << " cover " << (expected - base) << " of "
          << seg->size << " bytes";
      return fail();
    }
    if (seg->expandable) {
      if (mapped != seg->mapped_bytes) {
        why << "expandable segment at " << base << " maps " << seg->mapped_bytes << " bytes but its mapped blocks cover "
            << mapped;
        return fail();
      }
      add(rc.reserved_bytes, seg->kind, static_cast<std::int64_t>(mapped));
    }
  }
  for (int k = 0; k < kPoolKinds; ++k) {
    if (holes_[k].size() != holes_seen[k]) {
      why << "unmapped set " << k << " holds " << holes_[k].size() << " blocks but " << holes_seen[k] << " are unmapped";
      return fail();
    }
  }
  for (int k = 0; k < kPoolKinds; ++k) {
    if (pools_[k].size() != free_seen[k]) {
      why << "pool " << k << " caches " << pools_[k].size() << " blocks but " << free_seen[k]
          << " are free";
      return fail();
    }
  }
  if (allocated_.size() != allocated_seen) {
    why << "address map holds " << allocated_.size() << " blocks but " << allocated_seen
        << " are allocated";
    return fail();
  }
  const bool stats_ok =
      check_array("allocation", stats_.allocation, rc.allocation, why) &&
      check_array("segment", stats_.segment, rc.segment, why) &&
      check_array("inactive_split", stats_.inactive_split, rc.inactive_split, why) &&
      check_array("allocated_bytes", stats_.allocated_bytes, rc.allocated_bytes, why) &&
      check_array("reserved_bytes", stats_.reserved_bytes, rc.reserved_bytes, why) &&
      check_array("inactive_split_bytes", stats_.inactive_split_bytes, rc.inactive_split_bytes,
                  why) &&
      check_array("requested_bytes", stats_.requested_bytes, rc.requested_bytes, why);
  if (!stats_ok) return fail();
  if (stats_.stream_ordered_bytes.current != stream_ordered_bytes) {
    why << "stream-ordered bytes " << stats_.stream_ordered_bytes.current << " but recount gives "
        << stream_ordered_bytes;
    return fail();
  }
  for (const auto& [name, high, stat] : {std::tuple("stream-ordered", stats_.stream_ordered_high, &stats_.stream_ordered_bytes),
                                         std::tuple("reserved", stats_.reserved_high, &stats_.reserved_bytes[kAll])}) {
    if (high < stat->current || high > stat->peak) {
      why << name << " high watermark " << high << " is not within current " << stat->current << " and peak "
          << stat->peak;
      return fail();
    }
  }
  if (stats_.oversize_allocations.current != rc.oversize_allocations ||
      stats_.oversize_segments.current != rc.oversize_segments) {
    why << "oversize counts " << stats_.oversize_allocations.current << "/"
        << stats_.oversize_segments.current << " but recount gives " << rc.oversize_allocations
        << "/" << rc.oversize_segments;
    return fail();
  }
  const std::int64_t device_segments =
      stats_.num_device_alloc - stats_.num_device_free - reset_losses_.segments;
  if (device_segments != regular_segments) {
    why << "device allocs minus frees and resets (" << device_segments << ") differ from live segments ("
        << regular_segments << ")";
    return fail();
  }
  if (!ordering_.events_held_once()) {
    why << "an event is held twice by the stream ordering";
    return fail();
  }
  return true;
}

}  // namespace gpupool
