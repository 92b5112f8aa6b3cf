// Giving memory back: whole free segments, garbage collection past its
// threshold, cudaFree refused; a device reset's fresh pool, and the address
// of the memory held.
#include "pool_fixture.hpp"

using namespace gpupool;
using gpupool::testing::PoolFixture;

TEST_CASE_METHOD(PoolFixture, "release_cached returns whole free segments and keeps split ones") {
  make();
  const DevicePtr big = alloc(30 * kMiB);
  const DevicePtr a = alloc(1000);
  alloc(1000);
  release(big);
  release(a);
  CHECK(pool->release_cached() == 30 * kMiB);
  CHECK(upstream.live_segments() == 1);
  CHECK(current(pool->stats().segment) == 1);
  check();
}

namespace {

// Two idle fixed segments, 52 MiB reserved with the small pool's, past a
// threshold of 50 MiB: the 30 MiB one idle for ten reuses, the 20 MiB one
// just freed. The pool stays at or under the threshold until the last one
// grows it, so no collection has run yet.
struct IdleSegments {
  DevicePtr old_one;
  DevicePtr recent;
};

IdleSegments idle_past_threshold(PoolFixture& f) {
  f.options.garbage_collection_threshold = 0.5;
  f.options.memory_limit = 100 * kMiB;
  f.make();
  f.release(f.alloc(1000));
  const IdleSegments idle{f.alloc(30 * kMiB), f.alloc(20 * kMiB)};
  f.release(idle.old_one);
  for (int i = 0; i < 10; ++i) f.release(f.alloc(1000));  // reuse attempts age it
  f.release(idle.recent);
  REQUIRE(f.pool->stats().num_gc_releases == 0);
  return idle;
}

}  // namespace

TEST_CASE_METHOD(PoolFixture, "garbage collection returns the longest-idle segments past the threshold") {
  const IdleSegments idle = idle_past_threshold(*this);
  // A request that needs a new segment runs the collection, which returns
  // the older idle segment and keeps the recently used one.
  alloc(40 * kMiB);
  CHECK(pool->stats().num_gc_releases == 1);
  CHECK_FALSE(upstream.covers(idle.old_one, 1));
  CHECK(upstream.covers(idle.recent, 1));
}

TEST_CASE_METHOD(PoolFixture, "garbage collection gives nothing back while a capture forbids cudaFree") {
  // A capture under way on another device: the request grows the pool
  // instead, and the idle segment waits for the capture's end.
  const IdleSegments idle = idle_past_threshold(*this);
  upstream.set_capture_forbids_unsafe_calls(true);
  const std::uint64_t releases = upstream.releases();
  const DevicePtr grown = alloc(40 * kMiB);
  CHECK(upstream.releases() == releases);
  CHECK(pool->stats().num_gc_releases == 0);
  CHECK(upstream.covers(idle.old_one, 1));
  upstream.set_capture_forbids_unsafe_calls(false);
  release(grown);
  alloc(45 * kMiB);  // a new segment again, the capture over: collected now
  CHECK(pool->stats().num_gc_releases >= 1);
  CHECK_FALSE(upstream.covers(idle.old_one, 1));
}

TEST_CASE_METHOD(PoolFixture, "a segment whose cudaFree the runtime refuses stays reserved and serves again") {
  options.max_split_size = 64 * kMiB;  // oversize segments are given back first
  make(100 * kMiB);
  const DevicePtr idle = alloc(30 * kMiB);
  const DevicePtr oversize = alloc(64 * kMiB);
  release(idle);
  release(oversize);
  const std::int64_t reserved = pool->stats().reserved_bytes[kAll].current;
  upstream.set_releases_refused(true);
  SECTION("emptying the cache gives nothing back, and counts each refusal") {
    CHECK(pool->release_cached() == 0);
    CHECK(pool->stats().num_device_free == 0);
    CHECK(pool->stats().num_device_free_failures == 2);
    CHECK(pool->stats().reserved_bytes[kAll].current == reserved);
    CHECK(pool->stats().segment[kAll].current == 2);
    // Still the pool's to lend: the same memory serves again.
    CHECK(alloc(30 * kMiB) == idle);
  }
  SECTION("a request past the device's memory fails as out-of-memory, with the segments still held") {
    CHECK_FALSE(pool->allocate(90 * kMiB, kAnyStream).ok);
    CHECK(pool->stats().num_device_free_failures >= 2);
    CHECK(pool->stats().reserved_bytes[kAll].current == reserved);
    CHECK(upstream.covers(idle, 30 * kMiB));
    CHECK(upstream.covers(oversize, 64 * kMiB));
  }
  SECTION("an oversize segment refused is not asked again by the same request's oversize release") {
    // 40 MiB: too far below the oversize block to take it (it would waste
    // over 20 MiB), and past the device: the oversize release asks for it
    // once, then emptying the cache asks for both.
    CHECK_FALSE(pool->allocate(40 * kMiB, kAnyStream).ok);
    CHECK(pool->stats().num_device_free_failures == 3);
  }
  SECTION("once the runtime takes them, they go") {
    pool->release_cached();
    upstream.set_releases_refused(false);
    CHECK(pool->release_cached() == 94 * kMiB);
    CHECK(pool->stats().num_device_free == 2);
    CHECK(pool->stats().reserved_bytes[kAll].current == 0);
    CHECK(upstream.in_use() == 0);
  }
  std::string why;
  CHECK(pool->validate(&why));
  INFO(why);
}

TEST_CASE_METHOD(PoolFixture, "garbage collection ends when the runtime refuses every cudaFree") {
  const IdleSegments idle = idle_past_threshold(*this);
  upstream.set_releases_refused(true);
  alloc(40 * kMiB);  // grows: nothing could be given back
  CHECK(pool->stats().num_gc_releases == 0);
  CHECK(pool->stats().num_device_free_failures >= 1);
  CHECK(upstream.covers(idle.old_one, 1));
  std::string why;
  CHECK(pool->validate(&why));
  INFO(why);
}

TEST_CASE_METHOD(PoolFixture, "after a device reset a fresh pool carries on the old one's history") {
  options.expandable_segments = GENERATE(false, true);
  make(64 * kMiB);
  constexpr StreamId kLegacy = 0x1, kSide = 0x1000, kPerThread = 0x12;
  pool->stream_created(kLegacy, StreamKind::Legacy);
  pool->stream_created(kSide, StreamKind::NonBlocking);
  pool->stream_created(kPerThread, StreamKind::PerThread);
  release(alloc(1 * kMiB, kSide), kSide);
  release(alloc(1 * kMiB, kSide), kSide);  // the same stream's block again
  const DevicePtr held = alloc(3 * kMiB);
  const DevicePtr held_small = alloc(600, kPerThread);
  CHECK_FALSE(pool->allocate(1 * kGiB, kAnyStream).ok);  // an out-of-memory record
  const std::size_t held_bytes = pool->find_allocated(held)->size + pool->find_allocated(held_small)->size;

  // Each reset: a fresh pool over the same device, as the shim makes one.
  auto reset = [&] {
    std::unique_ptr<DevicePool> before = std::move(pool);
    make();
    pool->stream_created(kLegacy, StreamKind::Legacy);
    pool->continue_history(*before);
    check();  // no block, and every current figure agrees with that
    return before;
  };
  const std::unique_ptr<DevicePool> before = reset();

  std::vector<std::pair<std::string, std::int64_t>> old_values;
  for_each_flat_stat(before->stats(), [&](const std::string& k, std::int64_t v) { old_values.emplace_back(k, v); });
  std::size_t i = 0;
  for_each_flat_stat(pool->stats(), [&](const std::string& key, std::int64_t v) {
    INFO(key);
    const std::int64_t old = old_values[i++].second;
    const bool current = key.ends_with(".current");
    const bool freed = key.ends_with(".freed");
    if (current) CHECK(v == 0);
    if (freed) {
      // What was current is freed now: allocated - freed == current holds.
      const std::string stem = key.substr(0, key.size() - 5);
      const auto at = [&](const std::string& k) {
        for (const auto& [name, value] : old_values) {
          if (name == k) return value;
        }
        FAIL(k);
        return std::int64_t{0};
      };
      CHECK(v == old + at(stem + "current"));
    }
    if (!current && !freed) CHECK(v == old);  // peaks, totals, counts
  });
  CHECK(pool->stats().cache_hits == before->stats().cache_hits);
  CHECK(pool->ooms().size() == 1);
  CHECK(pool->timeline().samples().back().allocated == 0);

  const ResetLosses& lost = pool->reset_losses();
  CHECK(lost.resets == 1);
  CHECK(lost.lost.blocks == 2);
  CHECK(lost.lost.bytes == held_bytes);

  // The program's streams are gone with the reset, their counters kept; the
  // legacy and per-thread streams go on, each listed once.
  std::size_t legacy_rows = 0;
  bool side_reported = false;
  bool per_thread_alive = false;
  for (const StreamReport& r : pool->streams()) {
    legacy_rows += r.id == kLegacy ? 1 : 0;
    if (r.id == kSide) {
      side_reported = true;
      CHECK_FALSE(r.alive);
      CHECK(r.counters.same_stream_reuses == 1);
    }
    if (r.id == kPerThread) per_thread_alive = r.alive && r.kind == StreamKind::PerThread;
  }
  CHECK(legacy_rows == 1);
  CHECK(side_reported);
  CHECK(per_thread_alive);

  // The history goes on from there, across a second reset.
  const std::int64_t allocations = pool->stats().allocation[kAll].allocated;
  const DevicePtr after = alloc(2 * kMiB);
  CHECK(pool->stats().allocation[kAll].allocated == allocations + 1);
  CHECK(pool->stats().allocation[kAll].current == 1);
  CHECK(pool->stats().allocation[kAll].peak == before->stats().allocation[kAll].peak);
  const std::size_t after_bytes = pool->find_allocated(after)->size;
  const std::unique_ptr<DevicePool> second = reset();
  CHECK(pool->reset_losses().resets == 2);
  CHECK(pool->reset_losses().lost.blocks == 3);
  CHECK(pool->reset_losses().lost.bytes == held_bytes + after_bytes);
}

TEST_CASE_METHOD(PoolFixture, "the address of held memory is a segment's while the pool holds one") {
  make();
  CHECK(pool->held_address() == 0);
  const DevicePtr a = alloc(kMiB);
  const DevicePtr held = pool->held_address();
  CHECK(held != 0);
  CHECK(upstream.covers(held, 1));
  release(a);
  CHECK(pool->release_cached() > 0);
  CHECK(pool->held_address() == 0);
}
