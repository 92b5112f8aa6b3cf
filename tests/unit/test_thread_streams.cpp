// Per-thread default streams: other threads' streams ordered through the
// legacy stream, and threads that come and go.
#include <algorithm>
#include <utility>

#include "pool_fixture.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;

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
