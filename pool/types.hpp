// Basic vocabulary of the pool: device addresses, streams and events are plain
// integers here, so that pool/ never needs a CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace gpupool {

using DevicePtr = std::uintptr_t;    // a device address; 0 is null
using StreamId = std::uintptr_t;     // a cudaStream_t value, or a pool-made id
using EventHandle = std::uintptr_t;  // an upstream event; 0 is "none"

// The consumer of plain cudaMalloc and the site of plain cudaFree: no stream is
// named, so the block may be used (or may have been used) on any stream.
inline constexpr StreamId kAnyStream = std::numeric_limits<StreamId>::max();

inline constexpr std::size_t kKiB = 1024;
inline constexpr std::size_t kMiB = 1024 * kKiB;
inline constexpr std::size_t kGiB = 1024 * kMiB;
inline constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

enum class PoolKind : std::uint8_t { Small = 0, Large = 1 };
inline constexpr int kPoolKinds = 2;

// How a stream is ordered against the others (CUDA's stream synchronization rules).
enum class StreamKind : std::uint8_t {
  Legacy,       // the legacy default stream: a barrier for all blocking streams
  Blocking,     // created without cudaStreamNonBlocking: ordered after legacy work
  NonBlocking,  // cudaStreamNonBlocking: no implicit ordering with anything
  PerThread,    // a thread's per-thread default stream: blocking, reachable only
                // from its own thread, so the pool never records on it from outside
};

}  // namespace gpupool
