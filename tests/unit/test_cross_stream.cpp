// Blocks freed on one stream and taken by another: the three policies,
// neighbours freed on two streams, captures, a barrier's cover, streams made
// for each task, and the advice the report gives on them.
#include <algorithm>

#include "pool_fixture.hpp"
#include "report/collect.hpp"
#include "report/diagnosis.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;

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
