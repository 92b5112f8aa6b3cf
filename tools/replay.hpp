// Replays an allocation trace through the real pool over a VirtualUpstream:
// no device memory is touched, so traces of 80 GB workloads replay anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pool/options.hpp"
#include "pool/stats.hpp"
#include "report/report_data.hpp"
#include "tools/trace.hpp"

namespace gpupool::tools {

struct ReplayResult {
  std::string trace;
  int passes = 1;
  std::uint64_t allocations = 0;    // allocate events replayed
  std::uint64_t frees = 0;
  std::uint64_t unknown_frees = 0;  // frees of pointers not live in the replay: counted, skipped
  std::uint64_t lost_frees = 0;     // allocations of pointers still live: the earlier block freed first
  std::uint64_t trace_failures = 0; // "allocate failure" lines: the original run's, not replayed
  std::size_t peak_live = 0;        // the most requested bytes live at once
  std::size_t peak_reserved = 0;
  std::int64_t upstream_mallocs = 0;
  std::int64_t ooms = 0;
  double external_fragmentation_at_peak = 0.0;
  double ns_per_op = 0.0;
  // Driver calls the ordering would make on a GPU: events recorded (fences,
  // and the events of each device barrier) and queried, streams made to wait
  // for events and asked whether idle; and device barriers.
  std::uint64_t events_recorded = 0;
  std::uint64_t event_queries = 0;
  std::uint64_t stream_waits = 0;
  std::uint64_t stream_queries = 0;
  std::uint64_t barriers = 0;
  // What the last of several passes asked of the device: a training loop
  // past its first steps would pay it at every step (0 with one pass).
  struct DeviceCalls {
    std::int64_t page_maps = 0;
    std::int64_t page_unmaps = 0;
    std::int64_t mallocs = 0;
    std::int64_t frees = 0;
    std::int64_t total() const { return page_maps + page_unmaps + mallocs + frees; }
  } last_pass;
  report::DeviceReport device;      // the pool's state at the end, for details
  // The request that last raised the reserved peak, and the cache right then.
  struct PeakCause {
    std::uint64_t event = 0;  // index in the trace (last pass)
    int pass = 0;
    std::size_t size = 0;
    StreamId stream = 0;
    std::vector<StreamReport> cached;  // per stream: cached blocks and bytes
  } peak_cause;
  double ratio() const { return peak_live == 0 ? 0.0 : static_cast<double>(peak_reserved) / static_cast<double>(peak_live); }
};

// `passes` times back to back; blocks still live at the end of a pass are
// freed before the next (a trace's start re-allocates what was live before it).
// With `find_peak_cause`, also records the request that raised the reserved
// peak and the cache at that moment (slower: it snapshots at each new peak).
// With `plain`, every allocation and free is replayed as plain cudaMalloc and
// cudaFree (no stream): what a program under PYTORCH_NO_CUDA_MEMORY_CACHING=1
// calls, where each reuse must be ordered by the device barrier.
// `idle_streams` non-blocking streams exist from the start and are never
// used, as PyTorch's stream pool (32 per priority level) once a program asks
// for one side stream: every device barrier orders each of them.
// Throws std::logic_error where the pool's peak reserved is not the peak the
// simulated device counted (a bug in the pool's figures).
ReplayResult replay(const Trace& trace, const PoolOptions& options, std::size_t capacity, int passes,
                    bool find_peak_cause = false, bool plain = false, int idle_streams = 0);

}  // namespace gpupool::tools
