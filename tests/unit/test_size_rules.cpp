#include <catch2/catch.hpp>

#include "pool/size_rules.hpp"

using namespace gpupool;

namespace {
RoundupDivisions all(std::uint32_t d) {
  RoundupDivisions r{};
  r.fill(d);
  return r;
}
}  // namespace

TEST_CASE("requests round to 512-byte multiples with a 512-byte minimum") {
  const RoundupDivisions none{};
  CHECK(round_size(1, none) == 512);
  CHECK(round_size(511, none) == 512);
  CHECK(round_size(512, none) == 512);
  CHECK(round_size(513, none) == 1024);
  CHECK(round_size(1000000, none) == 1000448);
  CHECK(round_size(kMiB, none) == kMiB);
}

TEST_CASE("rounded sizes up to 1 MiB go to the small pool, larger to the large pool") {
  CHECK(pool_kind(512) == PoolKind::Small);
  CHECK(pool_kind(kMiB) == PoolKind::Small);
  CHECK(pool_kind(kMiB + 512) == PoolKind::Large);
}

TEST_CASE("segment sizes follow PyTorch: 2 MiB, 20 MiB, or the request rounded to 2 MiB") {
  const PoolOptions o;
  CHECK(segment_size(512, o) == 2 * kMiB);
  CHECK(segment_size(kMiB, o) == 2 * kMiB);
  CHECK(segment_size(kMiB + 512, o) == 20 * kMiB);
  CHECK(segment_size(10 * kMiB - 512, o) == 20 * kMiB);
  CHECK(segment_size(10 * kMiB, o) == 10 * kMiB);
  CHECK(segment_size(10 * kMiB + 512, o) == 12 * kMiB);
  CHECK(segment_size(33 * kMiB, o) == 34 * kMiB);
}

TEST_CASE("configured segment sizes move the thresholds with them") {
  PoolOptions o;
  o.small_segment_size = 4 * kMiB;
  o.large_segment_size = 64 * kMiB;
  CHECK(segment_size(kMiB, o) == 4 * kMiB);
  CHECK(segment_size(30 * kMiB, o) == 64 * kMiB);
  CHECK(segment_size(32 * kMiB, o) == 32 * kMiB);
}

TEST_CASE("split rules: small remainder >= 512 B, large remainder > 1 MiB and below max_split") {
  PoolOptions o;
  CHECK(should_split(2 * kMiB, 2 * kMiB - 512, PoolKind::Small, o));
  CHECK_FALSE(should_split(1024, 1024, PoolKind::Small, o));
  CHECK(should_split(20 * kMiB, 2 * kMiB, PoolKind::Large, o));
  CHECK_FALSE(should_split(3 * kMiB, 2 * kMiB, PoolKind::Large, o));  // remainder exactly 1 MiB
  CHECK(should_split(3 * kMiB + 512, 2 * kMiB, PoolKind::Large, o));
  o.max_split_size = 8 * kMiB;
  CHECK(should_split(20 * kMiB, 4 * kMiB, PoolKind::Large, o));
  CHECK_FALSE(should_split(20 * kMiB, 8 * kMiB, PoolKind::Large, o));
}

TEST_CASE("split rules with fine remainders: any remainder of 512 B or more, large or small") {
  PoolOptions o;
  o.expandable_segments = true;
  CHECK_FALSE(should_split(3 * kMiB, 2 * kMiB, PoolKind::Large, o));  // 1 MiB: kept whole unless asked
  CHECK(should_split(3 * kMiB, 2 * kMiB, PoolKind::Large, o, true));
  CHECK(should_split(2 * kMiB + 512, 2 * kMiB, PoolKind::Large, o, true));
  CHECK_FALSE(should_split(2 * kMiB + 512, 2 * kMiB + 512, PoolKind::Large, o, true));
  CHECK(should_split(2 * kMiB, 2 * kMiB - 512, PoolKind::Small, o, true));
}

TEST_CASE("roundup_power2_divisions rounds to the next 1/N step between powers of two") {
  CHECK(round_to_power2_division(1200 * kMiB, 4) == 1280 * kMiB);
  CHECK(round_to_power2_division(1024 * kMiB, 4) == 1024 * kMiB);
  CHECK(round_to_power2_division(1280 * kMiB, 4) == 1280 * kMiB);
  CHECK(round_to_power2_division(1281 * kMiB, 4) == 1536 * kMiB);
  CHECK(round_to_power2_division(1100, 2) == 1536);
  CHECK(round_size(1200 * kMiB, all(4)) == 1280 * kMiB);
  // Small sizes (not above 512 * divisions) keep 512-byte rounding.
  CHECK(round_size(1500, all(4)) == 1536);
  CHECK(round_size(2100, all(4)) == 2560);
  CHECK(round_size(2100, all(0)) == 2560);
  CHECK(round_size(3 * kMiB + 1, all(1)) == 3 * kMiB + 512);
}

TEST_CASE("roundup intervals start at 1 MiB and saturate at the last entry") {
  CHECK(roundup_interval(512) == 0);
  CHECK(roundup_interval(kMiB) == 0);
  CHECK(roundup_interval(2 * kMiB) == 1);
  CHECK(roundup_interval(3 * kMiB) == 1);
  CHECK(roundup_interval(256 * kMiB) == 8);
  CHECK(roundup_interval(std::size_t{1} << 50) == kRoundupIntervals - 1);
  RoundupDivisions d{};
  d[8] = 2;  // only [256 MiB, 512 MiB)
  CHECK(round_size(300 * kMiB, d) == 384 * kMiB);
  CHECK(round_size(600 * kMiB, d) == 600 * kMiB);
}
