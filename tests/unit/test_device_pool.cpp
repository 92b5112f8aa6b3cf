#include "pool_fixture.hpp"

#include <numeric>

using namespace gpupool;
using gpupool::testing::PoolFixture;

TEST_CASE_METHOD(PoolFixture, "a freed block serves the next request without asking upstream") {
  make();
  // A quarter of its segment: too large for a loop of one size to sweep
  // through the rest (plain_reuse.cpp), so it goes back to its place.
  const DevicePtr a = alloc(kMiB / 2);
  release(a);
  CHECK(alloc(kMiB / 2) == a);
  CHECK(upstream.allocations() == 1);
  CHECK(pool->stats().cache_hits == 1);
  CHECK(pool->stats().cache_misses == 1);
}

TEST_CASE_METHOD(PoolFixture, "small requests are carved one after another from a 2 MiB segment") {
  make();
  const DevicePtr a = alloc(1000);
  CHECK(alloc(1) == a + 1024);
  CHECK(alloc(512) == a + 1536);
  CHECK(alloc(1500) == a + 2048);
  CHECK(upstream.allocations() == 1);
  CHECK(current(pool->stats().reserved_bytes, kSmallPool) == 2 * kMiB);
  CHECK(current(pool->stats().reserved_bytes, kLargePool) == 0);
}

TEST_CASE_METHOD(PoolFixture, "size 0 succeeds with a null pointer and touches nothing") {
  make();
  const Allocation a = pool->allocate(0, kAnyStream);
  CHECK(a.ok);
  CHECK(a.ptr == 0);
  CHECK(upstream.allocations() == 0);
  CHECK(pool->stats().allocation[kAll].allocated == 0);
}

TEST_CASE_METHOD(PoolFixture, "best fit picks the smallest free block that is large enough") {
  make();
  const DevicePtr a = alloc(2 * kMiB);
  alloc(2 * kMiB);  // separators keep the free blocks apart
  const DevicePtr b = alloc(4 * kMiB);
  alloc(2 * kMiB);
  const DevicePtr c = alloc(3 * kMiB);
  alloc(2 * kMiB);
  REQUIRE(upstream.allocations() == 1);  // all in one 20 MiB segment
  release(a);
  release(b);
  release(c);
  CHECK(alloc(2 * kMiB + kMiB / 2) == c);
  CHECK(alloc(3 * kMiB) == b);  // 4 MiB block, the 5 MiB tail is larger
  CHECK(alloc(2 * kMiB) == a);
}

TEST_CASE_METHOD(PoolFixture, "small pool splits whenever at least 512 bytes remain") {
  make();
  const DevicePtr x = alloc(1536);
  alloc(512);  // separator
  release(x);
  CHECK(alloc(1024) == x);
  CHECK(alloc(512) == x + 1024);  // the 512-byte remainder was kept as a block
}

TEST_CASE_METHOD(PoolFixture, "large pool splits only when more than 1 MiB remains") {
  make();
  const DevicePtr x = alloc(3 * kMiB);
  const DevicePtr y = alloc(3 * kMiB + 512);
  alloc(2 * kMiB);
  release(x);
  release(y);  // merges with x: a 6 MiB + 512 B free block
  // 2 MiB remain: split.
  const std::int64_t before = current(pool->stats().allocated_bytes);
  const DevicePtr z = alloc(2 * kMiB + 2 * kMiB + 512);  // 4 MiB + 512 from 6 MiB + 512
  CHECK(z == x);
  CHECK(current(pool->stats().allocated_bytes) - before == static_cast<std::int64_t>(4 * kMiB + 512));
  const DevicePtr w = alloc(2 * kMiB);  // the 2 MiB remainder: > 1 MiB, was split off
  CHECK(w == x + 4 * kMiB + 512);
  release(w);
  release(z);

  const DevicePtr p = alloc(3 * kMiB);  // takes the merged 6 MiB+512 block
  CHECK(p == x);
  const DevicePtr q = alloc(3 * kMiB);
  CHECK(q == x + 3 * kMiB);  // the 3 MiB + 512 remainder, served whole (512 B left)
  release(q);
  release(p);
  const std::int64_t before_whole = current(pool->stats().allocated_bytes);
  const DevicePtr r = alloc(5 * kMiB + 512);  // leaves exactly 1 MiB: served whole
  CHECK(r == x);
  CHECK(current(pool->stats().allocated_bytes) - before_whole ==
        static_cast<std::int64_t>(6 * kMiB + 512));
}

TEST_CASE_METHOD(PoolFixture, "max_split_size: oversize blocks never split nor serve smaller requests") {
  options.max_split_size = 32 * kMiB;
  make();
  const DevicePtr big = alloc(40 * kMiB);
  release(big);
  // A 4 MiB request may not take the cached 40 MiB block.
  const DevicePtr small = alloc(4 * kMiB);
  CHECK(small != big);
  CHECK(upstream.allocations() == 2);
  // A 36 MiB request (oversize) takes it whole: the waste (4 MiB) is under 20 MiB.
  const std::int64_t before = current(pool->stats().allocated_bytes);
  CHECK(alloc(36 * kMiB) == big);
  CHECK(current(pool->stats().allocated_bytes) - before == static_cast<std::int64_t>(40 * kMiB));
  CHECK(pool->stats().oversize_allocations.current == 1);
  CHECK(pool->stats().oversize_segments.current == 1);
}

TEST_CASE_METHOD(PoolFixture, "an oversize request takes a cached oversize block only if it wastes < 20 MiB") {
  options.max_split_size = 32 * kMiB;
  make();
  const DevicePtr huge = alloc(80 * kMiB);
  release(huge);
  const DevicePtr p = alloc(40 * kMiB);  // would waste 40 MiB
  CHECK(p != huge);
  release(p);
  CHECK(alloc(61 * kMiB) == huge);  // wastes 19 MiB
}

TEST_CASE_METHOD(PoolFixture, "max_non_split_rounding sets the oversize waste bound") {
  options.max_split_size = 32 * kMiB;
  options.max_non_split_rounding = 4 * kMiB;
  make();
  const DevicePtr big = alloc(48 * kMiB);
  release(big);
  CHECK(alloc(40 * kMiB) != big);
  CHECK(alloc(45 * kMiB) == big);
}

TEST_CASE_METHOD(PoolFixture, "a freed block merges with free neighbours on both sides") {
  make();
  const DevicePtr a = alloc(1000);
  const DevicePtr b = alloc(1000);
  const DevicePtr c = alloc(1000);
  release(a);
  release(c);
  CHECK(pool->fragmentation().free_blocks == 2);  // a, and c merged with the tail
  release(b);
  const Fragmentation f = pool->fragmentation();
  CHECK(f.free_blocks == 1);
  CHECK(f.largest_free_block == 2 * kMiB);  // the whole segment is one block again
  CHECK(current(pool->stats().inactive_split) == 0);
}

TEST_CASE_METHOD(PoolFixture, "blocks of different segments never merge, even when adjacent") {
  upstream.set_contiguous(true);
  make();
  const DevicePtr a = alloc(12 * kMiB);
  const DevicePtr b = alloc(12 * kMiB);
  REQUIRE(b == a + 12 * kMiB);  // the two segments touch
  release(a);
  release(b);
  CHECK(pool->fragmentation().free_blocks == 2);
  CHECK(pool->fragmentation().largest_free_block == 12 * kMiB);
  const DevicePtr c = alloc(24 * kMiB);
  CHECK(c != a);
  CHECK(upstream.allocations() == 3);
}

TEST_CASE_METHOD(PoolFixture, "upstream failure releases cached segments and retries once") {
  make(40 * kMiB);
  const DevicePtr a = alloc(20 * kMiB);
  release(a);
  const DevicePtr b = alloc(30 * kMiB);  // 20 cached + 30 > 40: release, retry
  CHECK(b != 0);
  CHECK(pool->stats().num_alloc_retries == 1);
  CHECK(pool->stats().num_retries_served == 1);
  CHECK(pool->stats().num_device_free == 1);
  CHECK(upstream.in_use() == 30 * kMiB);
  CHECK(pool->stats().num_ooms == 0);
}

TEST_CASE_METHOD(PoolFixture, "a device error is no out-of-memory: cache is kept, nothing recorded") {
  const bool expandable = GENERATE(false, true);
  upstream.set_virtual_memory(expandable);
  make();
  release(alloc(20 * kMiB));
  const std::uint64_t attempts_before = upstream.failed_allocations();
  upstream.set_failure([](std::uint64_t) { return true; });
  upstream.set_failures_are_device_errors(true);
  const Allocation a = pool->allocate(40 * kMiB, kAnyStream);
  CHECK_FALSE(a.ok);
  CHECK(a.device_error);
  CHECK(upstream.failed_allocations() == attempts_before + 1);  // asked once, no retry
  CHECK(pool->stats().num_ooms == 0);
  CHECK(pool->ooms().empty());
  CHECK(pool->stats().num_alloc_retries == 0);
  CHECK(pool->stats().reserved_bytes[kAll].current == 20 * kMiB);  // the cache was not released
  // The same failures as a lack of memory: released, retried, recorded.
  upstream.set_failures_are_device_errors(false);
  const Allocation b = pool->allocate(40 * kMiB, kAnyStream);
  CHECK_FALSE(b.ok);
  CHECK_FALSE(b.device_error);
  CHECK(pool->stats().num_ooms == 1);
  CHECK(pool->stats().num_alloc_retries == 1);
  CHECK(pool->stats().num_retries_served == 0);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a failed try the caller will repeat is no out-of-memory yet") {
  make(40 * kMiB);
  const DevicePtr held = alloc(30 * kMiB);
  CHECK_FALSE(pool->allocate(20 * kMiB, kAnyStream, 0, false).ok);
  CHECK(pool->stats().num_ooms == 0);
  CHECK(pool->ooms().empty());
  auto requests = [&] {
    const auto& c = pool->request_histogram().count;
    return std::accumulate(c.begin(), c.end(), std::uint64_t{0});
  };
  CHECK(requests() == 1);  // the 30 MiB: a request tried again counts once
  release(held);  // what the caller returns before trying again
  CHECK(pool->allocate(20 * kMiB, kAnyStream, 0, true).ok);
  CHECK(pool->stats().num_ooms == 0);
  CHECK(requests() == 2);
  CHECK_FALSE(pool->allocate(40 * kMiB, kAnyStream, 0, true).ok);  // the last try fails: recorded
  CHECK(pool->stats().num_ooms == 1);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a failed try the caller will repeat keeps the cache for the last try") {
  // The shim takes back the blocks threads keep before its last try: until
  // then nothing is released (a host wait and device frees) for them.
  make(40 * kMiB);
  release(alloc(20 * kMiB));
  CHECK_FALSE(pool->allocate(30 * kMiB, kAnyStream, 0, false).ok);
  CHECK(pool->stats().num_alloc_retries == 0);
  CHECK(upstream.releases() == 0);
  CHECK(pool->stats().reserved_bytes[kAll].current == 20 * kMiB);
  const Allocation a = pool->allocate(30 * kMiB, kAnyStream, 0, true);
  CHECK(a.ok);
  CHECK(pool->stats().num_alloc_retries == 1);
  CHECK(upstream.releases() == 1);
  CHECK(pool->stats().num_ooms == 0);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a request the device cannot hold fails and is recorded") {
  make(40 * kMiB);
  alloc(30 * kMiB);
  const Allocation a = pool->allocate(20 * kMiB, kAnyStream);
  CHECK_FALSE(a.ok);
  CHECK(a.ptr == 0);
  CHECK(pool->stats().num_ooms == 1);
  REQUIRE(pool->ooms().size() == 1);
  const OomRecord& r = pool->ooms()[0];
  CHECK(r.requested == 20 * kMiB);
  CHECK(r.segment_asked == 20 * kMiB);
  CHECK(r.reserved == 30 * kMiB);
  CHECK(r.allocated == 30 * kMiB);
  CHECK(r.device_total == 40 * kMiB);
  CHECK(r.device_free == 10 * kMiB);
  CHECK_FALSE(r.limit_reached);
  check();
}

TEST_CASE_METHOD(PoolFixture, "out of memory while fragmented: free bytes exist but no block fits") {
  make(24 * kMiB);
  // One 20 MiB segment cut into 2 MiB pieces; every other piece freed.
  DevicePtr pieces[10];
  for (DevicePtr& p : pieces) p = alloc(2 * kMiB);
  for (int i = 0; i < 10; i += 2) release(pieces[i]);
  const Allocation a = pool->allocate(4 * kMiB, kAnyStream);
  CHECK_FALSE(a.ok);
  REQUIRE(pool->ooms().size() == 1);
  CHECK(pool->ooms()[0].free_in_pool == 10 * kMiB);
  CHECK(pool->ooms()[0].largest_free_block == 2 * kMiB);
}

TEST_CASE_METHOD(PoolFixture, "memory_limit refuses growth past it without asking the device") {
  options.memory_limit = 32 * kMiB;
  make();
  alloc(30 * kMiB);
  CHECK_FALSE(pool->allocate(4 * kMiB, kAnyStream).ok);
  REQUIRE(pool->ooms().size() == 1);
  CHECK(pool->ooms()[0].limit_reached);
  CHECK(upstream.failed_allocations() == 0);
  CHECK(alloc(1000) != 0);  // 2 MiB more still fits the limit
}

TEST_CASE_METHOD(PoolFixture, "non-releasable totals count what each split or merge changes, as PyTorch's do") {
  make();
  const StatArray& blocks = pool->stats().inactive_split;
  const StatArray& bytes = pool->stats().inactive_split_bytes;
  const auto rest = static_cast<std::int64_t>(2 * kMiB - 1024);
  const DevicePtr a = alloc(1000);  // a 2 MiB segment: the rest is a free block of a split segment
  CHECK(blocks[kSmallPool].allocated == 1);
  CHECK(bytes[kSmallPool].allocated == rest);
  const DevicePtr b = alloc(2000);  // that free block shrinks by 2 KiB: no block leaves or comes
  CHECK(blocks[kSmallPool].allocated == 1);
  CHECK(blocks[kSmallPool].freed == 0);
  CHECK(bytes[kSmallPool].allocated == rest);
  CHECK(bytes[kSmallPool].freed == 2048);
  release(b);  // joins the free block above, which grows by 2 KiB
  CHECK(blocks[kSmallPool].freed == 0);
  CHECK(bytes[kSmallPool].allocated == rest + 2048);
  CHECK(bytes[kSmallPool].freed == 2048);
  release(a);  // the segment is one unsplit block again, which does not count
  CHECK(blocks[kAll].current == 0);
  CHECK(blocks[kSmallPool].freed == 1);
  CHECK(bytes[kSmallPool].current == 0);
  CHECK(bytes[kSmallPool].freed == rest + 2048);
  CHECK(bytes[kSmallPool].peak == rest);
  CHECK(bytes[kAll].allocated == bytes[kSmallPool].allocated);
}

TEST_CASE_METHOD(PoolFixture, "statistics match a hand count") {
  make();
  const DevicePtr a = alloc(1000);
  const DevicePtr b = alloc(2000);
  alloc(3000);
  alloc(5 * kMiB);
  const MemoryStats& s = pool->stats();
  CHECK(s.allocation[kAll].current == 4);
  CHECK(s.allocation[kSmallPool].current == 3);
  CHECK(s.allocation[kLargePool].current == 1);
  CHECK(s.allocated_bytes[kSmallPool].current == 1024 + 2048 + 3072);
  CHECK(s.allocated_bytes[kLargePool].current == static_cast<std::int64_t>(5 * kMiB));
  CHECK(s.requested_bytes[kAll].current == static_cast<std::int64_t>(6000 + 5 * kMiB));
  CHECK(s.reserved_bytes[kSmallPool].current == static_cast<std::int64_t>(2 * kMiB));
  CHECK(s.reserved_bytes[kLargePool].current == static_cast<std::int64_t>(20 * kMiB));
  CHECK(s.segment[kAll].current == 2);
  CHECK(s.inactive_split[kSmallPool].current == 1);
  CHECK(s.inactive_split_bytes[kSmallPool].current == static_cast<std::int64_t>(2 * kMiB - 6144));
  CHECK(s.inactive_split_bytes[kLargePool].current == static_cast<std::int64_t>(15 * kMiB));
  release(b);
  CHECK(s.inactive_split[kSmallPool].current == 2);
  CHECK(s.inactive_split_bytes[kSmallPool].current == static_cast<std::int64_t>(2 * kMiB - 4096));
  CHECK(s.allocation[kAll].allocated == 4);
  CHECK(s.allocation[kAll].freed == 1);
  CHECK(s.requested_bytes[kAll].freed == 2000);
  release(a);
  CHECK(s.allocated_bytes[kAll].peak == static_cast<std::int64_t>(6144 + 5 * kMiB));
  CHECK(s.num_device_alloc == 2);
  CHECK(pool->fragmentation().rounding_waste == 72 + 0);  // 3072 - 3000; 5 MiB exact
}

TEST_CASE_METHOD(PoolFixture, "stream-ordered bytes count only blocks cudaMallocAsync made, whoever frees them") {
  // What a memory pool's "in use" figure reads: plain cudaMalloc blocks share
  // the segments but are not the default pool's.
  make();
  constexpr StreamId kStream = 0x1000;
  const MemoryStats& s = pool->stats();
  const DevicePtr plain = alloc(6 * kMiB);
  const DevicePtr ordered = alloc(4 * kMiB, kStream);
  const DevicePtr small = alloc(1000, kStream);
  CHECK(s.stream_ordered_bytes.current == static_cast<std::int64_t>(4 * kMiB + 1024));
  CHECK(s.allocated_bytes[kAll].current == static_cast<std::int64_t>(10 * kMiB + 1024));
  release(ordered);  // by a plain cudaFree: still a stream-ordered block
  release(plain, kStream);  // by cudaFreeAsync: still a plain one
  CHECK(s.stream_ordered_bytes.current == 1024);
  // Reused by the other kind of call, the same memory counts as that kind.
  const DevicePtr reused = alloc(4 * kMiB);
  CHECK(s.stream_ordered_bytes.current == 1024);
  release(reused);
  CHECK(s.stream_ordered_bytes.peak == static_cast<std::int64_t>(4 * kMiB + 1024));
  release(small, kStream);
  CHECK(s.stream_ordered_bytes.current == 0);
  CHECK(s.stream_ordered_bytes.freed == s.stream_ordered_bytes.allocated);
}

TEST_CASE_METHOD(PoolFixture, "a reset high watermark starts from what is held then, and the peak stays") {
  make();
  constexpr StreamId kStream = 0x1000;
  const MemoryStats& s = pool->stats();
  const DevicePtr big = alloc(30 * kMiB, kStream);
  const DevicePtr small = alloc(1000, kStream);
  const DevicePtr plain = alloc(8 * kMiB);  // in no stream-ordered figure
  release(big, kStream);
  const std::int64_t peak_ordered = static_cast<std::int64_t>(30 * kMiB + 1024);
  CHECK(s.stream_ordered_high == peak_ordered);
  pool->reset_high(DevicePool::Watermark::StreamOrdered);
  CHECK(s.stream_ordered_high == 1024);
  CHECK(s.stream_ordered_bytes.peak == peak_ordered);
  CHECK(s.reserved_high == s.reserved_bytes[kAll].peak);  // the other one is left alone
  const DevicePtr medium = alloc(4 * kMiB, kStream);
  CHECK(s.stream_ordered_high == static_cast<std::int64_t>(4 * kMiB + 1024));
  release(medium, kStream);
  release(plain);
  CHECK(pool->release_cached() > 0);
  pool->reset_high(DevicePool::Watermark::Reserved);
  CHECK(s.reserved_high == s.reserved_bytes[kAll].current);
  CHECK(s.reserved_high < s.reserved_bytes[kAll].peak);
  release(small, kStream);
  check();
}

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

TEST_CASE_METHOD(PoolFixture, "frees of foreign, interior and already freed pointers are refused") {
  make();
  const DevicePtr a = alloc(4096);
  CHECK(pool->deallocate(0x1234000, kAnyStream) == FreeResult::NotOwned);
  CHECK(pool->deallocate(a + 512, kAnyStream) == FreeResult::NotAllocated);
  release(a);
  CHECK(pool->deallocate(a, kAnyStream) == FreeResult::NotAllocated);
  check();
}

TEST_CASE_METHOD(PoolFixture, "requests beyond any device fail cleanly instead of overflowing") {
  make();
  CHECK_FALSE(pool->allocate(~std::size_t{0}, kAnyStream).ok);
  CHECK_FALSE(pool->allocate(~std::size_t{0} - 511, kAnyStream).ok);
  CHECK(pool->stats().num_ooms == 2);
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

TEST_CASE_METHOD(PoolFixture, "timeline samples stay bounded over long runs") {
  make();
  for (int i = 0; i < 100000; ++i) release(pool->allocate(1000 + i % 7 * 512, kAnyStream).ptr);
  CHECK(pool->timeline().samples().size() <= 1024);
  CHECK(pool->timeline().samples().size() >= 256);
  CHECK(pool->timeline().samples().back().op > 100000);
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
