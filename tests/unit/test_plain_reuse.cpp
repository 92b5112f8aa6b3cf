// Plain cudaMalloc taking the part of a free block that the last device
// barrier covers (pool/plain_reuse.cpp): fewer barriers, never an unordered
// byte, and the placements that keep memory low left as they were.
#include <random>
#include <set>

#include "random_ops.hpp"
#include "pool_fixture.hpp"

using namespace gpupool;
using gpupool::testing::FreedRanges;
using gpupool::testing::test_seed;
using gpupool::testing::take_any;
using gpupool::testing::PoolFixture;

namespace {

// The counters of the device's own row: plain allocations and frees.
StreamCounters device_counters(const DevicePool& pool) {
  for (const StreamReport& s : pool.streams()) {
    if (s.id == kAnyStream) return s.counters;
  }
  return StreamCounters{};
}

std::uint64_t barriers(const DevicePool& pool) { return device_counters(pool).fences_recorded; }

// Frees of plain blocks until now are covered by a barrier: one is recorded
// by reusing, whole, a small block freed after them (its segment is full).
void cover_frees_so_far(PoolFixture& f) {
  const std::uint64_t before = barriers(*f.pool);
  const DevicePtr p = f.alloc(kMiB);
  f.alloc(kMiB);
  f.release(p);
  REQUIRE(f.alloc(kMiB) == p);
  REQUIRE(barriers(*f.pool) == before + 1);
}

// A 32 MiB block freed since the last barrier (hot), and a 128 MiB one the
// barrier covers, each its own segment (no merging).
struct HotAndCovered {
  DevicePtr exact;
  DevicePtr larger;
};
HotAndCovered hot_block_beside_covered_larger(PoolFixture& f) {
  const DevicePtr exact = f.alloc(32 * kMiB);
  const DevicePtr larger = f.alloc(128 * kMiB);
  f.release(larger);
  cover_frees_so_far(f);
  f.release(exact);
  return {exact, larger};
}

}  // namespace

TEST_CASE_METHOD(PoolFixture, "a loop of plain pairs records one barrier per sweep, not per pair") {
  options.expandable_segments = GENERATE(false, true);
  upstream.set_virtual_memory(true);
  make();
  upstream.set_events_complete_at_once(false);  // only barriers can order reuse
  release(alloc(64 * kMiB));
  const std::size_t sizes[] = {3 * kMiB, 5 * kMiB, 2 * kMiB, 7 * kMiB, 4 * kMiB, 6 * kMiB};
  const std::uint64_t before = barriers(*pool);
  constexpr int kPairs = 300;
  for (int i = 0; i < kPairs; ++i) release(alloc(sizes[i % 6]));
  // 4.5 MiB on average: about 13 pairs per sweep through 64 MiB.
  const std::uint64_t recorded = barriers(*pool) - before;
  CHECK(recorded >= kPairs / 16);
  CHECK(recorded <= kPairs / 10);
  CHECK(pool->stats().reserved_bytes[kAll].peak == static_cast<std::int64_t>(64 * kMiB));  // no growth
}

TEST_CASE_METHOD(PoolFixture, "a loop of one size sweeps where its block has room for 8 more, else goes back to its place") {
  // A scratch buffer taken and freed at every call: its free block nearly all
  // covered, one barrier a pair would be for the few bytes just freed.
  options.expandable_segments = GENERATE(false, true);
  upstream.set_virtual_memory(true);
  make();
  upstream.set_events_complete_at_once(false);  // only barriers can order reuse
  const bool room = GENERATE(true, false);
  // In a 2 MiB segment: room for 24 more, or for 3.
  const std::size_t size = room ? 80 * kKiB : 512 * kKiB;
  release(alloc(size));
  const std::uint64_t before = barriers(*pool);
  constexpr int kPairs = 250;
  std::set<DevicePtr> places;
  for (int i = 0; i < kPairs; ++i) {
    const DevicePtr p = alloc(size);
    places.insert(p);
    release(p);
  }
  const std::uint64_t recorded = barriers(*pool) - before;
  if (room) {
    CHECK(recorded >= kPairs / 32);  // one a sweep of 25 pairs
    CHECK(recorded <= kPairs / 16);
    CHECK(places.size() >= 16);
  } else {
    CHECK(recorded == kPairs);
    CHECK(places.size() == 1);
  }
  CHECK(pool->stats().reserved_bytes[kAll].peak == static_cast<std::int64_t>(2 * kMiB));  // no growth
  check();
}

TEST_CASE_METHOD(PoolFixture, "a block freed and asked for again at its size goes back where it was") {
  make();
  const DevicePtr region = alloc(128 * kMiB);
  release(region);
  cover_frees_so_far(*this);
  const DevicePtr a = alloc(32 * kMiB);
  CHECK(a == region);  // covered: the front, with no barrier
  release(a);
  const std::uint64_t before = barriers(*pool);
  SECTION("the same size: its place again, after a barrier") {
    CHECK(alloc(32 * kMiB) == a);
    CHECK(barriers(*pool) == before + 1);
  }
  SECTION("a size it fits as well as a best fit would") {
    CHECK(alloc(29 * kMiB) == a);
    CHECK(barriers(*pool) == before + 1);
  }
  SECTION("a smaller request takes the covered memory above it, with no barrier") {
    CHECK(alloc(16 * kMiB) == a + 32 * kMiB);
    CHECK(barriers(*pool) == before);
  }
}

TEST_CASE_METHOD(PoolFixture, "requests over 64 MiB keep their place and take a barrier") {
  make();
  const DevicePtr region = alloc(512 * kMiB);
  release(region);
  cover_frees_so_far(*this);
  release(alloc(96 * kMiB));
  const std::uint64_t before = barriers(*pool);
  const DevicePtr p = alloc(80 * kMiB);
  CHECK(p == region);
  CHECK(barriers(*pool) == before + 1);
  release(p);
  CHECK(alloc(64 * kMiB) == p + 80 * kMiB);  // 64 MiB still skips the 80 MiB freed
  CHECK(barriers(*pool) == before + 1);
}

TEST_CASE_METHOD(PoolFixture, "plain_reuse_search takes a larger block's covered memory instead of a barrier") {
  const std::uint32_t search = GENERATE(0u, 1u, 16u);
  options.plain_reuse_search = search;
  make();
  const auto [exact, larger] = hot_block_beside_covered_larger(*this);
  const std::uint64_t before = barriers(*pool);
  SECTION("a covered larger block serves, where the search is on") {
    const DevicePtr p = alloc(32 * kMiB);
    CHECK(p == (search > 0 ? larger : exact));
    CHECK(barriers(*pool) == before + (search > 0 ? 0 : 1));
  }
  SECTION("none covered: the best fit after a barrier, as without the search") {
    release(alloc(128 * kMiB));  // the larger block, hot again
    const std::uint64_t now = barriers(*pool);
    CHECK(alloc(32 * kMiB) == exact);
    CHECK(barriers(*pool) == now + 1);
  }
  std::string why;
  CHECK(pool->validate(&why));
  INFO(why);
}

namespace {
std::uint64_t searched(const DevicePool& pool) { return device_counters(pool).searched_reuses; }
}  // namespace

TEST_CASE_METHOD(PoolFixture, "plain_reuse_search on auto searches only beside many non-blocking streams") {
  REQUIRE(options.plain_reuse_search == PoolOptions::kSearchAuto);  // the default
  const bool off = GENERATE(false, true);  // or set to 0
  if (off) options.plain_reuse_search = 0;
  make();
  // One stream short of turning it on, then a blocking one, which no barrier asks.
  StreamId next = 0x1000;
  for (std::size_t i = 0; i + 1 < PoolOptions::kAutoSearchStreams; ++i) {
    pool->stream_created(next++, StreamKind::NonBlocking);
  }
  pool->stream_created(next++, StreamKind::Blocking);
  const auto [exact, larger] = hot_block_beside_covered_larger(*this);
  const std::uint64_t before = barriers(*pool);
  SECTION("too few: the best fit, after a barrier") {
    CHECK(alloc(32 * kMiB) == exact);
    CHECK(barriers(*pool) == before + 1);
    CHECK(searched(*pool) == 0);
  }
  SECTION("enough: a larger block's covered memory, and no barrier (unless set to 0)") {
    pool->stream_created(next++, StreamKind::NonBlocking);
    CHECK(alloc(32 * kMiB) == (off ? exact : larger));
    CHECK(barriers(*pool) == before + (off ? 1 : 0));
    CHECK(searched(*pool) == (off ? 0 : 1));
  }
  SECTION("enough once, then one destroyed: off again") {
    pool->stream_created(next, StreamKind::NonBlocking);
    pool->stream_destroying(next);
    CHECK(alloc(32 * kMiB) == exact);
    CHECK(barriers(*pool) == before + 1);
  }
  std::string why;
  CHECK(pool->validate(&why));
  INFO(why);
}

TEST_CASE_METHOD(PoolFixture, "a split keeps each part's hot bytes, and a merge joins them") {
  make();
  const DevicePtr region = alloc(64 * kMiB);
  release(region);
  cover_frees_so_far(*this);
  const DevicePtr low = alloc(8 * kMiB);   // covered: at the front
  const DevicePtr mid = alloc(8 * kMiB);
  const DevicePtr high = alloc(8 * kMiB);
  REQUIRE(mid == low + 8 * kMiB);
  REQUIRE(high == mid + 8 * kMiB);
  release(mid);                             // hot: [mid, mid + 8 MiB)
  release(high);                            // merges with mid and the covered rest
  alloc(1000);
  const std::uint64_t before = barriers(*pool);
  // The hot bytes are [mid, high + 8 MiB): 16 MiB from mid; 4 MiB fits above them.
  CHECK(alloc(4 * kMiB) == high + 8 * kMiB);
  CHECK(barriers(*pool) == before);
  release(low);  // hot [low, high + 8 MiB) now, with the 4 MiB above still live
  alloc(1000);
  CHECK(alloc(24 * kMiB) == low);  // a near-exact fit of the hot bytes, freed a while ago
  CHECK(barriers(*pool) == before + 1);
}

// Every plain allocation is checked against a model of the device: each byte
// the program used remembers the operation that freed it, and a plain
// allocation may hold it only if a barrier was recorded after that free.
// Events complete only when the test says the device caught up, which makes
// every free before it safe too.
TEST_CASE_METHOD(PoolFixture, "during a capture, covered bytes are taken only once their work is done") {
  // A barrier orders streams as they are now; what a capture puts in a graph
  // runs whenever the graph is launched, so during a capture only completed
  // work counts. low's bytes are covered by a barrier that has not completed,
  // and they stay cold after high, freed later, joins them.
  make();
  pool->stream_created(0x1000, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr low = alloc(8 * kMiB);
  const DevicePtr high = alloc(8 * kMiB);
  REQUIRE(high == low + 8 * kMiB);
  release(low);
  cover_frees_so_far(*this);
  release(high);
  pool->capture_began(0x1000);
  upstream.clear_calls();
  const DevicePtr during = alloc(8 * kMiB);
  CHECK(during != low);
  CHECK(upstream.calls().empty());  // nothing recorded during the capture
  pool->capture_ended(0x1000);
  release(during);  // its segment whole again: low's comes first
  upstream.complete_all();
  upstream.clear_calls();
  CHECK(alloc(8 * kMiB) == low);
  CHECK(upstream.calls().empty());  // the old barrier covers it
}

TEST_CASE("no plain allocation holds a byte freed after the last barrier", "[random]") {
  const bool expandable = GENERATE(false, true);
  const std::uint32_t search = GENERATE(0u, 16u);
  PoolOptions options;
  options.expandable_segments = expandable;
  options.plain_reuse_search = search;
  VirtualUpstream upstream;
  upstream.set_virtual_memory(true);
  upstream.set_events_complete_at_once(false);
  DevicePool pool(upstream, options, 8 * kGiB);
  constexpr StreamId kStreams[] = {kAnyStream, kAnyStream, kAnyStream, 0x1000, 0x2000};
  pool.stream_created(0x1000, StreamKind::Blocking);
  pool.stream_created(0x2000, StreamKind::NonBlocking);
  std::mt19937_64 rng(test_seed((expandable ? 11 : 12) + search));

  FreedRanges<std::uint64_t> freed;  // used bytes: the operation that freed them
  struct Live {
    DevicePtr ptr;
    std::size_t size;
    StreamId stream;
  };
  std::vector<Live> live;
  std::uint64_t barrier_op = 0;  // the operation during which the last barrier was recorded
  std::uint64_t last_barriers = 0;
  std::uint64_t checked_ranges = 0;
  std::string why;

  auto note_barriers = [&](std::uint64_t op) {
    const std::uint64_t now = barriers(pool);
    if (now != last_barriers) barrier_op = op;
    last_barriers = now;
  };
  for (std::uint64_t op = 1; op <= 200000; ++op) {
    const std::uint64_t dice = rng() % 1000;
    if (dice < 2) {
      upstream.complete_all();  // the device catches up: every free so far is safe
      barrier_op = op;
    } else if (dice < 3) {
      pool.release_cached();  // waits for every free (after a barrier)
      note_barriers(op);
    } else if (dice < 5) {
      // The stream is destroyed and its handle reused: its blocks are re-keyed.
      pool.stream_destroying(0x2000);
      pool.stream_created(0x2000, StreamKind::NonBlocking);
    } else if (live.empty() || (rng() % 100 < 50 && live.size() < 300)) {
      const std::uint64_t r = rng() % 100;
      const std::size_t size = r < 40 ? 1 + rng() % kMiB : r < 95 ? kMiB + rng() % (24 * kMiB) : 48 * kMiB + rng() % (48 * kMiB);
      const StreamId stream = kStreams[rng() % 5];
      const Allocation a = pool.allocate(size, stream);
      REQUIRE(a.ok);
      note_barriers(op);
      freed.reused(a.ptr, a.ptr + size, [&](DevicePtr start, std::uint64_t freed_op) {
        if (stream != kAnyStream) return;  // stream requests: the stream random test's
        INFO("operation " << op << ": bytes at " << start << " freed at operation " << freed_op
                          << ", last barrier at " << barrier_op);
        REQUIRE(freed_op < barrier_op);
        ++checked_ranges;
      });
      live.push_back(Live{a.ptr, size, stream});
    } else {
      const Live l = take_any(live, rng);
      REQUIRE(pool.deallocate(l.ptr, l.stream) == FreeResult::Freed);
      freed.freed(l.ptr, l.ptr + l.size, op);
    }
    if (op % 997 == 0) {
      const bool ok = pool.validate(&why);
      INFO(why);
      REQUIRE(ok);
    }
  }
  CHECK(checked_ranges > 10000);  // the check saw plenty of reuse
}
