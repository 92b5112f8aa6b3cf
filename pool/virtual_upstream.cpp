#include "pool/virtual_upstream.hpp"

namespace gpupool {

namespace {
// Segments are placed on 2 MiB boundaries with a gap after each, so that an
// off-by-one in the pool shows up as an address outside every segment.
constexpr std::size_t kPlacement = 2 * kMiB;
// Calls kept for tests; the replay of a long trace must not grow without bound.
constexpr std::size_t kMaxCallsKept = 1 << 16;
}  // namespace

DevicePtr VirtualUpstream::allocate_segment(std::size_t bytes) {
  const std::uint64_t attempt = attempts_++;
  last_failed_by_injection_ = fail_ && fail_(attempt);
  if (last_failed_by_injection_ || bytes > capacity_ || in_use_ > capacity_ - bytes) {
    ++failed_;
    return 0;
  }
  const DevicePtr base = next_address_;
  next_address_ += contiguous_ ? bytes : (bytes + kPlacement - 1) / kPlacement * kPlacement + kPlacement;
  live_.emplace(base, bytes);
  in_use_ += bytes;
  if (in_use_ > peak_in_use_) peak_in_use_ = in_use_;
  ++allocations_;
  return base;
}

bool VirtualUpstream::release_segment(DevicePtr base, std::size_t bytes) {
  if (releases_refused_) return false;
  auto it = live_.find(base);
  if (it == live_.end() || it->second != bytes) return true;  // covers() catches misuse
  in_use_ -= bytes;
  live_.erase(it);
  ++releases_;
  return true;
}

bool VirtualUpstream::covers(DevicePtr ptr, std::size_t bytes) const {
  auto it = live_.upper_bound(ptr);
  if (it != live_.begin()) {
    --it;
    if (ptr >= it->first && ptr + bytes <= it->first + it->second) return true;
  }
  if (bytes == 0) return false;
  for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
    if (mapped_.count(page) == 0) return false;
  }
  return true;
}

DevicePtr VirtualUpstream::reserve_address_space(std::size_t bytes) {
  if (!virtual_memory_) return 0;
  const DevicePtr base = (next_address_ + kPage - 1) / kPage * kPage;
  next_address_ = base + bytes + kPage;
  reserved_.emplace(base, bytes);
  return base;
}

bool VirtualUpstream::map_pages(DevicePtr addr, std::size_t bytes) {
  const std::uint64_t attempt = attempts_++;
  if (addr % kPage != 0 || bytes % kPage != 0) return false;
  last_failed_by_injection_ = fail_ && fail_(attempt);
  if (last_failed_by_injection_ || bytes > capacity_ || in_use_ > capacity_ - bytes) {
    ++failed_;
    return false;
  }
  for (DevicePtr page = addr; page < addr + bytes; page += kPage) {
    if (!mapped_.insert(page).second) return false;  // mapped twice: a pool bug
  }
  in_use_ += bytes;
  if (in_use_ > peak_in_use_) peak_in_use_ = in_use_;
  ++page_maps_;
  return true;
}

std::size_t VirtualUpstream::unmap_pages(DevicePtr addr, std::size_t bytes) {
  for (DevicePtr page = addr; page < addr + bytes; page += kPage) {
    if (unmaps_allowed_ == 0) return page - addr;
    if (unmaps_allowed_ != kUnlimited) --unmaps_allowed_;
    if (mapped_.erase(page) != 0) in_use_ -= kPage;
  }
  return bytes;
}

EventHandle VirtualUpstream::create_event() {
  if (event_creation_fails_) return 0;
  const EventHandle e = next_event_++;
  events_.emplace(e, true);
  return e;
}

void VirtualUpstream::destroy_event(EventHandle event) { events_.erase(event); }

bool VirtualUpstream::record_event(EventHandle event, StreamId stream) {
  auto it = events_.find(event);
  if (it == events_.end() || (failing_record_stream_ != 0 && stream == failing_record_stream_) ||
      is_gone(stream)) {
    return stream_call_fails(stream);
  }
  it->second = complete_at_once_ && (lagging_stream_ == 0 || stream != lagging_stream_);
  ++event_records_;
  if (calls_.size() < kMaxCallsKept) calls_.push_back(Call{Call::Record, event, stream});
  return true;
}

bool VirtualUpstream::wait_event(StreamId stream, EventHandle event) {
  if (events_.count(event) == 0 || (failing_wait_stream_ != 0 && stream == failing_wait_stream_) ||
      is_gone(stream)) {
    return stream_call_fails(stream);
  }
  ++stream_waits_;
  if (calls_.size() < kMaxCallsKept) calls_.push_back(Call{Call::Wait, event, stream});
  return true;
}

EventStatus VirtualUpstream::query_event(EventHandle event) {
  ++event_queries_;
  auto it = events_.find(event);
  if (it == events_.end() || queries_fail_ || event_queries_fail_ || event == failing_event_query_) {
    return EventStatus::Error;
  }
  return it->second ? EventStatus::Complete : EventStatus::Pending;
}

EventStatus VirtualUpstream::query_stream(StreamId stream) {
  ++stream_queries_;
  if (queries_fail_ || is_gone(stream)) {
    stream_call_fails(stream);
    return EventStatus::Error;
  }
  return streams_idle_ || (idle_stream_ != 0 && stream == idle_stream_) ? EventStatus::Complete : EventStatus::Pending;
}

bool VirtualUpstream::synchronize_event(EventHandle event) {
  auto it = events_.find(event);
  if (it == events_.end()) return false;
  if (host_waits_fail_) {
    if (refused_event_syncs_.size() < kMaxCallsKept) refused_event_syncs_.push_back(event);
    return false;
  }
  it->second = true;
  if (calls_.size() < kMaxCallsKept) calls_.push_back(Call{Call::SyncEvent, event, 0});
  return true;
}

bool VirtualUpstream::synchronize_stream(StreamId stream) {
  if (host_waits_fail_ || is_gone(stream)) return stream_call_fails(stream);
  if (calls_.size() < kMaxCallsKept) calls_.push_back(Call{Call::SyncStream, 0, stream});
  return true;
}

bool VirtualUpstream::synchronize_device() {
  if (host_waits_fail_) return false;
  ++device_syncs_;
  complete_all();
  if (calls_.size() < kMaxCallsKept) calls_.push_back(Call{Call::SyncDevice, 0, 0});
  return true;
}

void VirtualUpstream::complete_all() {
  for (auto& [e, complete] : events_) complete = true;
}

bool VirtualUpstream::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (capacity_ == kUnlimited) return false;
  *free_bytes = capacity_ - in_use_;
  *total_bytes = capacity_;
  return true;
}

}  // namespace gpupool
