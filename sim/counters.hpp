// Upstream call counters of the simulated runtime, read by tests through
// simcuda_get_counters() or, at exit, from the file SIMCUDA_COUNTERS_FILE names.
#pragma once

#include <atomic>
#include <cstdint>

namespace simcuda {

struct Counters {
  std::atomic<std::uint64_t> malloc_calls{0}, malloc_failures{0}, free_calls{0},
      malloc_async_calls{0}, free_async_calls{0}, bytes_in_use{0}, peak_bytes_in_use{0},
      event_records{0}, stream_waits{0}, event_queries{0}, event_syncs{0}, stream_syncs{0},
      device_syncs{0}, legacy_ops{0}, captures_begun{0}, captures_invalidated{0},
      kernel_launches{0}, vmm_maps{0}, vmm_unmaps{0}, stale_event_uses{0}, null_free_calls{0},
      event_failures{0}, host_wait_failures{0}, event_query_failures{0}, get_device_calls{0},
      destroyed_stream_calls{0}, unmap_failures{0}, worker_wakeups{0};
  // A gauge, not a count: the engine's streams_ (see Engine), kept here so
  // that reading it takes no lock (a forked child's exit reads the counters,
  // and a thread of the parent may have held the engine's lock at the fork).
  std::atomic<std::uint64_t> streams_tracked{0};
};

Counters& counters();

}  // namespace simcuda
