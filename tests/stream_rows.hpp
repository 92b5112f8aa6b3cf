// Shared by the unit tests and the pool fuzzer: the report's stream rows hold
// every cached block once, so that they add up to the cache.
#pragma once

#include <cstddef>

#include "pool/device_pool.hpp"

namespace gpupool::testing {

inline bool stream_rows_cover_cache(const DevicePool& pool) {
  std::size_t blocks = 0;
  std::size_t bytes = 0;
  for (const StreamReport& r : pool.streams()) {
    blocks += r.cached_blocks;
    bytes += r.cached_bytes;
  }
  const Fragmentation cache = pool.fragmentation();
  return blocks == cache.free_blocks && bytes == cache.free_bytes;
}

}  // namespace gpupool::testing
