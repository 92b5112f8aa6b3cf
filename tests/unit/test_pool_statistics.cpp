// The statistics against hand counts: non-releasable totals, PyTorch's
// figures, stream-ordered bytes, reset watermarks, the timeline's bound.
#include "pool_fixture.hpp"

using namespace gpupool;
using gpupool::testing::PoolFixture;

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

TEST_CASE_METHOD(PoolFixture, "timeline samples stay bounded over long runs") {
  make();
  for (int i = 0; i < 100000; ++i) release(pool->allocate(1000 + i % 7 * 512, kAnyStream).ptr);
  CHECK(pool->timeline().samples().size() <= 1024);
  CHECK(pool->timeline().samples().size() >= 256);
  CHECK(pool->timeline().samples().back().op > 100000);
}
