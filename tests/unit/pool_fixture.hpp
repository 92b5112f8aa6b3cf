// A DevicePool over a VirtualUpstream, with helpers that fail the test on any
// unexpected result and check every invariant after each step.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "pool/device_pool.hpp"
#include "pool/virtual_upstream.hpp"
#include "tests/stream_rows.hpp"

namespace gpupool::testing {

struct PoolFixture {
  VirtualUpstream upstream;
  PoolOptions options;
  std::unique_ptr<DevicePool> pool;

  DevicePool& make(std::size_t capacity = kUnlimited) {
    upstream.set_capacity(capacity);
    pool = std::make_unique<DevicePool>(upstream, options, 80 * kGiB);
    return *pool;
  }

  // Two blocking streams, 0x1000 and 0x2000, whose events complete only at
  // upstream.complete_all().
  void make_two_streams_with_pending_work() {
    make();
    pool->stream_created(0x1000, StreamKind::Blocking);
    pool->stream_created(0x2000, StreamKind::Blocking);
    upstream.set_events_complete_at_once(false);
  }

  DevicePtr alloc(std::size_t bytes, StreamId stream = kAnyStream) {
    const Allocation a = pool->allocate(bytes, stream);
    REQUIRE(a.ok);
    REQUIRE(a.ptr % 512 == 0);
    REQUIRE(upstream.covers(a.ptr, bytes));
    check();
    return a.ptr;
  }

  void release(DevicePtr ptr, StreamId stream = kAnyStream) {
    REQUIRE(pool->deallocate(ptr, stream) == FreeResult::Freed);
    check();
  }

  void check() const {
    std::string why;
    const bool ok = pool->validate(&why);
    INFO(why);
    REQUIRE(ok);
    REQUIRE(stream_rows_cover_cache(*pool));
  }

  std::int64_t current(const StatArray& s, int index = kAll) const { return s[index].current; }
};

}  // namespace gpupool::testing
