// How a request size becomes a block size, which pool serves it, and how big a
// segment to ask upstream for. PyTorch's rules, so that users' intuition (and
// their PYTORCH_CUDA_ALLOC_CONF) carries over.
#pragma once

#include <cstddef>

#include "pool/options.hpp"
#include "pool/types.hpp"

namespace gpupool {

inline constexpr std::size_t kMinBlockSize = 512;     // every block is a multiple
inline constexpr std::size_t kSmallSize = 1 * kMiB;   // largest small-pool block
inline constexpr std::size_t kLargeSplitRemainder = kSmallSize;  // see should_split
// Requests above this are refused outright: rounding them could overflow.
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 56;

inline std::size_t round_up(std::size_t n, std::size_t multiple) { return (n + multiple - 1) / multiple * multiple; }
inline std::size_t round_down(std::size_t n, std::size_t multiple) { return n / multiple * multiple; }

// The size a request of `size` bytes is served with (size <= kMaxRequest).
std::size_t round_size(std::size_t size, const RoundupDivisions& divisions);

// Which roundup_power2_divisions entry applies to a size.
int roundup_interval(std::size_t size);

// Rounds up to the next 1/divisions step between two powers of two.
std::size_t round_to_power2_division(std::size_t size, std::uint32_t divisions);

inline PoolKind pool_kind(std::size_t rounded) {
  return rounded <= kSmallSize ? PoolKind::Small : PoolKind::Large;
}

// Bytes to ask upstream for when no cached block fits a rounded request.
std::size_t segment_size(std::size_t rounded, const PoolOptions& options);

// Whether a free block of `block_size` serving `rounded` bytes is split, leaving
// the remainder cached. A large block keeps a remainder of up to 1 MiB (a
// small one would be stranded in the large pool) unless `fine_remainders`
// (see DevicePool::carve). `options` as the pool runs with them.
bool should_split(std::size_t block_size, std::size_t rounded, PoolKind kind,
                  const PoolOptions& options, bool fine_remainders = false);

}  // namespace gpupool
