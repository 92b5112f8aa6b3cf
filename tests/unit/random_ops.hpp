// For the random tests that check no allocation holds a byte whose earlier
// work may still run: which bytes were last freed by what, and the live
// blocks to free next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include <catch2/catch.hpp>

#include "pool/types.hpp"

namespace gpupool::testing {

// A random test's seed: its own fixed one, moved by Catch's --rng-seed (0 by
// default), so that `gpupool_unit_tests "[random]" --rng-seed N` looks at
// other sequences than the suite's (`scripts/soak SECONDS BUILD random` runs many).
// The move is N times an odd constant, not N: tests whose fixed seeds differ
// by d would otherwise run each other's sequences at --rng-seed d.
inline std::uint64_t test_seed(std::uint64_t fixed) {
  return fixed + Catch::rngSeed() * std::uint64_t{0x9E3779B97F4A7C15};
}

// Disjoint ranges of used device memory, each with what the test noted of
// its free.
template <typename Info>
class FreedRanges {
 public:
  void freed(DevicePtr begin, DevicePtr end, const Info& info) {
    forget(begin, end);
    ranges_.emplace(begin, Range{end, info});
  }

  // [begin, end) is in use again: calls each(start, info) for every range
  // that overlaps it, then forgets those bytes (what lies outside is kept).
  template <typename Each>
  void reused(DevicePtr begin, DevicePtr end, Each&& each) {
    for (auto it = first_overlapping(ranges_, begin); it != ranges_.end() && it->first < end; ++it) {
      each(it->first, it->second.info);
    }
    forget(begin, end);
  }

 private:
  void forget(DevicePtr begin, DevicePtr end) {
    auto it = first_overlapping(ranges_, begin);
    while (it != ranges_.end() && it->first < end) {
      const DevicePtr start = it->first;
      const Range r = it->second;
      it = ranges_.erase(it);
      if (start < begin) ranges_.emplace(start, Range{begin, r.info});
      if (r.end > end) ranges_.emplace(end, Range{r.end, r.info});
    }
  }

  struct Range {
    DevicePtr end;
    Info info;
  };
  using Map = std::map<DevicePtr, Range>;

  template <typename M>  // Map or const Map
  static auto first_overlapping(M& ranges, DevicePtr begin) {
    auto it = ranges.lower_bound(begin);
    if (it != ranges.begin() && std::prev(it)->second.end > begin) --it;
    return it;
  }

  Map ranges_;
};

// Removes and returns one element, at random (the order is not kept).
template <typename T, typename Rng>
T take_any(std::vector<T>& items, Rng& rng) {
  const std::size_t i = rng() % items.size();
  const T item = items[i];
  items[i] = items.back();
  items.pop_back();
  return item;
}

}  // namespace gpupool::testing
