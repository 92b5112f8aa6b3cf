#include "pool/size_rules.hpp"

#include <bit>

namespace gpupool {

namespace {
constexpr int kLog2OneMiB = 20;
}  // namespace

int roundup_interval(std::size_t size) {
  const int log_size = static_cast<int>(std::bit_width(size)) - 1;
  const int index = log_size - kLog2OneMiB;
  if (index < 0) return 0;
  return index >= kRoundupIntervals ? kRoundupIntervals - 1 : index;
}

std::size_t round_to_power2_division(std::size_t size, std::uint32_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  // divisions is a power of two (config enforces it); each step is floor/divisions.
  const std::size_t step = floor >> (std::bit_width(divisions) - 1);
  if (step == 0) return floor << 1;
  const std::size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

std::size_t round_size(std::size_t size, const RoundupDivisions& divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::uint32_t div = divisions[roundup_interval(size)];
  if (div > 1 && size > kMinBlockSize * div) {
    return round_to_power2_division(size, div);
  }
  return round_up(size, kMinBlockSize);
}

std::size_t segment_size(std::size_t rounded, const PoolOptions& options) {
  if (rounded <= kSmallSize) return options.small_segment_size;
  if (rounded < options.large_segment_size / 2) return options.large_segment_size;
  return round_up(rounded, options.large_segment_rounding);
}

bool should_split(std::size_t block_size, std::size_t rounded, PoolKind kind,
                  const PoolOptions& options, bool fine_remainders) {
  const std::size_t remaining = block_size - rounded;
  if (kind == PoolKind::Small || fine_remainders) return remaining >= kMinBlockSize;
  return rounded < options.max_split_size && remaining > kLargeSplitRemainder;
}

}  // namespace gpupool
