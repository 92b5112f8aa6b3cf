#include "tools/replay.hpp"

#include <chrono>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "pool/device_pool.hpp"
#include "pool/virtual_upstream.hpp"
#include "report/collect.hpp"

namespace gpupool::tools {

namespace {

constexpr StreamId kLegacy = VirtualUpstream::kLegacy;
constexpr StreamId kIdleStreamBase = 0xffff'0000'0000'0000;

// The trace's 0x0 is the legacy default stream; other streams are taken as
// non-blocking (what PyTorch's stream pool creates).
StreamId pool_stream(StreamId trace_stream) { return trace_stream == 0 ? kLegacy : trace_stream; }

struct LiveBlock {
  DevicePtr ptr;
  StreamId stream;
};

}  // namespace

ReplayResult replay(const Trace& trace, const PoolOptions& options, std::size_t capacity, int passes,
                    bool find_peak_cause, bool plain, int idle_streams) {
  ReplayResult r;
  r.trace = trace.name;
  r.passes = passes;
  VirtualUpstream upstream(capacity);
  // A trace has no timing: model a device that keeps up, so that each event
  // finds the work queued before it complete (streams idle, events done).
  upstream.set_streams_idle(true);
  DevicePool pool(upstream, options, capacity);
  pool.stream_created(kLegacy, StreamKind::Legacy);
  std::unordered_set<StreamId> known{kLegacy};
  for (int i = 0; i < idle_streams; ++i) {
    // Far from any address a trace names as a stream.
    const StreamId idle = kIdleStreamBase + (static_cast<StreamId>(i) << 4);
    pool.stream_created(idle, StreamKind::NonBlocking);
    known.insert(idle);
  }
  std::unordered_map<std::uint64_t, LiveBlock> live;
  live.reserve(4096);
  std::uint64_t operations = 0;
  std::int64_t reserved_peak = 0;

  const auto start = std::chrono::steady_clock::now();
  MemoryStats before_last;
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == passes - 1 && passes > 1) before_last = pool.stats();
    for (std::size_t index = 0; index < trace.events.size(); ++index) {
      const TraceEvent& e = trace.events[index];
      const StreamId stream = plain ? kAnyStream : pool_stream(e.stream);
      if (!plain && known.insert(stream).second) pool.stream_created(stream, StreamKind::NonBlocking);
      switch (e.action) {
        case TraceEvent::Action::AllocateFailure:
          ++r.trace_failures;
          break;
        case TraceEvent::Action::Allocate: {
          ++r.allocations;
          ++operations;
          // One lookup: the entry is filled in once the pool has answered.
          const auto [it, added] = live.try_emplace(e.pointer, LiveBlock{0, stream});
          if (!added) {
            // The trace reuses a pointer it never freed: the free was lost
            // (the address was free again by then). Ours goes first.
            ++r.lost_frees;
            if (it->second.ptr != 0) pool.deallocate(it->second.ptr, it->second.stream);
          }
          const std::vector<StreamReport> before =
              find_peak_cause && reserved_peak == pool.stats().reserved_bytes[kAll].current ? pool.streams()
                                                                                           : std::vector<StreamReport>();
          const Allocation a = pool.allocate(e.size, stream);
          if (pool.stats().reserved_bytes[kAll].peak > reserved_peak) {
            reserved_peak = pool.stats().reserved_bytes[kAll].peak;
            r.peak_cause = ReplayResult::PeakCause{index, pass, e.size, stream, before};
          }
          // A failure (counted by the pool as an out-of-memory) stays live with
          // no block, so that the trace's free of it is no unknown free.
          it->second = LiveBlock{a.ok ? a.ptr : 0, stream};
          break;
        }
        case TraceEvent::Action::Free: {
          auto it = live.find(e.pointer);
          if (it == live.end()) {
            ++r.unknown_frees;
            break;
          }
          ++r.frees;
          ++operations;
          if (it->second.ptr != 0) pool.deallocate(it->second.ptr, stream);
          live.erase(it);
          break;
        }
      }
    }
    for (const auto& [pointer, block] : live) {
      if (block.ptr != 0) pool.deallocate(block.ptr, block.stream);
    }
    live.clear();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const MemoryStats& s = pool.stats();
  r.peak_live = static_cast<std::size_t>(s.requested_bytes[kAll].peak);
  r.peak_reserved = static_cast<std::size_t>(s.reserved_bytes[kAll].peak);
  // The pool's figure is checked against the device's own count: every
  // memory comparison the replay makes rests on it.
  if (r.peak_reserved != upstream.peak_in_use()) {
    throw std::logic_error(trace.name + ": the pool counted a peak of " + std::to_string(r.peak_reserved) +
                           " bytes reserved, the device " + std::to_string(upstream.peak_in_use()));
  }
  r.upstream_mallocs = s.num_device_alloc;
  if (passes > 1) {
    r.last_pass = ReplayResult::DeviceCalls{s.num_page_maps - before_last.num_page_maps,
                                            s.num_page_unmaps - before_last.num_page_unmaps,
                                            s.num_device_alloc - before_last.num_device_alloc,
                                            s.num_device_free - before_last.num_device_free};
  }
  r.ooms = s.num_ooms;
  r.external_fragmentation_at_peak = pool.fragmentation_at_peak().external;
  r.ns_per_op = operations == 0 ? 0.0 : seconds * 1e9 / static_cast<double>(operations);
  r.device = report::collect(pool, 0);
  r.events_recorded = upstream.event_records();
  r.event_queries = upstream.event_queries();
  r.stream_waits = upstream.stream_waits();
  r.stream_queries = upstream.stream_queries();
  for (const StreamReport& stream : r.device.streams) {
    if (stream.id == kAnyStream) r.barriers = stream.counters.fences_recorded;
  }
  return r;
}

}  // namespace gpupool::tools
