// Destroyed streams: their blocks' keys, own events and fences, and the
// streams made after them that take their blocks.
#include <set>

#include "pool_fixture.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;

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
