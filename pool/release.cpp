// Giving device memory back: whole idle segments (release_cached, before an
// out-of-memory and on request), oversize segments that could make room
// (max_split_size_mb), and PyTorch's garbage collection past
// garbage_collection_threshold. Expandable segments give back pages instead
// (expandable.cpp).
#include <algorithm>
#include <vector>

#include "pool/device_pool.hpp"

namespace gpupool {

bool DevicePool::entirely_free(const Segment* seg) {
  // Usually one block; two or more when free neighbours were kept apart.
  for (const Block* b = seg->head; b != nullptr; b = b->next) {
    if (!b->is_free()) return false;
  }
  return true;
}

bool DevicePool::release_segment(Segment* seg) {
  // The runtime first: a refused cudaFree (an earlier kernel's sticky error,
  // a capture the books did not know of) leaves the memory on the device,
  // so the segment stays, free and counted as reserved.
  const std::uint64_t start = now();
  const bool released = upstream_.release_segment(seg->base, seg->size);
  stats_.upstream_free_ns += now() - start;
  if (!released) {
    ++stats_.num_device_free_failures;
    return false;
  }
  for (Block* b = seg->head->next; b != nullptr;) {
    Block* next = b->next;
    remove_free(b);
    delete_block(b);
    b = next;
  }
  Block* b = seg->head;
  remove_free(b);
  ++stats_.num_device_free;
  decrease(stats_.segment, seg->kind, 1);
  decrease(stats_.reserved_bytes, seg->kind, static_cast<std::int64_t>(seg->size));
  if (seg->size >= options_.max_split_size) stats_.oversize_segments.decrease(1);
  segments_.erase(seg->base);
  delete_block(b);
  delete seg;
  return true;
}

void DevicePool::coalesce_free(bool all_done) {
  // A merge changes the merged block's history, which can make it mergeable
  // with a neighbour that was kept apart: passes until none merges.
  for (bool merged = true; merged;) {
    std::vector<Block*> firsts;
    for (const BlockPool& pool : pools_) {
      for (Block* b : pool.blocks()) {
        if (b->next != nullptr && b->next->is_free_mapped() && (all_done || mergeable(b, b->next))) {
          firsts.push_back(b);
        }
      }
    }
    // From the top down: a merge deletes only blocks above the one merging.
    std::sort(firsts.begin(), firsts.end(), [](const Block* a, const Block* b) { return a->addr > b->addr; });
    for (Block* b : firsts) {
      remove_free(b);
      remove_free(b->next);
      absorb_next(b);
      add_free(b);
    }
    merged = !firsts.empty();
  }
}

std::size_t DevicePool::release_cached() {
  if (!ordering_.unsafe_calls_allowed()) return 0;  // cudaFree would break a capture
  // Everything freed so far done (one host wait, as cudaFree would make):
  // free neighbours kept apart join, and every free page may go back.
  const bool waited = ordering_.wait_for_frees();
  coalesce_free(waited);
  std::vector<Segment*> idle;
  for (const auto& [base, seg] : segments_) {
    if (!seg->expandable && entirely_free(seg)) idle.push_back(seg);
  }
  std::size_t released = 0;
  for (Segment* seg : idle) {
    const std::size_t size = seg->size;
    if (release_segment(seg)) released += size;
  }
  return released + unmap_free_pages(!waited);
}

bool DevicePool::release_oversize_for(std::size_t rounded) {
  if (options_.max_split_size == kUnlimited) return false;
  std::vector<Segment*> oversize;
  for (const auto& [base, seg] : segments_) {
    if (!seg->expandable && seg->size >= options_.max_split_size && seg->head->is_free() &&
        seg->head->next == nullptr) {
      oversize.push_back(seg);
    }
  }
  if (oversize.empty()) return false;
  std::sort(oversize.begin(), oversize.end(),
            [](const Segment* a, const Segment* b) { return a->size < b->size; });
  // The smallest one that covers the request alone, else largest first until
  // enough is released.
  for (auto it = oversize.begin(); it != oversize.end();) {
    if ((*it)->size < rounded) {
      ++it;
      continue;
    }
    if (release_segment(*it)) return true;
    it = oversize.erase(it);  // refused: not asked again below
  }
  std::size_t released = 0;
  while (!oversize.empty() && released < rounded) {
    const std::size_t size = oversize.back()->size;
    if (release_segment(oversize.back())) released += size;
    oversize.pop_back();
  }
  return released > 0;
}

void DevicePool::garbage_collect() {
  const std::size_t allowed = std::min(options_.memory_limit, device_capacity_);
  if (allowed == kUnlimited || allowed == 0 || !ordering_.unsafe_calls_allowed()) return;
  const auto threshold =
      static_cast<std::size_t>(options_.garbage_collection_threshold * static_cast<double>(allowed));
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAll].current);
  if (reserved <= threshold) return;
  const std::size_t target = reserved - threshold;

  // PyTorch's rule: release idle segments at least as old as the average,
  // oldest first, until enough is released.
  std::vector<Segment*> idle;
  std::uint64_t total_age = 0;
  bool has_expandable = false;
  for (const auto& [base, seg] : segments_) {
    has_expandable |= seg->expandable;
    if (!seg->expandable && entirely_free(seg)) {
      idle.push_back(seg);
      total_age += reuse_attempts_ - seg->idle_since;
    }
  }
  // Expandable segments give back their free pages instead.
  if (has_expandable) unmap_free_pages(true);
  std::sort(idle.begin(), idle.end(),
            [](const Segment* a, const Segment* b) { return a->idle_since < b->idle_since; });
  std::size_t released = 0;
  bool progress = true;
  while (released < target && progress && !idle.empty()) {
    progress = false;
    const std::uint64_t average = total_age / idle.size();
    for (auto it = idle.begin(); it != idle.end() && released < target;) {
      const std::uint64_t age = reuse_attempts_ - (*it)->idle_since;
      if (age < average) {
        ++it;
        continue;
      }
      const std::size_t size = (*it)->size;
      total_age -= age;
      if (release_segment(*it)) {
        released += size;
        ++stats_.num_gc_releases;
      }
      it = idle.erase(it);
      progress = true;  // the list is shorter, released or refused
    }
  }
}

}  // namespace gpupool
