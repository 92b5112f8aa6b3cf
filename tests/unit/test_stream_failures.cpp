// Streams whose destroy the runtime refuses, destroyed work nothing covers,
// fences whose queries fail, and streams the runtime no longer knows.
#include <utility>

#include "pool_fixture.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;

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
    CHECK(destroyed_unseen(*pool) == 0);
    pool->stream_created(kNB, StreamKind::NonBlocking);
    CHECK(gone_streams(*pool) == std::pair<std::uint64_t, int>{1, 1});  // the old stream's row
    CHECK(destroyed_unseen(*pool) == 1);
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
    CHECK(destroyed_unseen(*pool) == 1);
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
    CHECK(destroyed_unseen(*pool) == 1);  // found gone, then its handle given again: one stream
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
