// Everything a report says, as plain data. The shim (and the replay tool) fill
// it from the pools; text and JSON are both produced from it, so they carry the
// same content.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pool/options.hpp"
#include "pool/stats.hpp"

namespace gpupool::report {

struct ConfigRow {
  std::string variable;
  std::string key;
  std::string value;
  std::string default_value;
  bool non_default() const { return value != default_value; }
};

struct LeakedBlock {
  DevicePtr addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  StreamId stream = kAnyStream;
};

// Allocations still live at exit that came from one call stack.
struct LeakSite {
  std::vector<std::string> frames;  // symbolized, innermost first
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
};

struct Leaks {
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  std::uint64_t requested_bytes = 0;  // what the program last asked for them
  std::vector<LeakedBlock> largest;  // a few, largest first
  std::vector<LeakSite> sites;       // with GPUPOOL_BACKTRACE=1, most bytes first
};

// Device resets (cudaDeviceReset, CUDA 12's cudaThreadExit, the driver's
// cuDevicePrimaryCtxReset) and the allocations still live at them,
// which the reset freed and the program never did.
struct Resets {
  std::uint64_t count = 0;
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  std::vector<LeakSite> sites;  // with GPUPOOL_BACKTRACE=1, most bytes first
};

struct DeviceReport {
  int device = 0;
  PoolOptions options;
  MemoryStats stats;
  Fragmentation fragmentation;          // now
  Fragmentation fragmentation_at_peak;  // when reserved memory peaked
  SizeHistogram requests;
  SizeHistogram free_blocks_at_peak;
  SizeHistogram free_blocks_now;
  std::vector<StreamReport> streams;
  std::vector<OomRecord> ooms;
  std::vector<TimelineSample> timeline;
  std::uint64_t timeline_stride = 1;
  Leaks leaks;
  Resets resets;
  std::size_t quarantined_bytes = 0;
  // Blocks kept in per-thread caches count as allocated in `stats`: a bound
  // on how many bytes that was at once (each thread's most, summed).
  std::int64_t thread_cache_kept_peak = 0;
  // GPUPOOL_THREAD_CACHE_SIZE, the stream-ordered frees into threads' caches,
  // those that found the cache full, and the blocks that went back to the
  // pool for want of room.
  std::size_t thread_cache_size = 0;
  std::int64_t thread_cache_keeps = 0;
  std::int64_t thread_cache_keeps_full = 0;
  std::int64_t thread_cache_let_go = 0;
};

struct Report {
  std::string program;
  long pid = 0;
  std::string reason = "exit";  // or "signal"
  double wall_seconds = 0.0;
  std::vector<ConfigRow> config;
  std::vector<std::string> config_problems;
  std::vector<std::string> config_notes;  // valid settings another setting makes ineffective
  std::vector<std::string> trace_problems;  // GPUPOOL_TRACE files not opened, cut short, or mixing devices
  // The call at which gpupool stepped aside and why; empty if it did not.
  std::string stepped_aside_call;
  std::string stepped_aside_reason;
  std::vector<DeviceReport> devices;
};

}  // namespace gpupool::report
