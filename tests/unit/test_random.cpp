// A million-plus random operations over several seeds and configurations. After
// every operation: the new block is aligned, inside a live upstream segment and
// overlaps no live block; every few hundred operations (and at the end) every
// invariant of the pool is checked and the statistics are matched against the
// test's own accounting.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"
#include "pool/virtual_upstream.hpp"
#include "random_ops.hpp"

using namespace gpupool;

namespace {

struct Config {
  const char* name;
  PoolOptions options;
  std::size_t capacity;
  std::uint64_t seed;
};

std::vector<Config> configs() {
  std::vector<Config> out;
  out.push_back({"defaults", PoolOptions{}, kUnlimited, 1});
  PoolOptions split;
  split.max_split_size = 32 * kMiB;
  split.max_non_split_rounding = 8 * kMiB;
  out.push_back({"max_split_size 32 MiB", split, 2 * kGiB, 2});
  PoolOptions rounding;
  rounding.roundup_divisions.fill(4);
  out.push_back({"roundup_power2_divisions 4", rounding, kUnlimited, 3});
  PoolOptions tight;
  tight.garbage_collection_threshold = 0.6;
  tight.memory_limit = 768 * kMiB;
  out.push_back({"gc 0.6, limit 768 MiB", tight, kUnlimited, 4});
  PoolOptions never;
  never.cross_stream_reuse = CrossStreamReuse::Never;
  out.push_back({"cross-stream never, small device", never, 512 * kMiB, 5});
  PoolOptions completed;
  completed.cross_stream_reuse = CrossStreamReuse::Completed;
  completed.small_segment_size = 4 * kMiB;
  completed.large_segment_size = 32 * kMiB;
  out.push_back({"cross-stream completed, other segment sizes", completed, kUnlimited, 6});
  PoolOptions expandable;
  expandable.expandable_segments = true;
  out.push_back({"expandable segments, recycling", expandable, 6 * kGiB, 7});
  PoolOptions expandable_tight = expandable;
  expandable_tight.recycle_pages = false;
  expandable_tight.max_split_size = 48 * kMiB;
  expandable_tight.garbage_collection_threshold = 0.7;
  expandable_tight.memory_limit = kGiB;
  out.push_back({"expandable segments, no recycling, gc, split limit", expandable_tight, kUnlimited, 8});
  return out;
}

constexpr StreamId kStreams[] = {kAnyStream, 0x1000, 0x2000, 0x3000, 0x12};

std::size_t random_size(std::mt19937_64& rng) {
  const std::uint64_t r = rng() % 100;
  if (r < 55) return 1 + rng() % 4096;                   // tiny
  if (r < 80) return 4096 + rng() % kMiB;                // small pool
  if (r < 95) return kMiB + rng() % (16 * kMiB);         // large, shared segments
  return 16 * kMiB + rng() % (96 * kMiB);                // large, own segments
}

struct Live {
  std::size_t size;
  StreamId stream;
};

void run(const Config& c, int operations) {
  VirtualUpstream upstream(c.capacity);
  DevicePool pool(upstream, c.options, 4 * kGiB);
  pool.stream_created(0x1000, StreamKind::Blocking);
  pool.stream_created(0x2000, StreamKind::Blocking);
  pool.stream_created(0x3000, StreamKind::NonBlocking);
  pool.stream_created(0x12, StreamKind::PerThread);
  std::mt19937_64 rng(testing::test_seed(c.seed));
  std::map<DevicePtr, Live> live;
  std::vector<DevicePtr> order;  // for picking a random live block
  std::int64_t requested = 0;
  std::int64_t failures = 0;
  std::string why;

  for (int op = 0; op < operations; ++op) {
    const std::uint64_t dice = rng() % 1000;
    const bool do_alloc = live.empty() || (dice < 520 && live.size() < 4000);
    if (dice == 999) {
      pool.release_cached();
    } else if (dice == 998) {
      upstream.complete_all();
    } else if (dice == 997) {
      upstream.set_events_complete_at_once(rng() % 2 == 0);
    } else if (do_alloc) {
      const std::size_t size = random_size(rng);
      const StreamId stream = kStreams[rng() % 5];
      const Allocation a = pool.allocate(size, stream);
      if (!a.ok) {
        ++failures;
        continue;
      }
      REQUIRE(a.ptr % 512 == 0);
      REQUIRE(upstream.covers(a.ptr, size));
      auto next = live.lower_bound(a.ptr);
      if (next != live.end()) REQUIRE(a.ptr + size <= next->first);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        REQUIRE(prev->first + prev->second.size <= a.ptr);
      }
      live.emplace(a.ptr, Live{size, stream});
      order.push_back(a.ptr);
      requested += static_cast<std::int64_t>(size);
    } else {
      const std::size_t i = rng() % order.size();
      const DevicePtr ptr = order[i];
      order[i] = order.back();
      order.pop_back();
      const Live l = live.at(ptr);
      // Mostly freed where allocated, sometimes elsewhere (legal in CUDA).
      const StreamId site = rng() % 4 == 0 ? kStreams[rng() % 5] : l.stream;
      REQUIRE(pool.deallocate(ptr, site) == FreeResult::Freed);
      live.erase(ptr);
      requested -= static_cast<std::int64_t>(l.size);
    }
    if (op % 499 == 0 || op + 1 == operations) {
      INFO(c.name << ", operation " << op);
      const bool ok = pool.validate(&why);
      INFO(why);
      REQUIRE(ok);
      REQUIRE(pool.stats().requested_bytes[kAll].current == requested);
      REQUIRE(pool.stats().allocation[kAll].current == static_cast<std::int64_t>(live.size()));
      REQUIRE(upstream.in_use() == static_cast<std::size_t>(pool.stats().reserved_bytes[kAll].current));
      REQUIRE(upstream.mapped_pages() * VirtualUpstream::kPage <= upstream.in_use());
    }
  }
  // Free everything: free neighbours stay apart only while they hold pending
  // work of different streams (validate checks that); once it is all done,
  // releasing merges them and every fixed segment goes back whole.
  for (const auto& [ptr, l] : live) REQUIRE(pool.deallocate(ptr, l.stream) == FreeResult::Freed);
  REQUIRE(pool.validate(&why));
  upstream.complete_all();
  pool.release_cached();
  REQUIRE(pool.validate(&why));
  // Fixed segments all go back; expandable ones keep only partial pages.
  if (!c.options.expandable_segments) REQUIRE(upstream.in_use() == 0);
  REQUIRE(upstream.in_use() == static_cast<std::size_t>(pool.stats().reserved_bytes[kAll].current));
  // The reserved peak the report gives is the most the device ever lent.
  REQUIRE(upstream.peak_in_use() == static_cast<std::size_t>(pool.stats().reserved_bytes[kAll].peak));
  REQUIRE(pool.stats().num_ooms == failures);
}

}  // namespace

TEST_CASE("a million random operations keep every invariant", "[random]") {
  constexpr int kOperationsPerConfig = 200000;
  for (const Config& c : configs()) {
    SECTION(c.name) { run(c, kOperationsPerConfig); }
  }
}
