// The cross-stream protocol, seen through the upstream calls it makes.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "random_ops.hpp"
#include "pool_fixture.hpp"
#include "report/collect.hpp"
#include "report/diagnosis.hpp"

using namespace gpupool;
using gpupool::testing::FreedRanges;
using gpupool::testing::test_seed;
using gpupool::testing::take_any;
using gpupool::testing::PoolFixture;
using Call = VirtualUpstream::Call;

namespace {
constexpr StreamId kS1 = 0x1000;  // blocking (both as make_two_streams_with_pending_work makes them)
constexpr StreamId kS2 = 0x2000;  // blocking
constexpr StreamId kNB = 0x3000;  // non-blocking
constexpr StreamId kLegacy = VirtualUpstream::kLegacy;
// A quarter of its 2 MiB small segment: freed and asked for again, a plain
// request of it goes back to its place after a barrier, since the segment has
// no room for the 8 more that a loop of one size sweeps through instead
// (plain_reuse.cpp). The tests of the barrier's calls make theirs so.
constexpr std::size_t kTakesBarrier = 512 * kKiB;

// n non-blocking streams kNB, kNB + 1, ...: PyTorch's stream pool.
void add_non_blocking_streams(DevicePool& pool, int n) {
  for (int i = 0; i < n; ++i) pool.stream_created(kNB + i, StreamKind::NonBlocking);
}

int count(const std::vector<Call>& calls, Call::Kind kind, StreamId stream) {
  int n = 0;
  for (const Call& c : calls) n += (c.kind == kind && c.stream == stream) ? 1 : 0;
  return n;
}

constexpr StreamId kPtdsA = 0x12;  // two threads' per-thread default streams
constexpr StreamId kPtdsB = 0x22;

// Thread A frees a 1 MiB block on its per-thread stream, its work pending;
// thread B's stream is known too. With `only_room` the device holds 2 MiB and
// the rest of the block's segment is taken first: the freed block is then
// the only room.
DevicePtr freed_on_thread_a(PoolFixture& f, bool only_room) {
  f.make(only_room ? 2 * kMiB : kUnlimited);
  f.pool->stream_created(kPtdsA, StreamKind::PerThread);
  f.pool->stream_created(kPtdsB, StreamKind::PerThread);
  f.upstream.set_events_complete_at_once(false);
  const DevicePtr a = f.alloc(kMiB, kPtdsA);
  if (only_room) f.alloc(kMiB);
  f.release(a, kPtdsA);
  return a;
}

// Thread `t` makes a 1 MiB pair on its per-thread stream and, with `end`,
// ends as the shim ends a thread. Returns the stream.
StreamId pair_on_thread(PoolFixture& f, StreamId t, bool end) {
  const StreamId stream = (t << 4) | 0x2;
  f.pool->stream_created(stream, StreamKind::PerThread);
  f.release(f.alloc(kMiB, stream), stream);
  if (end) f.pool->thread_stream_ended(stream);
  return stream;
}

// Blocking streams kS1 and kS2 on a 2 MiB device; kS1 frees a 1 MiB block
// whose work is pending, and the rest of the device is taken (*rest, a plain
// block): that block is the only room. Returns it.
DevicePtr only_room_freed_on_s1(PoolFixture& f, DevicePtr* rest) {
  f.make(2 * kMiB);
  f.pool->stream_created(kS1, StreamKind::Blocking);
  f.pool->stream_created(kS2, StreamKind::Blocking);
  f.upstream.set_events_complete_at_once(false);
  const DevicePtr a = f.alloc(kMiB, kS1);
  *rest = f.alloc(kMiB);
  f.release(a, kS1);
  return a;
}

// The rows the pool reports for a stream.
std::vector<StreamReport> rows_of(const DevicePool& pool, StreamId id) {
  std::vector<StreamReport> rows;
  for (const StreamReport& r : pool.streams()) {
    if (r.id == id) rows.push_back(r);
  }
  return rows;
}

// The gone streams the pool reports, and the rows they take.
std::pair<std::uint64_t, int> gone_streams(const DevicePool& pool) {
  std::uint64_t streams = 0;
  int rows = 0;
  for (const StreamReport& r : pool.streams()) {
    if (r.alive) continue;
    streams += r.streams;
    ++rows;
  }
  return {streams, rows};
}
}  // namespace

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

TEST_CASE_METHOD(PoolFixture, "auto: with room to grow, another stream's pending block is left alone") {
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(12 * kMiB, kS1);
  release(a, kS1);
  upstream.clear_calls();
  CHECK(alloc(12 * kMiB, kS2) != a);  // new memory rather than a wait for s1's work
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  upstream.complete_all();  // the fence recorded by the first attempt completes
  CHECK(alloc(12 * kMiB, kS2) == a);  // complete now: taken, still no wait
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
}

TEST_CASE_METHOD(PoolFixture, "auto: under memory pressure another stream takes the block after waiting on a fence") {
  make(2 * kMiB);  // one small segment: no room to grow
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kS2, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(kMiB, kS1);
  alloc(kMiB);  // the rest of the segment: a's bytes are the only free ones
  release(a, kS1);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kS2) == a);
  const auto& c = upstream.calls();
  REQUIRE(c.size() == 2);
  CHECK((c[0].kind == Call::Record && c[0].stream == kS1));
  CHECK((c[1].kind == Call::Wait && c[1].stream == kS2 && c[1].event == c[0].event));
  const auto streams = pool->streams();
  for (const StreamReport& r : streams) {
    if (r.id == kS2) {
      CHECK(r.counters.cross_stream_reuses == 1);
      CHECK(r.counters.event_waits == 1);
    }
  }
}

TEST_CASE_METHOD(PoolFixture, "auto: a fence seen complete needs no wait") {
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(1000, kS1);
  const DevicePtr b = alloc(1000, kS1);
  alloc(1000, kS1);
  release(a, kS1);
  release(b, kS1);
  alloc(1000, kS2);  // records the fence (and waits)
  upstream.complete_all();
  upstream.clear_calls();
  alloc(1000, kS2);  // same epoch, now complete: no calls but the query
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  CHECK(count(upstream.calls(), Call::Record, kS1) == 0);
}

TEST_CASE_METHOD(PoolFixture, "completed: cross-stream reuse only once the fence has completed") {
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(12 * kMiB, kS1);
  release(a, kS1);
  const DevicePtr b = alloc(12 * kMiB, kS2);
  CHECK(b != a);  // pending: a new segment instead
  CHECK(count(upstream.calls(), Call::Record, kS1) == 1);
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  upstream.complete_all();
  CHECK(alloc(12 * kMiB, kS2) == a);
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
}

TEST_CASE_METHOD(PoolFixture, "completed: a cudaFree'd block waits for the completion fence's every event") {
  // A plain free's last use may be on any stream: the fence has an event on
  // the legacy stream and one on each non-blocking stream, and the block is
  // done only when all have completed, not when the legacy stream's has.
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_lagging_stream(kNB);
  const DevicePtr a = alloc(12 * kMiB);
  release(a);
  upstream.clear_calls();
  CHECK(alloc(12 * kMiB, kS1) != a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
  CHECK(count(upstream.calls(), Call::Record, kNB) == 1);
  CHECK(count(upstream.calls(), Call::Wait, kS1) == 0);
  upstream.complete_all();
  CHECK(alloc(12 * kMiB, kS1) == a);
}

TEST_CASE_METHOD(PoolFixture, "completed: out of memory, another stream's pending block is had after the host wait") {
  // Nothing to give back (a live block keeps the only segment), but the host
  // waits all the same before failing: the pending block is complete then.
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make(2 * kMiB);
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kS2, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  alloc(1000, kS2);
  const DevicePtr a = alloc(1000, kS1);
  release(a, kS1);
  CHECK(alloc(1000, kS2) == a);
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  CHECK(count(upstream.calls(), Call::SyncEvent, 0) == 1);
}

TEST_CASE_METHOD(PoolFixture, "never: each stream keeps its own cache") {
  options.cross_stream_reuse = CrossStreamReuse::Never;
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kS2, StreamKind::Blocking);
  const DevicePtr a = alloc(12 * kMiB, kS1);
  release(a, kS1);
  CHECK(alloc(12 * kMiB, kS2) != a);
  CHECK(alloc(12 * kMiB, kS1) == a);
}

TEST_CASE_METHOD(PoolFixture, "plain cudaMalloc may take a stream-freed block after a barrier") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  const DevicePtr a = alloc(1000, kS1);
  release(a, kS1);
  upstream.clear_calls();
  CHECK(alloc(1000) == a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
}

TEST_CASE_METHOD(PoolFixture, "neighbours freed on two streams with pending work stay apart, each its stream's") {
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(1024, kS1);
  const DevicePtr b = alloc(1024, kS1);
  release(a, kS1);
  release(b, kS2);  // merged, the block would be neither stream's: kept apart
  upstream.clear_calls();
  const std::uint64_t segments = upstream.allocations();
  CHECK(alloc(1024, kS2) == b);  // each reused at once on its own stream
  CHECK(alloc(1024, kS1) == a);
  CHECK(upstream.calls().empty());
  CHECK(upstream.allocations() == segments);
}

TEST_CASE_METHOD(PoolFixture, "neighbours kept apart merge once their work is known done") {
  // Under "never" too: known done after the host wait, the merged block is
  // then no stream's (only the barrier orders it), which under "never" only
  // plain requests take.
  options.cross_stream_reuse = GENERATE(CrossStreamReuse::Auto, CrossStreamReuse::Never);
  const StreamId taker = options.cross_stream_reuse == CrossStreamReuse::Never ? kAnyStream : kS2;
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(1024, kS1);
  const DevicePtr b = alloc(1024, kS1);
  const DevicePtr c = alloc(kMiB, kS1);  // the rest of the small segment
  const DevicePtr d = alloc(kMiB - 2048, kS1);
  release(a, kS1);
  release(b, kS2);
  CHECK(pool->fragmentation().free_blocks == 2);
  pool->release_cached();  // waits for the device: the two merge (c keeps the segment)
  CHECK(pool->fragmentation().free_blocks == 1);
  const std::uint64_t segments = upstream.allocations();
  CHECK(alloc(2048, taker) == a);  // the merged block serves a request neither half could
  CHECK(upstream.allocations() == segments);
  release(c, kS1);
  release(d, kS1);
}

TEST_CASE_METHOD(PoolFixture, "during a capture nothing is recorded and only completed blocks are reused") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  const DevicePtr a = alloc(12 * kMiB);
  release(a);
  pool->capture_began(kS1);
  upstream.clear_calls();
  const DevicePtr b = alloc(12 * kMiB);
  CHECK(b != a);
  CHECK(upstream.calls().empty());
  CHECK(pool->release_cached() == 0);  // cudaFree would break the capture
  pool->capture_ended(kS1);
  CHECK(alloc(12 * kMiB) == a);
}

TEST_CASE_METHOD(PoolFixture, "a capturing stream is never made to wait for another stream's block") {
  // The wait would join the capture: the graph would wait on an event from
  // outside it.
  DevicePtr rest = 0;
  const DevicePtr a = only_room_freed_on_s1(*this, &rest);  // a wait is the only way to it
  pool->capture_began(kS2);
  upstream.clear_calls();
  CHECK_FALSE(pool->allocate(kMiB, kS2).ok);
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  pool->capture_ended(kS2);
  CHECK(alloc(kMiB, kS2) == a);  // the capture over, after a wait
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 1);
  release(rest);
}

TEST_CASE_METHOD(PoolFixture, "a capturing stream's block waits for the capture's end to go to another stream") {
  // Nothing can be recorded on the capturing stream to order its block, and
  // no barrier can be recorded during the capture.
  DevicePtr rest = 0;
  const DevicePtr a = only_room_freed_on_s1(*this, &rest);
  pool->capture_began(kS1);
  upstream.clear_calls();
  CHECK_FALSE(pool->allocate(kMiB, kS2).ok);
  CHECK(count(upstream.calls(), Call::Record, kS1) == 0);
  pool->capture_ended(kS1);
  CHECK(alloc(kMiB, kS2) == a);  // ordered now: a fence on kS1, waited for on kS2
  CHECK(count(upstream.calls(), Call::Record, kS1) == 1);
  release(rest);
}

TEST_CASE_METHOD(PoolFixture, "while another device's stream captures, no cudaFree, device wait or unmapping") {
  // A global-mode capture forbids them from any thread, for any device.
  options.expandable_segments = GENERATE(false, true);
  options.max_split_size = 32 * kMiB;  // fixed segments: a's is oversize, the first to go before an out-of-memory
  make(64 * kMiB);
  const DevicePtr a = alloc(40 * kMiB);
  const DevicePtr b = alloc(12 * kMiB);  // live: a's memory is the only room
  release(a);
  for (int i = 0; i < 20; ++i) release(alloc(1000));  // expandable: a's pages now idle enough to recycle
  upstream.set_event_creation_fails(true);  // no barrier: the host wait would be for the whole device
  upstream.set_capture_forbids_unsafe_calls(true);
  const std::uint64_t releases = upstream.releases();
  const std::size_t pages = upstream.mapped_pages();
  CHECK(pool->release_cached() == 0);
  CHECK_FALSE(pool->allocate(48 * kMiB, kAnyStream).ok);  // out of memory rather than break the capture
  check();
  CHECK(upstream.releases() == releases);
  CHECK(upstream.mapped_pages() == pages);
  CHECK(upstream.device_syncs() == 0);
  upstream.set_capture_forbids_unsafe_calls(false);
  const DevicePtr c = alloc(48 * kMiB);  // the capture over, the cache makes room
  release(b);
  release(c);
}

TEST_CASE_METHOD(PoolFixture, "a stream-ordered free inside a capture is never reused") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  const DevicePtr a = alloc(12 * kMiB, kS1);
  pool->capture_began(kS1);
  release(a, kS1);
  pool->capture_ended(kS1);
  CHECK(pool->quarantined_bytes() == 12 * kMiB);
  CHECK(alloc(12 * kMiB, kS1) != a);
  CHECK(pool->deallocate(a, kS1) == FreeResult::NotAllocated);
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's blocks stay cached and are fenced for reuse") {
  make(2 * kMiB);  // no room to grow: the cached block is the only way
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(1000, kNB);
  release(a, kNB);
  upstream.clear_calls();
  pool->stream_destroying(kNB);
  // One event after its work, held by the blocks' key (barriers wait for it too).
  REQUIRE(count(upstream.calls(), Call::Record, kNB) == 1);
  const EventHandle own = upstream.calls()[0].event;
  check();
  // A new stream that happens to get the same handle does not inherit them...
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.clear_calls();
  const DevicePtr b = alloc(1000, kNB);
  // ...it takes it only after a wait on the device for the old work.
  CHECK(b == a);
  bool waited = false;
  for (const Call& c : upstream.calls()) waited |= c.kind == Call::Wait && c.stream == kNB && c.event == own;
  CHECK(waited);
}

// A stream made for each task: a 1 MiB pair on it, then destroyed, its work
// still pending. Returns the pair's address.
DevicePtr task_on_new_stream(PoolFixture& f, StreamId s, StreamKind kind = StreamKind::NonBlocking) {
  f.pool->stream_created(s, kind);
  const DevicePtr a = f.alloc(kMiB, s);
  f.release(a, s);
  f.pool->stream_destroying(s);
  return a;
}

TEST_CASE_METHOD(PoolFixture, "a stream made after a destroy takes the destroyed stream's pending block after a wait") {
  // Room to grow, and the destroyed stream's work still in flight: the new
  // stream waits on the device for that stream's last event (a barrier
  // would make it wait for every busy stream), and the block is taken.
  make();
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = task_on_new_stream(*this, kNB);
  pool->stream_created(kNB + 1, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB + 1) == a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);  // no barrier
  CHECK(count(upstream.calls(), Call::Wait, kNB + 1) == 1);
  for (const StreamReport& r : pool->streams()) {
    if (r.id != kNB + 1) continue;
    CHECK(r.counters.event_waits == 1);
    CHECK(r.counters.destroyed_stream_waits == 1);  // the report tells these apart
  }
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's block is taken with no call once its own event completes") {
  // Another stream still has work queued, so the device has not caught up:
  // a completion fence would stay pending, and a barrier is not needed.
  make();
  upstream.set_events_complete_at_once(true);
  pool->stream_created(kNB - 1, StreamKind::NonBlocking);
  upstream.set_lagging_stream(kNB - 1);
  release(alloc(kMiB, kNB - 1), kNB - 1);
  const DevicePtr a = task_on_new_stream(*this, kNB);
  pool->stream_created(kNB + 1, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB + 1) == a);
  CHECK(upstream.calls().empty());  // no fence, no barrier, no wait
  SECTION("and by a plain request, with no barrier") {
    release(a, kNB + 1);
    pool->stream_destroying(kNB + 1);
    upstream.clear_calls();
    CHECK(alloc(kMiB) == a);
    // A barrier would make the lagging stream wait. (A look at that
    // stream's own pending block records a completion fence, no wait.)
    CHECK(count(upstream.calls(), Call::Wait, kNB - 1) == 0);
  }
  check();
}

TEST_CASE_METHOD(PoolFixture, "a barrier waits for a destroyed stream's last event") {
  // Its work may still use memory that cudaFree handed back after the
  // destroy: cudaFree's promise covers all work queued before it. (Under
  // "never" its blocks are plain requests' alone, the event kept all the same.)
  const CrossStreamReuse policy = GENERATE(CrossStreamReuse::Auto, CrossStreamReuse::Never);
  options.cross_stream_reuse = policy;
  make(2 * kMiB);  // one small segment: no room to grow
  upstream.set_events_complete_at_once(false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  const DevicePtr live = alloc(kMiB, kNB);
  pool->stream_destroying(kNB);
  const EventHandle own = upstream.calls().back().event;
  REQUIRE(upstream.calls().back().kind == Call::Record);
  release(live);  // plain: all work before it, the destroyed stream's too
  upstream.clear_calls();
  CHECK(alloc(kMiB) == live);  // back where it was, through a barrier
  bool waited = false;
  for (const Call& c : upstream.calls()) waited |= c.kind == Call::Wait && c.stream == kLegacy && c.event == own;
  CHECK(waited);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a barrier does not wait for destroyed streams' events already complete") {
  // Each would be one cudaStreamWaitEvent for nothing: the barrier asks
  // after them first.
  make();
  upstream.set_events_complete_at_once(false);
  const DevicePtr p = alloc(4 * kMiB);
  release(p);
  CHECK(alloc(4 * kMiB) == p);  // a first barrier: the next takes a fresh event, with no poll on the way
  for (StreamId s = kNB; s < kNB + 5; ++s) task_on_new_stream(*this, s);
  upstream.complete_all();
  release(p);
  upstream.clear_calls();
  CHECK(alloc(4 * kMiB) == p);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);  // the barrier
  CHECK(count(upstream.calls(), Call::Wait, kLegacy) == 0);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a completion fence made while a destroyed stream's work is in flight waits for it") {
  // The fence's own events complete at once, the destroyed stream's stays
  // pending: blocks freed before the fence are not known done until it is.
  options.cross_stream_reuse = CrossStreamReuse::Completed;  // no waits: only completion
  make(42 * kMiB);  // a's 20 MiB segment, a small one, b's: no more
  upstream.set_events_complete_at_once(true);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_lagging_stream(kNB);
  const DevicePtr a = alloc(4 * kMiB);
  release(alloc(kMiB, kNB), kNB);
  pool->stream_destroying(kNB);  // its event pending
  upstream.set_lagging_stream(0);
  release(a);  // plain: it promises the destroyed stream's work done before reuse
  pool->stream_created(kS1, StreamKind::NonBlocking);
  upstream.clear_calls();
  const DevicePtr b = alloc(4 * kMiB, kS1);
  CHECK(b != a);  // new memory: no barrier, no wait under "completed"
  CHECK(count(upstream.calls(), Call::Wait, kS1) == 0);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);  // the fence's
  release(b, kS1);
  pool->stream_destroying(kS1);
  pool->stream_created(kS2, StreamKind::NonBlocking);
  // Still pending: not taken, though the fence's own events have completed.
  const DevicePtr c = alloc(4 * kMiB, kS2);
  CHECK(c != a);
  upstream.complete_all();
  pool->stream_created(kS2 + 1, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(17 * kMiB, kS2 + 1) == a);  // only a's block is that large
  for (const Call& call : upstream.calls()) CHECK(call.kind == Call::Record);  // known done: no host wait
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream whose event erred holds no fence back after a device wait") {
  // Its query's error leaves its work covered by nothing: barriers stop
  // until a host wait for the whole device, after which all of it is done,
  // and completion fences must not wait for that stream's event any more.
  options.cross_stream_reuse = CrossStreamReuse::Completed;  // reuse across streams only when complete
  make();
  upstream.set_events_complete_at_once(false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  release(alloc(kMiB, kNB), kNB);
  pool->stream_destroying(kNB);
  upstream.set_event_queries_fail(true);
  pool->stream_created(kS1, StreamKind::NonBlocking);
  alloc(kMiB, kS1);  // asks the destroyed stream's event: an error
  upstream.set_event_queries_fail(false);
  upstream.set_events_complete_at_once(true);
  const DevicePtr p = alloc(4 * kMiB);
  release(p);
  upstream.clear_calls();
  CHECK(alloc(4 * kMiB) == p);  // through the device wait
  CHECK(count(upstream.calls(), Call::SyncDevice, 0) == 1);
  release(p);
  pool->stream_created(kS2, StreamKind::NonBlocking);
  CHECK(alloc(4 * kMiB, kS2) == p);  // a completion fence, complete at once
  check();
}

// The pool made afresh under `policy` on expandable or fixed segments, on a
// device that lags: events complete only when the test says.
void make_lagging(PoolFixture& f, CrossStreamReuse policy, bool expandable) {
  f.options.expandable_segments = expandable;
  f.options.cross_stream_reuse = policy;
  f.make();
  f.upstream.set_events_complete_at_once(false);
}

TEST_CASE_METHOD(PoolFixture, "under completed or never, a stream made for each task makes no stream wait") {
  // The tasks' streams end with work in flight: each new task takes new
  // memory or a done block, never a barrier or a wait (which would put it
  // behind every earlier task on the device).
  const CrossStreamReuse policy = GENERATE(CrossStreamReuse::Completed, CrossStreamReuse::Never);
  for (const bool expandable : {true, false}) {
    DYNAMIC_SECTION("expandable segments " << expandable) {
      make_lagging(*this, policy, expandable);
      upstream.clear_calls();
      for (StreamId s = kNB; s < kNB + 40; ++s) task_on_new_stream(*this, s);
      for (const Call& c : upstream.calls()) CHECK(c.kind != Call::Wait);
      // The device catches up and keeps up: under completed the tasks reuse
      // what they left.
      upstream.complete_all();
      upstream.set_events_complete_at_once(true);
      const std::size_t reserved = upstream.in_use();
      for (StreamId s = kNB + 40; s < kNB + 80; ++s) task_on_new_stream(*this, s);
      if (policy == CrossStreamReuse::Completed) CHECK(upstream.in_use() == reserved);
      check();
    }
  }
}

// `count` tasks, each a non-blocking stream (ids from `first`) taking 1 MiB,
// the last task's stream destroyed then, and the block freed: each task looks
// at the last one's block while that stream lives.
void overlapping_tasks(PoolFixture& f, StreamId first, int count) {
  StreamId last = 0;
  for (StreamId s = first; s < first + count; ++s) {
    f.pool->stream_created(s, StreamKind::NonBlocking);
    const DevicePtr p = f.alloc(kMiB, s);
    if (last != 0) f.pool->stream_destroying(last);
    f.release(p, s);
    last = s;
  }
  f.pool->stream_destroying(last);
}

TEST_CASE_METHOD(PoolFixture, "overlapping tasks' streams, destroyed with a fence pending, make no barrier") {
  // Each task's stream is destroyed after the next task has taken memory:
  // that task looked at the last one's block while its stream lived, and
  // a fence was recorded on it, pending at the destroy. The stream's own
  // event at the destroy covers that fence's work. Waiting for the fence's
  // event too made every completion fence a barrier meanwhile (growing the
  // pool makes one), which puts each task's stream behind every busy one.
  const CrossStreamReuse policy =
      GENERATE(CrossStreamReuse::Auto, CrossStreamReuse::Completed, CrossStreamReuse::Never);
  for (const bool expandable : {true, false}) {
    DYNAMIC_SECTION("expandable segments " << expandable) {
      make_lagging(*this, policy, expandable);
      pool->stream_created(kNB - 1, StreamKind::NonBlocking);  // kept busy
      release(alloc(kMiB, kNB - 1), kNB - 1);
      upstream.clear_calls();
      overlapping_tasks(*this, kNB, 40);
      int task_records = 0;  // one at each destroy, and the fences
      for (const Call& c : upstream.calls()) {
        task_records += c.kind == Call::Record && c.stream >= kNB && c.stream < kNB + 40 ? 1 : 0;
        // A barrier makes the legacy stream wait (for a busy stream's event
        // or a destroyed one's); under completed and never no stream waits.
        CHECK_FALSE((c.kind == Call::Wait && (c.stream == kLegacy || policy != CrossStreamReuse::Auto)));
      }
      // (Under never no stream looks at another's blocks.)
      if (policy != CrossStreamReuse::Never) CHECK(task_records > 40);
      check();
    }
  }
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's fences are recycled once complete") {
  // Nothing waits for them, but each is kept until complete: recorded again
  // while pending, it would stand for other work. Once complete it serves
  // again, so rounds of such tasks make no more events.
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make();
  upstream.set_events_complete_at_once(false);
  std::size_t events_after_first_rounds = 0;
  for (int round = 0; round < 10; ++round) {
    overlapping_tasks(*this, kNB + 100 * round, 10);
    upstream.complete_all();
    if (round == 1) events_after_first_rounds = upstream.events_created();
  }
  CHECK(upstream.events_created() == events_after_first_rounds);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's block known done merges with the next destroyed stream's") {
  // Two tasks' 4 MiB blocks side by side, the rest of the segment live: each
  // destroy asks after the oldest destroyed stream's event, so at the second
  // the first block is known done and joins the second. A request of both
  // together then fits; kept apart, the pool would grow.
  options.expandable_segments = false;
  make();
  upstream.set_events_complete_at_once(true);
  pool->stream_created(kNB - 1, StreamKind::NonBlocking);  // keeps the device's fences pending
  upstream.set_lagging_stream(kNB - 1);
  release(alloc(kMiB, kNB - 1), kNB - 1);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  pool->stream_created(kNB + 1, StreamKind::NonBlocking);
  pool->stream_created(kS1, StreamKind::Blocking);
  const DevicePtr a = alloc(4 * kMiB, kNB);
  const DevicePtr b = alloc(4 * kMiB, kNB + 1);
  alloc(12 * kMiB, kS1);  // the rest of the 20 MiB segment
  REQUIRE(b == a + 4 * kMiB);
  release(a, kNB);
  release(b, kNB + 1);
  pool->stream_destroying(kNB);
  pool->stream_destroying(kNB + 1);
  const std::int64_t reserved = current(pool->stats().reserved_bytes);
  pool->stream_created(kNB + 2, StreamKind::NonBlocking);
  CHECK(alloc(8 * kMiB, kNB + 2) == a);
  CHECK(current(pool->stats().reserved_bytes) == reserved);
  check();
}

TEST_CASE_METHOD(PoolFixture, "destroyed streams' own events are kept under their keys however many are pending") {
  // The device never catches up: each task waits for the one before, and
  // every destroyed stream's event stays pending, past a thousand of them.
  // The next stream still waits for the last one's event alone: no barrier,
  // which would make it wait for every busy stream.
  make();
  upstream.set_events_complete_at_once(false);
  for (StreamId t = 0; t < 1100; ++t) task_on_new_stream(*this, kNB + t);
  const DevicePtr last_block = task_on_new_stream(*this, kNB + 1100);
  std::set<EventHandle> destroy_events;  // (none completes: each is its own)
  EventHandle last = 0;  // the last destroy's event
  for (const Call& c : upstream.calls()) {
    if (c.kind != Call::Record || c.stream < kNB || c.stream > kNB + 1100) continue;
    destroy_events.insert(c.event);
    if (c.stream == kNB + 1100) last = c.event;
  }
  REQUIRE(destroy_events.size() == 1101);
  REQUIRE(last != 0);
  pool->stream_created(kNB + 1101, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB + 1101) == last_block);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);  // no barrier
  CHECK(count(upstream.calls(), Call::Wait, kNB + 1101) == 1);
  bool waited = false;  // for that event
  for (const Call& c : upstream.calls()) waited |= c.kind == Call::Wait && c.stream == kNB + 1101 && c.event == last;
  CHECK(waited);
  SECTION("a barrier waits for every one of them") {
    const DevicePtr p = alloc(kMiB);
    release(p);
    upstream.clear_calls();
    CHECK(alloc(kMiB) == p);
    CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
    std::set<EventHandle> waited_for;
    for (const Call& c : upstream.calls()) {
      if (c.kind == Call::Wait && c.stream == kLegacy && destroy_events.count(c.event) != 0) waited_for.insert(c.event);
    }
    CHECK(waited_for == destroy_events);
  }
  SECTION("its query answering with an error leaves that work to a device wait") {
    upstream.set_failing_event_query(last);
    const DevicePtr p = alloc(kMiB);
    release(p);
    upstream.clear_calls();
    CHECK(alloc(kMiB) == p);  // no barrier can cover that work: the host waits for the device
    CHECK(count(upstream.calls(), Call::SyncDevice, 0) == 1);
  }
  CHECK(current(pool->stats().reserved_bytes) <= static_cast<std::int64_t>(4 * kMiB));
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's block whose own event answers with an error is not taken as done") {
  make();
  upstream.set_events_complete_at_once(true);
  const DevicePtr a = task_on_new_stream(*this, kNB);
  upstream.set_event_queries_fail(true);
  // Nothing shows its work done. A stream that follows the legacy stream is
  // not ordered after it by a completion fence either: a non-blocking
  // stream's work does not come before the legacy stream's event.
  const StreamKind kind = GENERATE(StreamKind::NonBlocking, StreamKind::PerThread);
  pool->stream_created(kNB + 1, kind);
  CHECK(alloc(kMiB, kNB + 1) != a);
  check();
}

// Two plain blocks freed, each in a segment its other half keeps; a plain
// request takes the first after a barrier, which covers the second's free
// too. Returns the second.
DevicePtr covered_plain_block(PoolFixture& f) {
  f.make();
  f.upstream.set_events_complete_at_once(false);
  const DevicePtr a = f.alloc(kMiB);
  f.alloc(kMiB);
  const DevicePtr x = f.alloc(kMiB);
  f.alloc(kMiB);
  f.release(a);
  f.release(x);
  REQUIRE(f.alloc(kMiB) == a);  // after a barrier
  return x;
}

TEST_CASE_METHOD(PoolFixture, "a block a barrier already covers is taken by a stream with no call") {
  // Every stream's later work follows that barrier: taking the block adds no
  // dependency, where the pool would otherwise grow.
  const DevicePtr x = covered_plain_block(*this);
  pool->stream_created(kNB, StreamKind::NonBlocking);  // made to follow the barrier
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB) == x);
  CHECK(upstream.calls().empty());
  check();
}

TEST_CASE_METHOD(PoolFixture, "another stream's block freed before a barrier is taken with no call") {
  make();
  upstream.set_events_complete_at_once(false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  pool->stream_created(kNB + 1, StreamKind::NonBlocking);
  const DevicePtr a = alloc(kMiB, kNB);
  alloc(kMiB, kNB);  // the segment's other half stays taken
  release(a, kNB);
  const DevicePtr p = alloc(kMiB);
  alloc(kMiB);
  release(p);
  CHECK(alloc(kMiB) == p);  // after a barrier, which a's free came before
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB + 1) == a);
  CHECK(upstream.calls().empty());  // no query of kNB, no fence on it, no wait
  check();
}

TEST_CASE_METHOD(PoolFixture, "under the completed policy a barrier's cover is not enough for a stream") {
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  const DevicePtr x = covered_plain_block(*this);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  CHECK(alloc(kMiB, kNB) != x);
  check();
}

TEST_CASE_METHOD(PoolFixture, "during a capture a barrier's cover is not enough for a stream") {
  // What is captured runs when the graph is launched, on a stream that need
  // not follow the barrier.
  const DevicePtr x = covered_plain_block(*this);
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  pool->capture_began(kS1);
  CHECK(alloc(kMiB, kNB) != x);
  pool->capture_ended(kS1);
  check();
}

// 40 tasks, each a non-blocking stream made, `blocks` 1 MiB blocks taken on
// it and freed (in one epoch), and the stream destroyed; the device completes
// everything between tasks. Returns the bytes reserved then.
std::int64_t reserved_after_tasks(PoolFixture& f, int blocks) {
  f.make();
  f.upstream.set_events_complete_at_once(false);
  for (StreamId t = 0; t < 40; ++t) {
    const StreamId s = kNB + t;
    f.pool->stream_created(s, StreamKind::NonBlocking);
    std::vector<DevicePtr> taken;
    for (int i = 0; i < blocks; ++i) taken.push_back(f.alloc(kMiB, s));
    for (DevicePtr p : taken) f.release(p, s);
    f.pool->stream_destroying(s);
    f.upstream.complete_all();
  }
  f.check();
  return f.current(f.pool->stats().reserved_bytes);
}

TEST_CASE_METHOD(PoolFixture, "a stream made for each task reuses the blocks of those before it") {
  // Each look records a fence that the device completes before the next
  // task (a device that keeps up): the newest block is still pending, the
  // one before it done. Only the newest was looked at before, and each task
  // grew the pool. In an expandable segment the blocks are merged into one
  // free block, whose newest free (the last task's) is pending at every look
  // while all before it is done; before the newest free's bytes were told
  // apart, the whole block looked pending, and a new page was mapped every
  // task or two.
  options.expandable_segments = GENERATE(false, true);
  CHECK(reserved_after_tasks(*this, 1) <= static_cast<std::int64_t>(4 * kMiB));
}

TEST_CASE_METHOD(PoolFixture, "a task's frees in one epoch are all the newest: the blocks before them are taken") {
  // Two blocks a task, freed with no fence between: their bytes together are
  // the newest free, and what the tasks before freed is done.
  options.expandable_segments = true;
  CHECK(reserved_after_tasks(*this, 2) <= static_cast<std::int64_t>(6 * kMiB));
}

TEST_CASE_METHOD(PoolFixture, "a stream made for each task beside a stream that lags takes the blocks of tasks done") {
  // A long-lived stream always has work pending (a compute stream fed ahead
  // of the device), so no completion fence completes; each task's stream
  // is done by the next task. Its blocks are then known done by the event
  // recorded on it at its destroy, without the device catching up. Before,
  // they waited for a completion fence, and the pool grew at every task.
  options.expandable_segments = GENERATE(false, true);
  make();
  upstream.set_events_complete_at_once(true);
  pool->stream_created(kNB - 1, StreamKind::NonBlocking);
  upstream.set_lagging_stream(kNB - 1);
  release(alloc(kMiB, kNB - 1), kNB - 1);
  for (StreamId t = 0; t < 40; ++t) {
    const StreamId s = kNB + t;
    pool->stream_created(s, StreamKind::NonBlocking);
    release(alloc(kMiB, s), s);
    pool->stream_destroying(s);
  }
  check();
  CHECK(current(pool->stats().reserved_bytes) <= static_cast<std::int64_t>(6 * kMiB));
}

TEST_CASE_METHOD(PoolFixture, "every other stream's best fit is looked at before more blocks of any one") {
  // 20 streams with four pending blocks each, kept apart (their neighbours
  // are other streams' pending blocks); only the last stream, in key order,
  // is idle. Four blocks of each stream in key order would fill the 64
  // candidates before its turn.
  options.expandable_segments = false;
  make();
  constexpr int kStreams = 20;
  add_non_blocking_streams(*pool, kStreams);
  std::vector<DevicePtr> blocks[kStreams];
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < kStreams; ++i) blocks[i].push_back(alloc(kMiB, kNB + i));
  }
  for (int i = 0; i < kStreams; ++i) {
    for (DevicePtr p : blocks[i]) release(p, kNB + i);
  }
  upstream.set_idle_stream(kNB + kStreams - 1);
  const StreamId consumer = kNB + 100;
  pool->stream_created(consumer, StreamKind::NonBlocking);
  const DevicePtr taken = alloc(kMiB, consumer);
  const std::vector<DevicePtr>& idle = blocks[kStreams - 1];
  CHECK(std::find(idle.begin(), idle.end(), taken) != idle.end());
  check();
}

TEST_CASE_METHOD(PoolFixture, "a stream takes bytes above a block's hot range while its older frees are pending") {
  // The older hot bytes not yet known done: the hot range as a whole decides,
  // and the never-used bytes above it are taken.
  options.expandable_segments = true;
  make();
  upstream.set_events_complete_at_once(false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  const DevicePtr y = alloc(kMiB / 2);  // small pool: [y, y + 2 MiB) mapped
  const DevicePtr x = alloc(kMiB / 2);
  REQUIRE(x == y + kMiB / 2);
  const DevicePtr large = alloc(4 * kMiB);
  alloc(4 * kMiB);  // keeps the large block apart
  release(x);
  release(large);
  alloc(4 * kMiB, kNB);  // looks at the large block: a completion fence, pending
  release(y);            // newer than x: y's bytes are the newest free's
  CHECK(alloc(kMiB, kNB) == y + kMiB);
  check();
}

TEST_CASE_METHOD(PoolFixture, "under the completed policy a destroyed stream's pending block is left alone") {
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make();
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = task_on_new_stream(*this, kNB);
  pool->stream_created(kNB + 1, StreamKind::NonBlocking);
  CHECK(alloc(kMiB, kNB + 1) != a);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a stream whose destroy is refused lives on with its kind, counters and captures") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  release(alloc(1000, kS1), kS1);
  const DevicePtr a = alloc(1000, kS1);  // a same-stream reuse
  release(a, kS1);
  pool->capture_began(kS1);
  pool->stream_destroy_begin(kS1);
  // Its capture still counts until the runtime answers: a barrier now would
  // record on the legacy stream, which breaks a blocking stream's capture.
  CHECK(pool->capture_active());
  release(alloc(1000));
  upstream.clear_calls();
  alloc(1000);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);
  check();  // held aside meanwhile: no event held twice, no block keyed to it
  const std::vector<StreamReport> held = rows_of(*pool, kS1);  // and still in a report written meanwhile
  REQUIRE(held.size() == 1);
  CHECK(held[0].alive);
  pool->stream_destroy_end(kS1, false);
  CHECK(pool->is_capturing(kS1));
  pool->capture_ended(kS1);
  check();
  std::vector<StreamReport> rows = rows_of(*pool, kS1);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].alive);
  CHECK(rows[0].kind == StreamKind::Blocking);
  CHECK(rows[0].counters.same_stream_reuses == 1);
  CHECK(gone_streams(*pool).first == 0);
  // Met again between the steps (a call from another thread): one stream.
  pool->capture_began(kS1);
  pool->stream_destroy_begin(kS1);
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_destroy_end(kS1, false);
  CHECK(pool->is_capturing(kS1));
  pool->capture_ended(kS1);
  CHECK_FALSE(pool->capture_active());
  rows = rows_of(*pool, kS1);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].counters.same_stream_reuses == 1);
  // Destroyed after all: its counters go to the gone streams.
  pool->stream_destroy_begin(kS1);
  pool->stream_destroy_end(kS1, true);
  CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{1, 1});
  check();
  // A device reset between the steps destroys it with the rest: the fresh
  // pool reports it gone, and the answer that comes after finds nothing.
  pool->stream_created(kS2, StreamKind::Blocking);
  pool->stream_destroy_begin(kS2);
  std::unique_ptr<DevicePool> before = std::move(pool);
  make();
  pool->continue_history(*before);
  CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{2, 2});
  pool->stream_destroy_end(kS2, false);
  CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{2, 2});
  for (const StreamReport& r : rows_of(*pool, kS2)) CHECK_FALSE(r.alive);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a second destroy of a stream met again while its first is under way reports both gone") {
  // A racing program: one thread destroys the stream, another uses it (it is
  // met again as a new stream, and captures) and destroys it too.
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->capture_began(kS1);
  pool->stream_destroy_begin(kS1);
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->capture_began(kS1);
  pool->stream_destroy_begin(kS1);  // the first is still held aside: this one is gone at once
  CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{1, 1});
  CHECK(pool->capture_active());  // the first's capture, until its answer
  pool->stream_destroy_end(kS1, true);
  CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{2, 2});
  CHECK_FALSE(pool->capture_active());
  check();
}

TEST_CASE_METHOD(PoolFixture, "a non-blocking stream whose destroy is refused follows the barriers made meanwhile") {
  // Another thread's plain pair records a barrier while the destroy is under
  // way: the stream, held aside, was not made to wait for it, and the block
  // that barrier covered may be used on the stream as soon as it lives on.
  make();
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  release(alloc(kTakesBarrier));
  pool->stream_destroy_begin(kNB);
  upstream.clear_calls();
  alloc(kTakesBarrier);  // the barrier
  REQUIRE(count(upstream.calls(), Call::Record, kLegacy) == 1);
  const EventHandle barrier = upstream.calls().back().event;
  CHECK(count(upstream.calls(), Call::Wait, kNB) == 0);
  upstream.clear_calls();
  pool->stream_destroy_end(kNB, false);
  REQUIRE(upstream.calls().size() == 1);
  CHECK((upstream.calls()[0].kind == Call::Wait && upstream.calls()[0].stream == kNB &&
         upstream.calls()[0].event == barrier));
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's work that nothing covers blocks reuse until a device wait") {
  // A barrier would not follow that work, and a completion fence would not
  // see it done.
  make(2 * kMiB);  // one segment, kept by a live block: no room, nothing to give back
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  alloc(kMiB);
  const DevicePtr a = alloc(kMiB, kNB);  // with the block above, the whole segment
  release(a, kNB);
  SECTION("its fence cannot be recorded and the host cannot wait for it") {
    upstream.set_failing_record_stream(kNB);
    upstream.set_host_waits_fail(true);
    pool->stream_destroying(kNB);
    upstream.set_failing_record_stream(0);
  }
  SECTION("destroyed where gpupool could not see it, its handle given to a new stream") {
    // (By the driver's own call.) No event can be recorded on the old stream:
    // the handle names the new one now, which must not take the old one's
    // block as its own either.
    pool->stream_created(kNB, StreamKind::NonBlocking);
    CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{1, 1});  // the old stream's row
    upstream.set_host_waits_fail(true);
    CHECK_FALSE(pool->allocate(1000, kNB).ok);
  }
  // Events recorded now complete at once: none of them follows that work.
  upstream.set_events_complete_at_once(true);
  pool->stream_created(kS1, StreamKind::Blocking);
  upstream.clear_calls();
  CHECK_FALSE(pool->allocate(1000, kAnyStream).ok);  // no barrier
  CHECK_FALSE(pool->allocate(1000, kS1).ok);          // no completion fence
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);
  // Once the host can wait for the whole device, the block is had again.
  upstream.set_host_waits_fail(false);
  CHECK(pool->allocate(1000, kAnyStream).ptr == a);
  CHECK(upstream.device_syncs() == 1);
  check();
  // And barriers order reuse again, with no more host waits.
  release(a);
  upstream.clear_calls();
  CHECK(alloc(kMiB) == a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
  CHECK(upstream.device_syncs() == 1);
}

TEST_CASE_METHOD(PoolFixture, "with a destroyed stream's work uncovered a plain request waits for the device once, and does not grow") {
  // Barriers stop until the host has waited for the whole device. With room
  // to grow, a plain request would otherwise take new memory every time.
  make();  // room to grow; each block a segment of its own
  pool->stream_created(kNB, StreamKind::NonBlocking);
  pool->stream_created(kS1, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(12 * kMiB, kNB);
  release(a, kNB);
  pool->stream_created(kNB, StreamKind::NonBlocking);  // destroyed unseen: its handle given again
  const std::int64_t reserved = pool->stats().reserved_bytes[kAll].current;
  upstream.clear_calls();
  // A stream-ordered request never waits on the host: it grows instead.
  const DevicePtr b = alloc(12 * kMiB, kS1);
  CHECK(b != a);
  CHECK(upstream.device_syncs() == 0);
  release(b, kS1);
  const std::int64_t grown = pool->stats().reserved_bytes[kAll].current;
  SECTION("the host may wait") {
    CHECK(alloc(12 * kMiB) == a);
    CHECK(upstream.device_syncs() == 1);
    CHECK(pool->stats().reserved_bytes[kAll].current == grown);
    // Barriers order reuse again, with no more host waits.
    release(a);
    upstream.clear_calls();
    CHECK(alloc(12 * kMiB) == a);
    CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
    CHECK(upstream.device_syncs() == 1);
  }
  SECTION("the host wait fails") {
    upstream.set_host_waits_fail(true);
    CHECK(alloc(12 * kMiB) != a);  // new memory, as before
    CHECK(pool->stats().reserved_bytes[kAll].current > grown);
  }
  SECTION("a stream captures") {
    pool->capture_began(kS1);  // a device wait would break the capture
    CHECK(alloc(12 * kMiB) != a);
    CHECK(upstream.device_syncs() == 0);
    pool->capture_ended(kS1);
  }
  CHECK(grown > reserved);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a stream destroyed while it captures is left alone and its work waits for a device sync") {
  // An event recorded or a host wait on it would break the capture, which
  // goes on where the runtime refuses the destroy. Its work from before the
  // capture stays uncovered until the host has waited for the whole device,
  // unless the stream lives on: then the barriers made once its capture is
  // over record on it and cover that work.
  make(2 * kMiB);  // one segment, kept by a live block
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  alloc(kMiB);
  const DevicePtr a = alloc(kMiB, kNB);
  release(a);  // plain cudaFree: only a barrier, which must follow kNB's work, lets it go
  pool->capture_began(kNB);
  upstream.clear_calls();
  pool->stream_destroy_begin(kNB);
  SECTION("destroyed") {
    pool->stream_destroy_end(kNB, true);
    CHECK(upstream.calls().empty());
    CHECK_FALSE(pool->capture_active());
    upstream.set_events_complete_at_once(true);
    upstream.set_host_waits_fail(true);
    CHECK_FALSE(pool->allocate(1000, kAnyStream).ok);  // no barrier: it would not follow kNB's work
    CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);
    upstream.set_host_waits_fail(false);
    CHECK(pool->allocate(1000, kAnyStream).ptr == a);  // after a device wait
    CHECK(upstream.device_syncs() == 1);
  }
  SECTION("refused") {
    pool->stream_destroy_end(kNB, false);
    CHECK(upstream.calls().empty());
    pool->capture_ended(kNB);
    upstream.set_events_complete_at_once(true);
    upstream.set_host_waits_fail(true);
    CHECK(pool->allocate(1000, kAnyStream).ptr == a);  // after a barrier, not a device wait
    CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
    CHECK(count(upstream.calls(), Call::Wait, kLegacy) == 1);  // for kNB's event
    CHECK(upstream.device_syncs() == 0);
  }
  check();
}

TEST_CASE_METHOD(PoolFixture, "a destroyed stream's fence whose query fails no longer covers its work") {
  // The error says nothing of that work: the barrier the query was made for
  // must not go ahead without it.
  make(2 * kMiB);  // one segment, kept by a live block
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  alloc(1000);
  const DevicePtr a = alloc(1000, kNB);
  release(a, kNB);
  pool->stream_destroying(kNB);  // its fence is recorded
  upstream.set_queries_fail(true);
  upstream.set_events_complete_at_once(true);
  upstream.set_host_waits_fail(true);
  upstream.clear_calls();
  CHECK_FALSE(pool->allocate(1000, kAnyStream).ok);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 0);
  upstream.set_queries_fail(false);
  upstream.set_host_waits_fail(false);
  CHECK(pool->allocate(1000, kAnyStream).ptr == a);  // after a device wait
  CHECK(upstream.device_syncs() == 1);
  check();
}

TEST_CASE_METHOD(PoolFixture, "another thread's per-thread stream is ordered through the legacy stream") {
  // Its work pending and room to grow: a per-thread stream follows the
  // completion fence's legacy event, which follows thread A's work, so the
  // block is taken at once; a non-blocking stream follows nothing, and grows.
  const DevicePtr a = freed_on_thread_a(*this, false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB) != a);
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);  // the completion fence
  CHECK(count(upstream.calls(), Call::Record, kPtdsA) == 0);   // unreachable from here
  upstream.clear_calls();
  CHECK(alloc(kMiB, kPtdsB) == a);
  CHECK(upstream.calls().empty());  // that fence covers the free: no wait, no record
  check();
}

TEST_CASE_METHOD(PoolFixture, "a stream that ignores the legacy stream takes another thread's block through the barrier") {
  const DevicePtr a = freed_on_thread_a(*this, true);  // no room to grow: the cached block is the only way
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kNB) == a);
  CHECK(count(upstream.calls(), Call::Record, kPtdsA) == 0);
  // A completion fence at the first look (no room to wait for it), then the
  // barrier, which the non-blocking stream waits for.
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 2);
  CHECK(count(upstream.calls(), Call::Wait, kNB) == 1);
  check();
}

TEST_CASE_METHOD(PoolFixture, "a completion fence from before a free does not order it") {
  const DevicePtr a = freed_on_thread_a(*this, false);
  CHECK(alloc(kMiB, kPtdsB) == a);  // after a fence that covers A's free
  const DevicePtr rest = alloc(kMiB, kPtdsA);  // the segment's other half
  release(a, kPtdsB);                          // after that fence
  upstream.set_failing_record_stream(kLegacy);  // no new fence can be had
  CHECK(alloc(kMiB, kPtdsA) != a);  // a new segment,
  CHECK(alloc(kMiB, kPtdsA) != a);  // and its rest
  upstream.set_failing_record_stream(0);
  CHECK(alloc(kMiB, kPtdsA) == a);  // a fence recorded now covers it
  release(rest, kPtdsA);
  check();
}

TEST_CASE_METHOD(PoolFixture, "no block is taken through the legacy stream while a capture is under way") {
  // A graph captured now runs later, on a stream it cannot be known to follow.
  const DevicePtr a = freed_on_thread_a(*this, false);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  pool->stream_created(kS1, StreamKind::Blocking);
  // Its look records the completion fence; it takes the segment's other
  // half, then a new segment, whole: a is left the only free block.
  for (int i = 0; i < 3; ++i) CHECK(alloc(kMiB, kNB) != a);
  pool->capture_began(kS1);
  CHECK(alloc(kMiB, kPtdsB) != a);
  CHECK(alloc(kMiB, kPtdsB) != a);
  pool->capture_ended(kS1);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kPtdsB) == a);
  CHECK(upstream.calls().empty());
  check();
}

TEST_CASE_METHOD(PoolFixture, "the completed policy leaves another thread's pending block alone") {
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  const DevicePtr a = freed_on_thread_a(*this, false);
  CHECK(alloc(kMiB, kPtdsB) != a);  // a new segment,
  CHECK(alloc(kMiB, kPtdsB) != a);  // and its rest
  upstream.complete_all();
  CHECK(alloc(kMiB, kPtdsB) == a);
  check();
}

TEST_CASE_METHOD(PoolFixture, "the unsafe debug switch really skips every ordering step") {
  options.unsafe_skip_ordering = true;
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  release(alloc(1000, kS1), kS1);
  release(alloc(1000));
  upstream.clear_calls();
  alloc(1000, kS2);
  alloc(1000);
  CHECK(upstream.calls().empty());
}

TEST_CASE_METHOD(PoolFixture, "an idle freeing stream hands its blocks over with no fence and no wait") {
  make();
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kS2, StreamKind::Blocking);
  upstream.set_streams_idle(true);
  const DevicePtr a = alloc(1000, kS1);
  release(a, kS1);
  upstream.clear_calls();
  CHECK(alloc(1000, kS2) == a);
  CHECK(upstream.calls().empty());
  // A later free on the idle-checked stream is not taken while pending.
  upstream.set_streams_idle(false);
  upstream.set_events_complete_at_once(false);
  const DevicePtr b = alloc(1000, kS1);
  release(b, kS1);
  upstream.clear_calls();
  CHECK(alloc(1000, kS2) != b);
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
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

namespace {
bool advises(const DevicePool& pool, const char* words) {
  const std::vector<std::string> lines = report::advice(report::collect(pool, 0));
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return line.find(words) != std::string::npos; });
}
}  // namespace

TEST_CASE_METHOD(PoolFixture, "the report tells barrier waits from cross-stream waits, and advises on each") {
  // Plain pairs beside 16 non-blocking streams with work in flight: every
  // reuse is a barrier, and every barrier a wait on each of them.
  make();
  constexpr int kStreams = 16;
  add_non_blocking_streams(*pool, kStreams);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(kTakesBarrier);
  for (int i = 0; i < 2000; ++i) {
    release(a);
    REQUIRE(alloc(kTakesBarrier) == a);
  }
  std::uint64_t barriers = 0;
  for (const StreamReport& r : pool->streams()) {
    if (r.id == kAnyStream) barriers = r.counters.fences_recorded;
  }
  CHECK(barriers == 2000);
  for (const StreamReport& r : pool->streams()) {
    if (r.kind != StreamKind::NonBlocking) continue;
    CHECK(r.counters.barrier_waits == barriers);
    CHECK(r.counters.event_waits == 0);
  }
  CHECK(advises(*pool, "cudaStreamNonBlocking"));
  CHECK(advises(*pool, "expandable_segments:True, which keeps its waste low"));  // the line's end: not cut short
  CHECK_FALSE(advises(*pool, "GPUPOOL_CROSS_STREAM_REUSE"));  // that setting changes nothing here
}

TEST_CASE_METHOD(PoolFixture, "streams taking each other's blocks are advised the cross-stream setting, not barriers") {
  make(20 * kMiB);  // room for one block: each stream waits for the other's fence
  pool->stream_created(kS1, StreamKind::Blocking);
  pool->stream_created(kS2, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  for (int i = 0; i < 1000; ++i) {
    release(alloc(20 * kMiB, kS1), kS1);
    release(alloc(20 * kMiB, kS2), kS2);
  }
  std::uint64_t waits = 0;
  std::uint64_t barrier_waits = 0;
  for (const StreamReport& r : pool->streams()) {
    waits += r.counters.event_waits;
    barrier_waits += r.counters.barrier_waits;
  }
  CHECK(waits >= 1999);
  CHECK(barrier_waits == 0);
  CHECK(advises(*pool, "GPUPOOL_CROSS_STREAM_REUSE=completed"));
  CHECK_FALSE(advises(*pool, "cudaStreamNonBlocking"));
  CHECK_FALSE(advises(*pool, "a stream made for each task"));  // none was destroyed
}

TEST_CASE_METHOD(PoolFixture, "a stream made for each task while the device lags is told what the completed policy costs") {
  // Each task takes the last one's block after a wait for its work: the
  // tasks run one after another. The completed policy lets them overlap,
  // each holding its own memory.
  make();
  upstream.set_events_complete_at_once(false);
  for (StreamId t = 0; t < 1200; ++t) {
    task_on_new_stream(*this, kNB + t);
    if (t % 100 == 99) upstream.complete_all();  // (fewer than 1,024 keys pending)
  }
  std::uint64_t waits = 0;
  std::uint64_t destroyed_stream_waits = 0;
  for (const StreamReport& r : pool->streams()) {
    waits += r.counters.event_waits;
    destroyed_stream_waits += r.counters.destroyed_stream_waits;
  }
  CHECK(waits > 1000);
  CHECK(destroyed_stream_waits == waits);
  CHECK(advises(*pool, "a stream made for each task while the device was behind"));
  CHECK(advises(*pool, "each task still running then holding memory of its own"));  // the line's end
}

TEST_CASE_METHOD(PoolFixture, "threads that come and go reuse the blocks of those before them") {
  // Each thread makes a pair on its per-thread default stream and ends;
  // the device keeps up. Another thread's per-thread stream cannot be named:
  // nothing but a completion fence (the legacy stream's event follows its
  // work) ever shows those blocks done, and the threads must not grow the
  // pool by a block each.
  for (const bool expandable : {true, false}) {
    DYNAMIC_SECTION("expandable segments " << expandable) {
      options.expandable_segments = expandable;
      make();
      upstream.set_events_complete_at_once(false);
      for (StreamId thread = 1; thread <= 200; ++thread) {
        pair_on_thread(*this, thread, thread % 2 == 0);  // half of them end
        upstream.complete_all();
      }
      CHECK(pool->stats().reserved_bytes[kAll].peak <= static_cast<std::int64_t>(4 * kMiB));
      // The ended ones are reported as gone: 63 rows of one, a row for the rest.
      const auto [gone, gone_rows] = gone_streams(*pool);
      CHECK(gone == 100);
      CHECK(gone_rows == 64);
      check();
    }
  }
}

TEST_CASE_METHOD(PoolFixture, "blocks kept under ended threads' streams are counted in the gone rows") {
  // 100 threads each free a block whose work is still pending and end: the
  // blocks keep their streams' ids (the completed policy: none takes the one
  // before it). The first 63 are counted in their own rows, the rest in the
  // row of every later gone stream.
  options.cross_stream_reuse = CrossStreamReuse::Completed;
  make();
  upstream.set_events_complete_at_once(false);
  for (StreamId t = 1; t <= 100; ++t) pair_on_thread(*this, t, true);
  check();  // the rows add up to the cache
  std::size_t own_rows = 0;
  std::size_t later_blocks = 0;
  for (const StreamReport& r : pool->streams()) {
    if (r.alive) continue;
    if (r.id == 0) {
      later_blocks = r.cached_blocks;
    } else {
      CHECK(r.cached_blocks == 1);
      ++own_rows;
    }
  }
  CHECK(own_rows == 63);
  CHECK(later_blocks == 37);
}

TEST_CASE_METHOD(PoolFixture, "a per-thread stream used after its thread's end and ended again is one gone stream") {
  // Used from a pthread key's destructor that ran after the shim's: its
  // second end joins the row of its first. Past the 63 rows of their own,
  // both lives are in the row of later streams, which counts it once.
  auto gone_reuses = [&] {
    std::uint64_t reuses = 0;
    for (const StreamReport& r : pool->streams()) reuses += r.alive ? 0 : r.counters.same_stream_reuses;
    return reuses;
  };
  for (int threads : {1, 70}) {
    INFO(threads << " threads");
    make();
    StreamId last = 0;
    for (StreamId t = 1; t <= static_cast<StreamId>(threads); ++t) last = pair_on_thread(*this, t, true);
    const auto ended = gone_streams(*pool);
    CHECK(ended == std::pair{static_cast<std::uint64_t>(threads), std::min(threads, 64)});
    const std::uint64_t reuses = gone_reuses();
    // The last thread's stream comes back (the shim introduces it again) and
    // reuses its own block.
    pool->stream_created(last, StreamKind::PerThread);
    release(alloc(kMiB, last), last);
    pool->thread_stream_ended(last, true);
    CHECK(gone_streams(*pool) == ended);
    CHECK(gone_reuses() == reuses + 1);
    check();
  }
}

TEST_CASE_METHOD(PoolFixture, "a device reset carries the count of gone streams over") {
  make();
  auto end_threads = [&](StreamId first, int n) {
    for (StreamId t = first; t < first + static_cast<StreamId>(n); ++t) {
      const StreamId stream = (t << 4) | 0x2;
      pool->stream_created(stream, StreamKind::PerThread);
      pool->thread_stream_ended(stream);
    }
  };
  auto gone = [&] { return gone_streams(*pool); };
  end_threads(1, 100);
  CHECK(gone() == std::pair{std::uint64_t{100}, 64});
  std::unique_ptr<DevicePool> before = std::move(pool);
  make();
  pool->continue_history(*before);
  CHECK(gone() == std::pair{std::uint64_t{100}, 64});
  end_threads(101, 5);
  CHECK(gone() == std::pair{std::uint64_t{105}, 64});
}

TEST_CASE_METHOD(PoolFixture, "an ended thread's stream leaves the books, its blocks still ordered") {
  // Its state goes at once; the blocks freed on it keep its id. A stream that
  // follows the legacy stream takes them after a completion fence; one that
  // does not, only once that fence shows them done.
  const DevicePtr a = freed_on_thread_a(*this, false);
  pool->thread_stream_ended(kPtdsA);
  std::vector<StreamReport> rows = rows_of(*pool, kPtdsA);
  REQUIRE(rows.size() == 1);
  CHECK_FALSE(rows[0].alive);
  CHECK(rows[0].kind == StreamKind::PerThread);
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.clear_calls();
  const DevicePtr pending = alloc(kMiB, kNB);
  CHECK(pending != a);  // room to grow: not while its work may be pending
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);  // a completion fence
  CHECK(count(upstream.calls(), Call::Record, kPtdsA) == 0);   // which cannot name it
  upstream.complete_all();
  CHECK(alloc(kMiB, kNB) == a);  // that fence done: reused
  CHECK(rows_of(*pool, kPtdsA).size() == 1);  // looking at its block made no state for it again
  check();
}

TEST_CASE_METHOD(PoolFixture, "threads that come and go on their per-thread streams reuse one block") {
  // Each frees its block with the work still pending and ends; the next
  // one's look records a completion fence, which its stream follows.
  make();
  upstream.set_events_complete_at_once(false);
  for (StreamId t = 1; t <= 100; ++t) pair_on_thread(*this, t, true);
  CHECK(current(pool->stats().reserved_bytes) == static_cast<std::int64_t>(2 * kMiB));  // one small segment
  CHECK(pool->stats().cache_misses == 1);
  check();
}

TEST_CASE_METHOD(PoolFixture, "an ended thread's stream under pressure is ordered through the legacy stream") {
  const DevicePtr a = freed_on_thread_a(*this, true);  // no room to grow
  pool->thread_stream_ended(kPtdsA);
  upstream.clear_calls();
  CHECK(alloc(kMiB, kPtdsB) == a);
  CHECK(count(upstream.calls(), Call::Record, kPtdsA) == 0);
  // A completion fence at the first look, which the per-thread stream, a
  // blocking one, follows: no barrier, no wait.
  CHECK(count(upstream.calls(), Call::Record, kLegacy) == 1);
  CHECK(count(upstream.calls(), Call::Wait, kPtdsB) == 0);
  check();
}

TEST_CASE_METHOD(PoolFixture, "only a per-thread stream that is not capturing ends with its thread") {
  make();
  pool->stream_created(kPtdsA, StreamKind::PerThread);
  pool->stream_created(kS1, StreamKind::NonBlocking);
  pool->capture_began(kPtdsA);
  pool->thread_stream_ended(kPtdsA);
  pool->thread_stream_ended(kS1);  // not a per-thread stream: never ended so
  auto alive = [&](StreamId id) {
    for (const StreamReport& r : pool->streams()) {
      if (r.id == id) return r.alive;
    }
    return false;
  };
  CHECK(alive(kPtdsA));
  CHECK(alive(kS1));
  CHECK(pool->is_capturing(kPtdsA));
  pool->capture_ended(kPtdsA);
  pool->thread_stream_ended(kPtdsA);
  CHECK_FALSE(alive(kPtdsA));
  CHECK_FALSE(pool->capture_active());
}

TEST_CASE_METHOD(PoolFixture, "a request that may not wait takes the done part of another stream's pending block") {
  // s1's block, freed with its work pending, merged with the never-used rest
  // of its segment: that rest is had at once, with no wait and no growth.
  make_two_streams_with_pending_work();
  const DevicePtr a = alloc(kMiB, kS1);
  release(a, kS1);
  const std::int64_t reserved = pool->stats().reserved_bytes[kAll].current;
  upstream.clear_calls();
  const DevicePtr b = alloc(kMiB, kS2);
  CHECK(b == a + kMiB);  // right above a's bytes, which stay s1's until done
  CHECK(count(upstream.calls(), Call::Wait, kS2) == 0);
  CHECK(pool->stats().reserved_bytes[kAll].current == reserved);
  // a's own bytes are not: new memory, while s1's work is pending.
  CHECK(alloc(kMiB, kS2) != a);
}

TEST_CASE_METHOD(PoolFixture, "the done part of a block is only what is complete, not what a voided barrier covered") {
  // x's bytes, freed with cudaFree, are covered by a barrier still pending;
  // y's, freed after it, join them. A new non-blocking stream that could not
  // wait for that barrier voids it: x's bytes are not done for that stream.
  make();
  upstream.set_events_complete_at_once(false);
  const DevicePtr x = alloc(kMiB);
  const DevicePtr y = alloc(kMiB);
  REQUIRE(y == x + kMiB);
  release(x);
  const DevicePtr d = alloc(4 * kMiB);  // the other pool: asked for again, it needs a barrier
  release(d);
  REQUIRE(alloc(4 * kMiB) == d);
  release(y);  // merged with x: x's bytes covered, y's not
  upstream.set_failing_wait_stream(kNB);
  upstream.set_host_waits_fail(true);
  REQUIRE_FALSE(pool->stream_created(kNB, StreamKind::NonBlocking));
  upstream.set_failing_wait_stream(0);
  upstream.set_host_waits_fail(false);
  CHECK(alloc(kMiB, kNB) != x);
}

TEST_CASE_METHOD(PoolFixture, "a stream the runtime no longer knows leaves the barriers after one device wait") {
  // Destroyed through the driver, its handle given to no stream yet: every
  // call naming it fails. Kept in the barriers, it would make each fail, and
  // plain reuse grow the pool until the device is full.
  make();  // room to grow; each block a segment of its own
  pool->stream_created(kNB, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr on_nb = alloc(12 * kMiB, kNB);
  const DevicePtr plain = alloc(12 * kMiB);
  release(on_nb, kNB);
  release(plain);
  upstream.set_gone_stream(kNB);
  upstream.clear_calls();
  const std::int64_t reserved = pool->stats().reserved_bytes[kAll].current;
  auto rows_of_nb = [&](bool alive) {
    int n = 0;
    for (const StreamReport& r : pool->streams()) n += r.id == kNB && r.alive == alive ? 1 : 0;
    return n;
  };
  SECTION("plain requests") {
    for (int i = 0; i < 20; ++i) release(alloc(12 * kMiB));
    CHECK(upstream.gone_stream_calls() == 1);  // the barrier's query that found it gone
    CHECK(upstream.device_syncs() == 1);       // its work, which nothing covers now
    CHECK(pool->stats().reserved_bytes[kAll].current == reserved);
    CHECK(count(upstream.calls(), Call::Record, kLegacy) >= 1);  // barriers made again
    CHECK(rows_of_nb(false) == 1);
    CHECK(rows_of_nb(true) == 0);
    // The caller learns of it, once, for its own books.
    CHECK(pool->take_forgotten_streams() == std::vector<StreamId>{kNB});
    CHECK(pool->take_forgotten_streams().empty());
  }
  SECTION("the host cannot wait") {
    upstream.set_host_waits_fail(true);
    for (int i = 0; i < 5; ++i) alloc(12 * kMiB);  // new memory each time: no barrier until a device wait
    CHECK(upstream.gone_stream_calls() == 1);
    upstream.set_host_waits_fail(false);
    CHECK(alloc(12 * kMiB) == on_nb);  // after the device wait, from either key
    CHECK(upstream.device_syncs() == 1);
    CHECK(upstream.gone_stream_calls() == 1);
  }
  SECTION("a stream-ordered request finds it gone") {
    CHECK(alloc(12 * kMiB, kS1) != on_nb);  // never a host wait for it
    CHECK(upstream.gone_stream_calls() == 1);
    CHECK(upstream.device_syncs() == 0);
    const std::int64_t grown = pool->stats().reserved_bytes[kAll].current;
    const DevicePtr reused = alloc(12 * kMiB);  // a plain request makes the device wait
    CHECK((reused == plain || reused == on_nb));
    CHECK(pool->stats().reserved_bytes[kAll].current == grown);
    CHECK(upstream.device_syncs() == 1);
    CHECK(upstream.gone_stream_calls() == 1);
  }
  SECTION("its handle named again, by a stream made through the driver") {
    upstream.set_host_waits_fail(true);
    alloc(12 * kMiB);  // finds it gone; grows
    upstream.set_gone_stream(0);
    // The old stream's block is not the new one's: its work is still pending.
    const DevicePtr again = alloc(12 * kMiB, kNB);
    CHECK(again != on_nb);
    release(again, kNB);
    CHECK(alloc(12 * kMiB, kNB) == again);  // the new stream's own, in stream order
    CHECK(rows_of_nb(false) == 1);  // the old stream's row
    CHECK(rows_of_nb(true) == 1);   // the new one's
  }
  SECTION("found by a wait for the frees, before the books close") {
    pool->release_cached();  // a barrier finds it gone, then the host waits for the device
    pool->release_cached();  // its barrier leaves it out
    CHECK(upstream.gone_stream_calls() == 1);
    CHECK(upstream.device_syncs() == 1);
  }
  SECTION("a capture begun on its handle before the books close goes on") {
    upstream.set_host_waits_fail(true);
    pool->release_cached();  // its wait for the frees finds it gone (an allocation would close the books)
    CHECK(upstream.gone_stream_calls() == 1);
    pool->capture_began(kNB);  // a new stream behind the handle
    alloc(kMiB, kS1);  // closes the gone stream's books
    CHECK(pool->capture_active());
    pool->capture_ended(kNB);
    CHECK_FALSE(pool->capture_active());
    CHECK(pool->take_forgotten_streams().empty());  // the capturing stream is the pool's to know on
  }
  check();
}

TEST_CASE("no stream allocation holds another stream's byte before its work is done or ordered", "[random]") {
  // Streams take other streams' and plain blocks (whole, or the part whose
  // work is done) while the device lags: every such byte must have been
  // freed before the device last caught up, or before the last barrier
  // (which every stream here follows), or on a destroyed stream whose last
  // event the consumer waited for (or one that stream had waited for before
  // that event). No memory pressure: no other waits.
  const bool expandable = GENERATE(false, true);
  PoolOptions options;
  options.expandable_segments = expandable;
  VirtualUpstream upstream;
  upstream.set_virtual_memory(true);
  upstream.set_events_complete_at_once(false);
  DevicePool pool(upstream, options, 8 * kGiB);
  constexpr StreamId kStreams[] = {kAnyStream, 0x3000, 0x3001, 0x3002};
  std::map<StreamId, std::uint64_t> generation;  // a destroyed handle names a new stream
  for (StreamId s : kStreams) {
    if (s != kAnyStream) pool.stream_created(s, StreamKind::NonBlocking);
  }
  std::mt19937_64 rng(test_seed(expandable ? 21 : 22));

  struct Freed {
    std::uint64_t op;
    StreamId stream;
    std::uint64_t generation;
  };
  FreedRanges<Freed> freed;  // used bytes: by which operation, on which stream
  struct Live {
    DevicePtr ptr;
    std::size_t size;
    StreamId stream;
  };
  std::vector<Live> live;
  std::uint64_t ordered_op = 0;  // frees before this operation are done or behind a barrier
  std::uint64_t last_barriers = 0;
  // What each stream (this generation of it) has waited for: its later work
  // follows that work, on whatever bytes.
  using Followed = std::set<std::pair<StreamId, std::uint64_t>>;
  std::map<StreamId, Followed> waited_for;
  // A destroyed stream's last event (the blocks' own): the stream and
  // generation a wait on it orders after, and what that stream had waited
  // for itself (recorded after those waits, the event follows that work
  // too), until it is recorded again.
  std::map<EventHandle, Followed> last_events;
  auto read_calls = [&] {
    for (const Call& c : upstream.calls()) {
      if (c.kind == Call::Record) last_events.erase(c.event);
      if (c.kind == Call::Wait && last_events.count(c.event) != 0) {
        const Followed& followed = last_events.at(c.event);
        waited_for[c.stream].insert(followed.begin(), followed.end());
      }
    }
    upstream.clear_calls();
  };
  std::uint64_t checked_ranges = 0;
  auto device_barriers = [&] {
    for (const StreamReport& s : pool.streams()) {
      if (s.id == kAnyStream) return s.counters.fences_recorded;
    }
    return std::uint64_t{0};
  };
  for (std::uint64_t op = 1; op <= 200000; ++op) {
    const std::uint64_t dice = rng() % 1000;
    if (dice < 10) {
      upstream.complete_all();
      ordered_op = op;
    } else if (dice < 15) {
      const StreamId s = kStreams[1 + rng() % 3];
      std::erase_if(live, [&](const Live& l) {
        if (l.stream != s) return false;
        REQUIRE(pool.deallocate(l.ptr, l.stream) == FreeResult::Freed);
        freed.freed(l.ptr, l.ptr + l.size, Freed{op, s, generation[s]});
        return true;
      });
      read_calls();
      pool.stream_destroying(s);
      EventHandle last = 0;
      for (const Call& c : upstream.calls()) {
        if (c.kind == Call::Record && c.stream == s) last = c.event;
      }
      read_calls();
      if (last != 0) {
        Followed followed = waited_for[s];
        followed.insert({s, generation[s]});
        last_events[last] = followed;
      }
      waited_for.erase(s);
      ++generation[s];
      pool.stream_created(s, StreamKind::NonBlocking);
    } else if (live.empty() || (rng() % 100 < 50 && live.size() < 200)) {
      const std::size_t size = rng() % 100 < 50 ? 1 + rng() % kMiB : kMiB + rng() % (8 * kMiB);
      const StreamId stream = kStreams[rng() % 4];
      const Allocation a = pool.allocate(size, stream);
      REQUIRE(a.ok);
      read_calls();
      if (device_barriers() != last_barriers) ordered_op = op;  // (recorded for this request, before it took)
      last_barriers = device_barriers();
      freed.reused(a.ptr, a.ptr + size, [&](DevicePtr start, const Freed& r) {
        if (stream == kAnyStream) return;  // plain requests: the plain random test's
        if (r.stream == stream && r.generation == generation[stream]) return;  // stream order
        INFO("operation " << op << ": bytes at " << start << " freed on " << r.stream << " at operation " << r.op
                          << ", ordered up to operation " << ordered_op);
        REQUIRE((r.op < ordered_op || waited_for[stream].count({r.stream, r.generation}) != 0));
        ++checked_ranges;
      });
      live.push_back(Live{a.ptr, size, stream});
    } else {
      const Live l = take_any(live, rng);
      REQUIRE(pool.deallocate(l.ptr, l.stream) == FreeResult::Freed);
      freed.freed(l.ptr, l.ptr + l.size, Freed{op, l.stream, generation[l.stream]});
    }
    if (op % 997 == 0) {
      std::string why;
      const bool ok = pool.validate(&why);
      INFO(why);
      REQUIRE(ok);
    }
  }
  CHECK(checked_ranges > 10000);  // the check saw plenty of cross-stream reuse
}
