// Expandable segments: one large address range per pool kind, backed by device
// memory page by page. A request no mapped free block can serve maps new pages,
// preferably right after a free block that then grows into them, so free space
// is never stranded at a segment boundary. Releasing cache unmaps the whole
// pages inside free blocks, once their last use has completed; those holes are
// mapped again when needed. Reserved memory is the mapped pages.
#include <algorithm>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"

namespace gpupool {

namespace {

// Address space reserved per expandable segment: the device's memory, so one
// segment serves everything the device could hold; more only for larger requests.
constexpr std::size_t kDefaultAddressSpace = 256 * kGiB;

// Recycling is worth it only when the cache holds more than 1/50 (2%) of the
// reservation: replaying the shared traces, 2% kept every peak within 2.1% of
// the live bytes and stopped the steady remapping that recycling on every
// growth caused (gpt-medium-ctx128: 896 maps over 10 passes instead of 1989).
constexpr std::size_t kRecycleSlackDivisor = 50;

}  // namespace

void DevicePool::add_hole(Block* b) {
  b->mapped = false;
  b->stream = kAnyStream;  // unmapped memory has no history
  b->stream_epoch = 0;
  b->device_epoch = 0;
  b->hot_begin = b->hot_end = b->fresh_begin = b->fresh_end = 0;
  b->cold_epoch = b->older_epoch = 0;
  holes_[static_cast<int>(b->segment->kind)].insert(b);
}

Segment* DevicePool::new_expandable_segment(PoolKind kind, std::size_t min_bytes) {
  const std::size_t page = upstream_.page_size();
  std::size_t space = std::min({options_.memory_limit, device_capacity_, kDefaultAddressSpace});
  space = round_up(std::max(space, min_bytes), page);
  const DevicePtr base = upstream_.reserve_address_space(space);
  if (base == 0) return nullptr;
  Block* b = add_segment(kind, base, space, true);
  add_hole(b);
  return b->segment;
}

// Splits b at `offset`: b keeps [addr, addr+offset), the returned block the
// rest, with b's state and history. Neither is in any pool afterwards.
Block* DevicePool::split_off(Block* b, std::size_t offset) {
  Block* rest = new_block(*b);  // its segment, state and history
  rest->addr = b->addr + offset;
  rest->size = b->size - offset;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  clip_hot(b);
  clip_hot(rest);
  return rest;
}

// Maps the first `bytes` (whole pages) of a hole; returns them as a mapped
// block with no history, out of every pool. The hole keeps the rest.
Block* DevicePool::map_front(Block* hole, std::size_t bytes) {
  holes_[static_cast<int>(hole->segment->kind)].erase(hole);
  if (bytes < hole->size) {
    Block* rest = split_off(hole, bytes);
    add_hole(rest);
  }
  hole->mapped = true;
  hole->segment->mapped_bytes += bytes;
  increase(stats_.reserved_bytes, hole->segment->kind, static_cast<std::int64_t>(bytes));
  raise_high(stats_.reserved_high, stats_.reserved_bytes);
  return hole;
}

DevicePool::Growth DevicePool::plan_growth(PoolKind kind, std::size_t rounded, StreamId consumer) {
  const std::size_t page = upstream_.page_size();
  Growth g{nullptr, nullptr, round_up(rounded, page) / page};  // a new segment, unless a hole does better
  bool found = false;
  for (Block* hole : holes_[static_cast<int>(kind)].blocks()) {
    if (hole->size >= rounded) {
      const std::size_t pages = round_up(rounded, page) / page;
      if (!found || pages < g.pages) g = Growth{hole, nullptr, pages};
      found = true;
    }
    Block* prev = hole->prev;
    if (prev != nullptr && prev->is_free_mapped() && prev->size < rounded && prev->size + hole->size >= rounded) {
      const std::size_t pages = round_up(rounded - prev->size, page) / page;
      const bool stream_allowed = options_.cross_stream_reuse != CrossStreamReuse::Never || prev->stream == consumer;
      if ((!found || pages < g.pages) && stream_allowed && ready_for(prev, consumer, false)) {
        g = Growth{hole, prev, pages};
        found = true;
      }
    }
  }
  return g;
}

Block* DevicePool::grow_expandable(PoolKind kind, std::size_t rounded, StreamId consumer, bool* limit_reached) {
  const std::size_t page = upstream_.page_size();
  // The cheapest way to get `rounded` mapped bytes: a hole alone (best fit),
  // or a free mapped block grown into the hole right after it.
  Growth g = plan_growth(kind, rounded, consumer);
  // Growing past the largest reservation so far: first give back as many free
  // pages known idle as the growth needs (largest free blocks first, the least
  // likely to be reused whole; never the block about to grow), so that the
  // peak stays near the bytes live. Only when free memory is more than
  // kRecycleSlack of what is reserved: below that, giving pages back and
  // mapping them again costs more than it saves.
  const auto reserved_now = static_cast<std::size_t>(stats_.reserved_bytes[kAll].current);
  if (options_.recycle_pages &&
      reserved_now + g.pages * page > static_cast<std::size_t>(stats_.reserved_bytes[kAll].peak) &&
      (reserved_now - static_cast<std::size_t>(stats_.allocated_bytes[kAll].current)) * kRecycleSlackDivisor >=
          reserved_now) {
    if (unmap_free_pages(false, g.pages * page, options_.recycle_idle_allocations, g.grown) > 0) {
      g = plan_growth(kind, rounded, consumer);  // the pages given back may have opened a better hole
    }
  }
  reserve_blocks(kMostNewBlocks);  // the recycling may have used those allocate() reserved
  Block* best_hole = g.hole;
  Block* grown = g.grown;
  std::size_t best_pages = g.pages;
  if (best_hole == nullptr) {
    Segment* seg = new_expandable_segment(kind, round_up(rounded, page));
    if (seg == nullptr) return nullptr;
    best_hole = seg->head;
  }

  const std::size_t bytes = best_pages * page;
  *limit_reached = !within_limit(bytes);
  if (*limit_reached) return nullptr;
  const std::uint64_t start = now();
  const bool mapped = upstream_.map_pages(best_hole->addr, bytes);
  stats_.upstream_alloc_ns += now() - start;
  if (!mapped) {
    ++stats_.num_device_alloc_failures;
    return nullptr;
  }
  ++stats_.num_page_maps;
  Block* fresh = map_front(best_hole, bytes);
  if (grown != nullptr) {
    remove_free(grown);
    absorb_next(grown);  // the fresh pages add no history
    return grown;
  }
  fresh->stream = consumer;
  return fresh;
}

std::size_t DevicePool::unmap_free_pages(bool wait, std::size_t budget, std::uint64_t min_idle, const Block* keep) {
  if (!expandable() || !ordering_.unsafe_calls_allowed()) return 0;
  const std::size_t page = upstream_.page_size();
  // Unmapping memory that queued work may still touch would fault. Either wait
  // until every free so far has completed (one host wait), or take only the
  // blocks whose last use is already known complete, and record a barrier so
  // that later frees will be too.
  if (wait) {
    if (!ordering_.wait_for_frees()) return 0;
    coalesce_free(true);  // all done now: neighbours kept apart join, whole pages appear
  } else {
    ordering_.fence_frees();
  }
  std::vector<Block*> candidates;
  for (const BlockPool& pool : pools_) {
    for (Block* b : pool.blocks()) {
      if (b->segment->expandable && round_up(b->addr, page) < round_down(b->addr + b->size, page) &&
          ordering_.device_complete(b->device_epoch) && reuse_attempts_ - b->freed_at >= min_idle && b != keep) {
        candidates.push_back(b);
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Block* a, const Block* b) { return a->size != b->size ? a->size > b->size : a->addr < b->addr; });
  std::size_t released = 0;
  for (Block* b : candidates) {
    if (released >= budget) break;
    Segment* seg = b->segment;
    // Only the pages the budget still needs, from the block's top: its lower
    // part stays mapped, ready for the next request that fits there.
    DevicePtr last = round_down(b->addr + b->size, page);
    DevicePtr first = round_up(b->addr, page);
    const std::size_t remaining = budget - released;
    if (last - first > remaining) first = last - round_up(remaining, page);
    reserve_blocks(2);  // for the splits below: b must not be left out of every list
    // Unmapped first, split after: pages the driver refuses (a context broken
    // by a fault) stay in the free block, mapped and counted reserved, as the
    // device still holds them; nothing more is asked of such a driver.
    const std::uint64_t start = now();
    const std::size_t unmapped = upstream_.unmap_pages(first, last - first);
    stats_.upstream_free_ns += now() - start;
    ++stats_.num_page_unmaps;
    const bool refused = unmapped < last - first;
    if (refused) ++stats_.num_page_unmap_failures;
    if (unmapped == 0) break;
    last = first + unmapped;
    remove_free(b);
    Block* hole = b;
    if (first > b->addr) {
      hole = split_off(b, first - b->addr);
      add_free(b);
    }
    if (last < hole->addr + hole->size) add_free(split_off(hole, last - hole->addr));
    const std::size_t bytes = last - first;
    seg->mapped_bytes -= bytes;
    decrease(stats_.reserved_bytes, seg->kind, static_cast<std::int64_t>(bytes));
    released += bytes;
    add_hole(hole);
    // Holes merge with neighbouring holes.
    BlockPool& holes = holes_[static_cast<int>(seg->kind)];
    if (hole->next != nullptr && hole->next->is_free() && !hole->next->mapped) {
      holes.erase(hole);
      holes.erase(hole->next);
      absorb_next(hole);
      holes.insert(hole);
    }
    if (hole->prev != nullptr && hole->prev->is_free() && !hole->prev->mapped) {
      Block* prev = hole->prev;
      holes.erase(prev);
      holes.erase(hole);
      absorb_next(prev);
      holes.insert(prev);
    }
    if (refused) break;
  }
  return released;
}
}  // namespace gpupool
