// Device barriers: what a plain reuse records and waits for, non-blocking
// streams brought in or asked, and new streams made after a pending barrier.
#include "pool_fixture.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;

TEST_CASE_METHOD(PoolFixture, "same-stream reuse needs no event at all") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  const DevicePtr a = alloc(1000, kS1);
  release(a, kS1);
  upstream.clear_calls();
  CHECK(alloc(1000, kS1) == a);
  CHECK(upstream.calls().empty());
}

TEST_CASE_METHOD(PoolFixture, "plain cudaFree then cudaMalloc: one legacy-stream barrier covers a burst") {
  make();
  DevicePtr p[10];
  for (DevicePtr& x : p) x = alloc(1000);
  for (DevicePtr x : p) release(x);
  upstream.clear_calls();
  for (int i = 0; i < 10; ++i) alloc(1000);
  REQUIRE(upstream.calls().size() == 1);
  CHECK(upstream.calls()[0].kind == Call::Record);
  CHECK(upstream.calls()[0].stream == kLegacy);
}

TEST_CASE_METHOD(PoolFixture, "the barrier brings non-blocking streams in both directions") {
  make();
  pool->stream_created(kNB, StreamKind::NonBlocking);
  const DevicePtr a = alloc(kTakesBarrier);
  release(a);
  upstream.clear_calls();
  CHECK(alloc(kTakesBarrier) == a);
  const auto& c = upstream.calls();
  REQUIRE(c.size() == 4);
  CHECK((c[0].kind == Call::Record && c[0].stream == kNB));
  CHECK((c[1].kind == Call::Wait && c[1].stream == kLegacy && c[1].event == c[0].event));
  CHECK((c[2].kind == Call::Record && c[2].stream == kLegacy));
  CHECK((c[3].kind == Call::Wait && c[3].stream == kNB && c[3].event == c[2].event));
  for (const StreamReport& r : pool->streams()) {
    if (r.id != kNB) continue;
    CHECK(r.counters.barrier_waits == 1);  // a barrier's wait, not a cross-stream one
    CHECK(r.counters.event_waits == 0);
  }
}

TEST_CASE_METHOD(PoolFixture, "a barrier asks idle non-blocking streams instead of recording on them") {
  // PyTorch's stream pool: dozens of non-blocking streams, most never used.
  // None needs the legacy stream to wait. Each still waits for the barrier,
  // unless the legacy stream's event, recorded first, has completed by the
  // time all are found idle: then the device has done everything queued
  // before the free, and nothing is left to order.
  const bool caught_up = GENERATE(false, true);
  make();
  constexpr int kStreams = 64;
  add_non_blocking_streams(*pool, kStreams);
  upstream.set_streams_idle(true);
  upstream.set_events_complete_at_once(caught_up);
  const DevicePtr a = alloc(kTakesBarrier);
  release(a);
  upstream.clear_calls();
  const std::uint64_t queries = upstream.stream_queries();
  const std::uint64_t event_queries = upstream.event_queries();
  CHECK(alloc(kTakesBarrier) == a);
  const auto& c = upstream.calls();
  REQUIRE(c.size() == 1 + (caught_up ? 0 : kStreams));
  CHECK((c[0].kind == Call::Record && c[0].stream == kLegacy));
  for (int i = 0; i < kStreams; ++i) CHECK(count(c, Call::Wait, kNB + i) == (caught_up ? 0 : 1));
  CHECK(count(c, Call::Wait, kLegacy) == 0);
  CHECK(upstream.stream_queries() - queries == kStreams);
  CHECK(upstream.event_queries() - event_queries == 1);
  std::uint64_t idle_queries = 0;  // the report's count of the queries made
  for (const StreamReport& r : pool->streams()) {
    if (r.id == kAnyStream) CHECK(r.counters.caught_up_barriers == (caught_up ? 1u : 0u));
    if (r.kind == StreamKind::NonBlocking) CHECK(r.counters.idle_queries == 1u);
    idle_queries += r.counters.idle_queries;
  }
  CHECK(idle_queries == kStreams);
  // Either way a later free is ordered by a barrier of its own.
  release(a);
  upstream.clear_calls();
  CHECK(alloc(kTakesBarrier) == a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
}

TEST_CASE_METHOD(PoolFixture, "an early event whose query fails does not pass for a device caught up") {
  // Every stream answers idle, but the legacy stream's event cannot be asked:
  // nothing says the work queued before the free is done, so every stream
  // still waits for the barrier.
  make();
  constexpr int kStreams = 8;
  add_non_blocking_streams(*pool, kStreams);
  upstream.set_streams_idle(true);
  upstream.set_event_queries_fail(true);
  const DevicePtr a = alloc(kTakesBarrier);
  release(a);
  upstream.clear_calls();
  CHECK(alloc(kTakesBarrier) == a);
  for (int i = 0; i < kStreams; ++i) CHECK(count(upstream.calls(), Call::Wait, kNB + i) == 1);
  for (const StreamReport& r : pool->streams()) {
    if (r.id == kAnyStream) CHECK(r.counters.caught_up_barriers == 0u);
  }
}

TEST_CASE_METHOD(PoolFixture, "giving memory back after a barrier that found the device caught up waits for nothing") {
  // release_cached orders every free with a barrier, then waits for it: a
  // barrier with nothing left to order has no event to wait for.
  make();
  add_non_blocking_streams(*pool, 8);
  upstream.set_streams_idle(true);
  release(alloc(3 * kMiB));
  const std::uint64_t releases = upstream.releases();
  CHECK(pool->release_cached() == 20 * kMiB);
  CHECK(upstream.releases() == releases + 1);
  CHECK(upstream.stream_waits() == 0);
  check();
}

TEST_CASE_METHOD(PoolFixture, "with many non-blocking streams, one found busy is ordered after the early event") {
  // The legacy stream's event recorded before the streams were asked does not
  // cover a busy stream's work: the legacy stream waits for that stream, then
  // records the barrier the streams wait for.
  make();
  constexpr int kStreams = 8;
  add_non_blocking_streams(*pool, kStreams);
  upstream.set_streams_idle(false);
  const DevicePtr a = alloc(kTakesBarrier);
  release(a);
  upstream.clear_calls();
  CHECK(alloc(kTakesBarrier) == a);
  const auto& c = upstream.calls();
  REQUIRE(c.size() == 1 + 2 * kStreams + 1 + kStreams);
  CHECK((c[0].kind == Call::Record && c[0].stream == kLegacy));  // the early one, wasted
  const Call& barrier = c[1 + 2 * kStreams];
  CHECK((barrier.kind == Call::Record && barrier.stream == kLegacy));
  for (int i = 0; i < kStreams; ++i) {
    const Call& record = c[1 + 2 * i];  // on each stream in turn, in no set order
    CHECK((record.kind == Call::Record && record.stream != kLegacy));
    CHECK((c[2 + 2 * i].kind == Call::Wait && c[2 + 2 * i].stream == kLegacy && c[2 + 2 * i].event == record.event));
    CHECK(count(c, Call::Record, kNB + i) == 1);
    const Call& wait = c[2 + 2 * kStreams + i];
    CHECK((wait.kind == Call::Wait && wait.stream != kLegacy && wait.event == barrier.event));
    CHECK(count(c, Call::Wait, kNB + i) == 1);
  }
}

TEST_CASE_METHOD(PoolFixture, "a busy non-blocking stream is ordered by every barrier and asked only every 8th") {
  make();
  pool->stream_created(kNB, StreamKind::NonBlocking);
  const DevicePtr a = alloc(kTakesBarrier);
  upstream.clear_calls();
  auto barriers = [&](int n) {
    for (int i = 0; i < n; ++i) {
      release(a);
      CHECK(alloc(kTakesBarrier) == a);
    }
  };
  barriers(12);  // asked at the 1st and the 9th
  CHECK(upstream.stream_queries() == 2);
  CHECK(count(upstream.calls(), Call::Record, kNB) == 12);
  CHECK(count(upstream.calls(), Call::Wait, kLegacy) == 12);
  CHECK(count(upstream.calls(), Call::Wait, kNB) == 12);
  // Idle from now on: still taken as busy until asked at the 17th, then left
  // alone (asked at every barrier), though still made to wait at each.
  upstream.set_streams_idle(true);
  upstream.clear_calls();
  barriers(12);
  CHECK(upstream.stream_queries() == 2 + 8);
  CHECK(count(upstream.calls(), Call::Record, kNB) == 4);
  CHECK(count(upstream.calls(), Call::Wait, kLegacy) == 4);
  CHECK(count(upstream.calls(), Call::Wait, kNB) == 12);
}

TEST_CASE_METHOD(PoolFixture, "a non-blocking stream created after a pending barrier waits for it") {
  make();
  upstream.set_events_complete_at_once(false);
  release(alloc(kTakesBarrier));
  alloc(kTakesBarrier);  // records the barrier, still pending
  upstream.clear_calls();
  pool->stream_created(kNB, StreamKind::NonBlocking);
  CHECK(count(upstream.calls(), Call::Wait, kNB) == 1);
  for (const StreamReport& r : pool->streams()) {
    if (r.id == kNB) CHECK(r.counters.barrier_waits == 1);
  }
}

TEST_CASE_METHOD(PoolFixture, "a new non-blocking stream that cannot wait for the pending barrier gets a host wait") {
  // The plain allocation is live, its bytes covered by the barrier only: the
  // program may use it on the new stream at once.
  make();
  upstream.set_events_complete_at_once(false);
  release(alloc(kTakesBarrier));
  alloc(kTakesBarrier);  // records the barrier, still pending
  EventHandle barrier = 0;
  for (const Call& c : upstream.calls()) {
    if (c.kind == Call::Record && c.stream == kLegacy) barrier = c.event;
  }
  REQUIRE(barrier != 0);
  upstream.set_failing_wait_stream(kNB);
  upstream.clear_calls();
  CHECK(pool->stream_created(kNB, StreamKind::NonBlocking));
  REQUIRE(upstream.calls().size() == 1);
  CHECK((upstream.calls()[0].kind == Call::SyncEvent && upstream.calls()[0].event == barrier));
}

TEST_CASE("a new non-blocking stream that cannot be ordered at all voids the barriers so far") {
  // Neither a wait nor a host wait: the next reuse of what the barriers
  // covered records a new one, which the new stream waits for.
  VirtualUpstream upstream;
  PoolOptions options;
  StreamOrdering ordering(upstream, options);
  upstream.set_events_complete_at_once(false);
  constexpr StreamId kLater = 0x2000;
  const std::uint64_t freed = ordering.stamp_free(kAnyStream).device_epoch;
  REQUIRE(ordering.device_ready(freed));  // the barrier, pending
  upstream.set_failing_wait_stream(kLater);
  upstream.set_host_waits_fail(true);
  CHECK_FALSE(ordering.stream_created(kLater, StreamKind::NonBlocking));
  upstream.set_host_waits_fail(false);
  CHECK_FALSE(ordering.device_ordered(freed));
  CHECK_FALSE(ordering.device_ready(freed));  // the new barrier's wait on kLater fails too
  upstream.set_failing_wait_stream(0);
  upstream.clear_calls();
  CHECK(ordering.device_ready(freed));
  CHECK(count(upstream.calls(), Call::Wait, kLater) == 1);
}

TEST_CASE_METHOD(PoolFixture, "plain reuse prefers an equal block freed before the last barrier") {
  make();
  const DevicePtr a = alloc(12 * kMiB);
  const DevicePtr b = alloc(12 * kMiB);
  release(b);
  const DevicePtr x = alloc(kMiB);
  alloc(kMiB);  // the rest of x's segment
  release(x);
  alloc(kMiB);  // x again, only after a barrier: b is covered from now on
  release(a);   // a is freed after it
  upstream.clear_calls();
  CHECK(alloc(12 * kMiB) == b);  // b, not the lower-addressed a: no new barrier
  CHECK(upstream.calls().empty());
}

TEST_CASE_METHOD(PoolFixture, "plain reuse looks past equal blocks freed since the last barrier") {
  // a and b, freed after the barrier, come first by address; c, as good and
  // covered, is found behind them.
  make();
  const DevicePtr a = alloc(12 * kMiB);
  const DevicePtr b = alloc(12 * kMiB);
  const DevicePtr c = alloc(12 * kMiB);
  REQUIRE((a < b && b < c));
  release(c);
  const DevicePtr x = alloc(kMiB);
  alloc(kMiB);  // the rest of x's segment
  release(x);
  alloc(kMiB);  // x again, only after a barrier: c is covered from now on
  release(a);
  release(b);
  upstream.clear_calls();
  CHECK(alloc(12 * kMiB) == c);
  CHECK(upstream.calls().empty());
}

TEST_CASE_METHOD(PoolFixture, "plain barriers record their events again without querying them") {
  // Each reuse of the block just freed with cudaFree records a barrier, while
  // the device catches up only now and then. The newest barrier completes
  // after all older ones, so an older one's event is recorded again with no
  // query: a handful of events serve any number of barriers.
  // A device that keeps up (its events complete at once) is not queried
  // either: a second event is made instead, once.
  const bool non_blocking = GENERATE(false, true);  // its barriers also record and wait there
  const bool keeps_up = GENERATE(false, true);
  make();
  if (non_blocking) pool->stream_created(0x1000, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(keeps_up);
  const DevicePtr p = alloc(kMiB);
  for (int i = 0; i < 100; ++i) {
    release(p);
    CHECK(alloc(kMiB) == p);
    if (i % 4 == 3) upstream.complete_all();
  }
  CHECK(upstream.event_records() == (non_blocking ? 200u : 100u));
  CHECK(upstream.event_queries() == 0);
  CHECK(upstream.events_created() <= 4);
}

TEST_CASE_METHOD(PoolFixture, "when no event can be made, barriers recycle a completed one") {
  make();
  const DevicePtr p = alloc(kMiB);
  release(p);
  CHECK(alloc(kMiB) == p);  // the first barrier: its event is made
  upstream.set_event_creation_fails(true);
  for (int i = 0; i < 10; ++i) {
    release(p);
    CHECK(alloc(kMiB) == p);  // each after a barrier on the first event, seen complete
  }
  CHECK(upstream.event_records() == 11);
  CHECK(upstream.allocations() == 1);
}

TEST_CASE("the latest barrier's event is never recorded again while a new stream may wait on it") {
  // A non-blocking stream created later waits for the latest barrier:
  // recorded again for other work, that wait would order it after the
  // wrong work.
  VirtualUpstream upstream;
  PoolOptions options;
  StreamOrdering ordering(upstream, options);
  upstream.set_events_complete_at_once(false);
  constexpr StreamId kNonBlocking = 0x1000, kLater = 0x2000;
  ordering.stream_created(kNonBlocking, StreamKind::NonBlocking);
  REQUIRE(ordering.device_ready(ordering.stamp_free(kAnyStream).device_epoch));  // the barrier
  SECTION("a newer barrier fails half-way") {
    ordering.stamp_free(kAnyStream);
    ordering.fence_frees();  // a completion fence after it, still pending
    upstream.set_failing_record_stream(kNonBlocking);
    CHECK_FALSE(ordering.device_ready(ordering.stamp_free(kAnyStream).device_epoch));  // fails at step 1
    upstream.set_failing_record_stream(0);
  }
  SECTION("its query fails") {
    upstream.set_event_queries_fail(true);
    ordering.poll();  // the event is kept, not recycled
    upstream.set_event_queries_fail(false);
  }
  ordering.stream_destroying(kNonBlocking);  // takes a spare event and records it there
  ordering.stream_created(kLater, StreamKind::NonBlocking);
  const std::vector<VirtualUpstream::Call>& calls = upstream.calls();
  REQUIRE(!calls.empty());
  const VirtualUpstream::Call wait = calls.back();
  REQUIRE(wait.kind == VirtualUpstream::Call::Wait);
  CHECK(wait.stream == kLater);
  // The event it waits for was last recorded on the legacy stream: the barrier.
  StreamId recorded_on = 0;
  for (const VirtualUpstream::Call& c : calls) {
    if (c.kind == VirtualUpstream::Call::Record && c.event == wait.event) recorded_on = c.stream;
  }
  CHECK(recorded_on == VirtualUpstream::kLegacy);
}
