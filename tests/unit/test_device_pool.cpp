// The pool's basic rules: a freed block serves again, best fit, when blocks
// split and merge, the split limits, and the frees and sizes it refuses.
#include "pool_fixture.hpp"

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
