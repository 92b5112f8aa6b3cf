// Out of memory: the cache given back and the request tried again, device
// errors and tries the caller repeats, what is recorded, the memory limit.
#include "pool_fixture.hpp"

#include <numeric>

using namespace gpupool;
using gpupool::testing::PoolFixture;

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
