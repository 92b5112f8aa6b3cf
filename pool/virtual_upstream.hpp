// An Upstream with no device behind it: segments are address ranges handed out
// from a counter against a capacity, events complete when told to (or at once).
// The unit tests, the replay tool and the benchmarks run the real pool over it,
// so an 80 GB workload replays on a laptop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "pool/upstream.hpp"

namespace gpupool {

class VirtualUpstream final : public Upstream {
 public:
  explicit VirtualUpstream(std::size_t capacity = kUnlimited) : capacity_(capacity) {}

  // --- Upstream ---
  DevicePtr allocate_segment(std::size_t bytes) override;
  bool release_segment(DevicePtr base, std::size_t bytes) override;
  EventHandle create_event() override;
  void destroy_event(EventHandle event) override;
  bool record_event(EventHandle event, StreamId stream) override;
  bool wait_event(StreamId stream, EventHandle event) override;
  EventStatus query_event(EventHandle event) override;
  EventStatus query_stream(StreamId stream) override;
  bool synchronize_event(EventHandle event) override;
  bool synchronize_stream(StreamId stream) override;
  bool synchronize_device() override;
  StreamId legacy_stream() const override { return kLegacy; }
  bool capture_forbids_unsafe_calls() const override { return capture_forbids_unsafe_calls_; }
  bool memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  bool failed_for_memory() const override { return !last_failed_by_injection_ || !device_errors_; }
  bool failed_for_gone_stream() const override { return last_failure_gone_; }
  std::size_t page_size() const override { return virtual_memory_ ? kPage : 0; }
  DevicePtr reserve_address_space(std::size_t bytes) override;
  bool map_pages(DevicePtr addr, std::size_t bytes) override;
  std::size_t unmap_pages(DevicePtr addr, std::size_t bytes) override;
  static constexpr std::size_t kPage = 2 * kMiB;

  static constexpr StreamId kLegacy = 0x1;

  // --- control ---
  // Events recorded from now on complete at once (true) or only when
  // complete_all() is called (false).
  void set_events_complete_at_once(bool yes) { complete_at_once_ = yes; }
  // Events recorded on this stream from now on stay pending until
  // complete_all(), whatever set_events_complete_at_once says (0: none).
  void set_lagging_stream(StreamId stream) { lagging_stream_ = stream; }
  // Streams report idle (all queued work done) or busy to query_stream.
  void set_streams_idle(bool yes) { streams_idle_ = yes; }
  // This stream reports idle whatever set_streams_idle says (0: none).
  void set_idle_stream(StreamId stream) { idle_stream_ = stream; }
  void complete_all();
  // Fail the allocation attempts for which `fail` returns true (by call number).
  void set_failure(std::function<bool(std::uint64_t)> fail) { fail_ = std::move(fail); }
  // Those failures are device errors (failed_for_memory() false), not a lack of memory.
  void set_failures_are_device_errors(bool yes) { device_errors_ = yes; }
  void set_capacity(std::size_t capacity) { capacity_ = capacity; }
  // Place segments back to back (no gap), as a device may: tests use it to show
  // that blocks of different segments never merge.
  void set_contiguous(bool yes) { contiguous_ = yes; }
  // Offer virtual memory (page mapping) for expandable segments.
  void set_virtual_memory(bool yes) { virtual_memory_ = yes; }
  // Event records on this stream fail (0: none do), for another reason than
  // a gone stream.
  void set_failing_record_stream(StreamId stream) { failing_record_stream_ = stream; }
  // Waits on this stream fail (0: none do).
  void set_failing_wait_stream(StreamId stream) { failing_wait_stream_ = stream; }
  // The runtime knows no such stream (0: none): it was destroyed where the
  // pool could not see it. Records, waits, queries and host waits naming it
  // fail, and failed_for_gone_stream() says why.
  void set_gone_stream(StreamId stream) { gone_stream_ = stream; }
  // No event can be created (create_event returns 0).
  void set_event_creation_fails(bool yes) { event_creation_fails_ = yes; }
  // Host waits (for an event, a stream, the device) fail and wait for nothing;
  // refused waits for an event are listed (refused_event_syncs).
  void set_host_waits_fail(bool yes) { host_waits_fail_ = yes; }
  // Queries of events and streams answer with an error.
  void set_queries_fail(bool yes) { queries_fail_ = yes; }
  // Queries of events alone answer with an error (streams answer as before).
  void set_event_queries_fail(bool yes) { event_queries_fail_ = yes; }
  // Queries of this one event answer with an error (0: none).
  void set_failing_event_query(EventHandle event) { failing_event_query_ = event; }
  // Segment releases are refused (the memory stays allocated).
  void set_releases_refused(bool yes) { releases_refused_ = yes; }
  // At most this many more pages are unmapped; the driver refuses the rest.
  void set_unmaps_allowed(std::size_t pages) { unmaps_allowed_ = pages; }
  // A capture elsewhere forbids unsafe calls (capture_forbids_unsafe_calls).
  void set_capture_forbids_unsafe_calls(bool yes) { capture_forbids_unsafe_calls_ = yes; }

  // --- observation ---
  struct Call {
    enum Kind { Record, Wait, SyncEvent, SyncStream, SyncDevice } kind;
    EventHandle event;
    StreamId stream;
  };
  const std::vector<Call>& calls() const { return calls_; }
  // Events whose host wait was refused (set_host_waits_fail), in order; not
  // in calls(), which lists only what was done.
  const std::vector<EventHandle>& refused_event_syncs() const { return refused_event_syncs_; }
  void clear_calls() {
    calls_.clear();
    refused_event_syncs_.clear();
  }
  std::uint64_t allocations() const { return allocations_; }
  std::uint64_t releases() const { return releases_; }
  std::uint64_t failed_allocations() const { return failed_; }
  std::size_t in_use() const { return in_use_; }
  std::size_t peak_in_use() const { return peak_in_use_; }
  std::size_t live_segments() const { return live_.size(); }
  std::size_t mapped_pages() const { return mapped_.size(); }
  std::uint64_t page_maps() const { return page_maps_; }
  std::size_t events_created() const { return events_.size(); }
  // Every record, wait and query made, however many (calls() keeps the first
  // 65536, and no queries).
  std::uint64_t event_records() const { return event_records_; }
  std::uint64_t event_queries() const { return event_queries_; }
  std::uint64_t stream_queries() const { return stream_queries_; }
  std::uint64_t device_syncs() const { return device_syncs_; }
  std::uint64_t stream_waits() const { return stream_waits_; }
  // Calls that named the gone stream (set_gone_stream), all refused.
  std::uint64_t gone_stream_calls() const { return gone_stream_calls_; }
  // True when [ptr, ptr+bytes) lies inside one live segment, or entirely on
  // mapped pages of reserved address space.
  bool covers(DevicePtr ptr, std::size_t bytes) const;

 private:
  std::size_t capacity_;
  DevicePtr next_address_ = DevicePtr{1} << 40;
  std::map<DevicePtr, std::size_t> live_;
  std::size_t in_use_ = 0;
  std::size_t peak_in_use_ = 0;
  std::uint64_t attempts_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t releases_ = 0;
  std::uint64_t failed_ = 0;
  std::function<bool(std::uint64_t)> fail_;
  bool device_errors_ = false;
  bool releases_refused_ = false;
  std::size_t unmaps_allowed_ = kUnlimited;
  bool last_failed_by_injection_ = false;
  bool complete_at_once_ = true;
  bool contiguous_ = false;
  bool streams_idle_ = false;
  StreamId idle_stream_ = 0;
  bool virtual_memory_ = true;
  std::map<DevicePtr, std::size_t> reserved_;  // address space: base -> bytes
  std::set<DevicePtr> mapped_;                 // mapped pages
  std::uint64_t page_maps_ = 0;
  std::unordered_map<EventHandle, bool> events_;  // handle -> complete
  EventHandle next_event_ = 1;
  std::uint64_t event_records_ = 0;
  std::uint64_t stream_waits_ = 0;
  std::uint64_t event_queries_ = 0;
  std::uint64_t stream_queries_ = 0;
  std::uint64_t device_syncs_ = 0;
  StreamId failing_record_stream_ = 0;
  StreamId failing_wait_stream_ = 0;
  StreamId gone_stream_ = 0;
  bool last_failure_gone_ = false;
  // A stream call fails: false, having noted whether it named the gone stream.
  bool is_gone(StreamId stream) const { return gone_stream_ != 0 && stream == gone_stream_; }
  bool stream_call_fails(StreamId stream) {
    last_failure_gone_ = is_gone(stream);
    if (last_failure_gone_) ++gone_stream_calls_;
    return false;
  }
  std::uint64_t gone_stream_calls_ = 0;
  bool event_creation_fails_ = false;
  bool host_waits_fail_ = false;
  bool queries_fail_ = false;
  bool event_queries_fail_ = false;
  EventHandle failing_event_query_ = 0;
  StreamId lagging_stream_ = 0;
  bool capture_forbids_unsafe_calls_ = false;
  std::vector<Call> calls_;
  std::vector<EventHandle> refused_event_syncs_;
};

}  // namespace gpupool
