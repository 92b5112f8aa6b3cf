// A host allocation failing partway through a pool operation (std::bad_alloc,
// the host out of memory). The shim then steps aside, but a call already in
// flight may still use the pool: it must find it valid, with no block out of
// every list (a later merge would take it for a listed free block) and no
// event held in two places (it could be recorded for two fences at once).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <new>

#include <string>
#include <utility>
#include <vector>

#include "pool/device_pool.hpp"
#include "pool/ordering.hpp"
#include "pool/virtual_upstream.hpp"
#include "tests/stream_rows.hpp"

namespace {
// When positive, the allocation that brings it to 0 throws (this thread's).
thread_local long g_allocations_until_failure = 0;
}  // namespace

// ASan keeps operator new for itself (it checks that delete matches).
#ifndef __SANITIZE_ADDRESS__
#define GPUPOOL_FAILING_NEW 1
// For the whole test binary; counts only while a test arms it.
void* operator new(std::size_t bytes) {
  if (g_allocations_until_failure > 0 && --g_allocations_until_failure == 0) throw std::bad_alloc();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace gpupool {
namespace {

constexpr StreamId kFirst = 0x1000, kSecond = 0x2000;

// Fences on streams and barriers pending, handles reused with fences pending,
// a stream destroyed with fences pending, events recycled.
void run_streams(StreamOrdering& ordering, VirtualUpstream& upstream) {
  ordering.stream_created(kFirst, StreamKind::NonBlocking);
  ordering.stream_created(kSecond, StreamKind::NonBlocking);
  for (int round = 0; round < 3; ++round) {
    for (int fence = 0; fence < 2; ++fence) {  // two fences pending on each stream
      const StreamOrdering::FreeStamp on_first = ordering.stamp_free(kFirst);
      ordering.stream_ready(kFirst, on_first.stream_epoch, on_first.device_epoch, kSecond, true);
      const StreamOrdering::FreeStamp on_second = ordering.stamp_free(kSecond);
      ordering.stream_ready(kSecond, on_second.stream_epoch, on_second.device_epoch, kFirst, true);
    }
    ordering.device_ready(ordering.stamp_free(kAnyStream).device_epoch);  // a barrier
    ordering.stamp_free(kFirst);
    ordering.fence_frees();  // a completion fence: an event on every stream
    if (round == 1) ordering.stream_created(kFirst, StreamKind::NonBlocking);  // the handle again
    if (round == 2) {
      ordering.stream_destroying(kSecond);
      ordering.stream_created(kSecond, StreamKind::NonBlocking);
    }
    if (round != 1) upstream.complete_all();
    ordering.poll();
  }
}

// Destroys `stream` with the n-th host allocation failing; false when the
// destroy made fewer (it then ran whole).
bool destroy_failing_at(DevicePool& pool, StreamId stream, long n) {
  g_allocations_until_failure = n;
  try {
    pool.stream_destroying(stream);
  } catch (const std::bad_alloc&) {
  }
  const bool failed = g_allocations_until_failure == 0;
  g_allocations_until_failure = 0;
  return failed;
}

using Live = std::vector<std::pair<DevicePtr, StreamId>>;

// Plain and stream-ordered blocks of both pools: new segments, splits,
// merges, reuse across streams, a destroyed stream, the cache given back
// (pages unmapped, with expandable segments), everything freed.
void run_pool(DevicePool& pool, VirtualUpstream& upstream, Live& live) {
  pool.stream_created(kFirst, StreamKind::NonBlocking);
  pool.stream_created(kSecond, StreamKind::NonBlocking);
  const std::size_t sizes[] = {512, 3000, 1 << 20, 3 << 20, 12 << 20, 700, 5 << 20};
  const StreamId streams[] = {kAnyStream, kFirst, kSecond};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 7; ++i) {
      const StreamId s = streams[(i + round) % 3];
      const Allocation a = pool.allocate(sizes[i] + static_cast<std::size_t>(round) * 512, s);
      if (a.ok) live.emplace_back(a.ptr, s);
    }
    for (std::size_t i = 0; i < live.size(); i += 2) {
      pool.deallocate(live[i].first, streams[(i + 1) % 3]);  // some on another stream
      live[i].first = 0;
    }
    if (round == 1) {
      pool.stream_destroying(kSecond);
      pool.stream_created(kSecond, StreamKind::NonBlocking);
    }
    if (round == 2) pool.release_cached();
    upstream.complete_all();
  }
  // Past the pool's first chunk of block nodes: a later split takes a new one.
  for (int i = 0; i < 300; ++i) {
    const Allocation a = pool.allocate(512, kFirst);
    if (a.ok) live.emplace_back(a.ptr, kFirst);
  }
  for (auto& [ptr, stream] : live) {
    if (ptr != 0) pool.deallocate(ptr, stream);
    ptr = 0;
  }
}

}  // namespace

TEST_CASE("a host allocation failing anywhere in a pool operation leaves the pool valid") {
#ifndef GPUPOOL_FAILING_NEW
  WARN("skipped under ASan");
  return;
#endif
  for (const bool expandable : {true, false}) {
    long failures = 0;
    for (long n = 1;; ++n) {
      VirtualUpstream upstream;
      PoolOptions options;
      options.expandable_segments = expandable;
      DevicePool pool(upstream, options, 80 * kGiB);
      upstream.set_events_complete_at_once(false);
      Live live;
      live.reserve(400);  // the test's own list allocates nothing while armed
      g_allocations_until_failure = n;
      try {
        run_pool(pool, upstream, live);
      } catch (const std::bad_alloc&) {
      }
      const bool failed = g_allocations_until_failure == 0;
      g_allocations_until_failure = 0;
      INFO("expandable " << expandable << ", failing at allocation " << n);
      std::string why;
      const bool valid = pool.validate(&why);
      INFO(why);
      REQUIRE(valid);
      REQUIRE(testing::stream_rows_cover_cache(pool));  // a destroy cut short: blocks under a gone stream
      if (!failed) break;
      ++failures;
      // A call in flight goes on with what the failure left.
      Live more;
      more.reserve(400);
      run_pool(pool, upstream, more);
      const bool still_valid = pool.validate(&why);
      INFO(why);
      REQUIRE(still_valid);
    }
    CHECK(failures >= 40);
  }
}

TEST_CASE("a destroyed stream's blocks left under its key are not taken as an ended thread's") {
#ifndef GPUPOOL_FAILING_NEW
  WARN("skipped under ASan");
  return;
#endif
  // An ended thread's per-thread stream leaves blocks under a key the books
  // no longer know, whose work the legacy stream follows. A destroy cut short
  // leaves a non-blocking stream's blocks so too: its work the legacy stream
  // does not follow, so a completion fence from after the free orders nothing
  // (here the destroy could neither fence that work nor wait for it, so no
  // later barrier may claim to cover it either).
  constexpr StreamId kPerThread = 0x12;
  long left_keyed = 0;
  for (long n = 1;; ++n) {
    VirtualUpstream upstream;
    PoolOptions options;
    DevicePool pool(upstream, options, 80 * kGiB);
    upstream.set_events_complete_at_once(false);
    pool.stream_created(kFirst, StreamKind::NonBlocking);
    pool.stream_created(kPerThread, StreamKind::PerThread);
    const DevicePtr freed = pool.allocate(kMiB, kFirst).ptr;
    REQUIRE(pool.deallocate(freed, kFirst) == FreeResult::Freed);
    // A plain request's look at it records a completion fence; that request
    // and the next take a new segment whole: the freed block is the only one.
    for (int i = 0; i < 2; ++i) REQUIRE(pool.allocate(kMiB, kAnyStream).ptr != freed);
    upstream.set_failing_record_stream(kFirst);
    upstream.set_host_waits_fail(true);
    if (!destroy_failing_at(pool, kFirst, n)) break;
    bool keyed = false;
    for (const StreamReport& r : pool.streams()) keyed |= !r.alive && r.id == kFirst && r.cached_blocks > 0;
    if (!keyed) continue;
    ++left_keyed;
    INFO("failing at allocation " << n);
    CHECK(pool.allocate(kMiB, kPerThread).ptr != freed);  // room to grow: not while its work may be pending
  }
  CHECK(left_keyed > 0);
}

TEST_CASE("a destroy with no host memory for its key waits for the stream's last event on the host") {
#ifndef GPUPOOL_FAILING_NEW
  WARN("skipped under ASan");
  return;
#endif
  // Destroyed streams' events stay pending (the device never catches up),
  // each under its key; one more key needs a new chunk of the list at some
  // count. Where that fails, nothing could wait for the last destroy's
  // event: the host waits for it, and a stream that takes the block after
  // follows that work. Where that host wait fails too, nothing covers the
  // work: no stream takes the block without a wait for it or for the device
  // (none has room to grow here).
  std::vector<std::pair<int, long>> waited_on_host;  // (destroys before, failing allocation)
  long refused_runs = 0;  // the same failures with host waits failing too
  constexpr std::size_t kBlock = 2 * kMiB;
  for (const bool host_waits_fail : {false, true}) {
    for (int earlier = 18; earlier <= 24; ++earlier) {
      for (long n = 1;; ++n) {
        VirtualUpstream upstream;
        PoolOptions options;
        options.large_segment_size = kBlock;  // a segment a block: kLast's is the only free memory
        DevicePool pool(upstream, options, 80 * kGiB);
        upstream.set_events_complete_at_once(false);
        for (StreamId s = kFirst; s < kFirst + static_cast<StreamId>(earlier); ++s) {
          pool.stream_created(s, StreamKind::NonBlocking);
          REQUIRE(pool.allocate(kBlock, s).ok);  // kept
          pool.stream_destroying(s);
        }
        constexpr StreamId kLast = 0x9000, kNext = 0x9001;
        pool.stream_created(kLast, StreamKind::NonBlocking);
        const DevicePtr last = pool.allocate(kBlock, kLast).ptr;
        REQUIRE(pool.deallocate(last, kLast) == FreeResult::Freed);
        upstream.clear_calls();
        upstream.set_host_waits_fail(host_waits_fail);
        const bool failed = destroy_failing_at(pool, kLast, n);
        INFO(earlier << " destroyed before, failing at allocation " << n << ", host waits fail " << host_waits_fail);
        REQUIRE(pool.validate());
        if (!failed) break;
        EventHandle own = 0;  // the destroy's event on kLast
        bool synced = false;
        for (const auto& c : upstream.calls()) {
          if (c.kind == VirtualUpstream::Call::Record && c.stream == kLast) own = c.event;
          synced |= c.kind == VirtualUpstream::Call::SyncEvent && c.event == own && own != 0;
        }
        if (synced) waited_on_host.emplace_back(earlier, n);
        // A run whose key was refused in the first pass, again with host waits failing.
        const bool key_refused = std::find(waited_on_host.begin(), waited_on_host.end(), std::make_pair(earlier, n)) !=
                                 waited_on_host.end();
        const auto& refused = upstream.refused_event_syncs();
        const bool wait_tried = own != 0 && std::find(refused.begin(), refused.end(), own) != refused.end();
        // The same host wait, tried and refused (only the second pass refuses any).
        CHECK(wait_tried == (host_waits_fail && key_refused));
        pool.stream_created(kNext, StreamKind::NonBlocking);
        upstream.set_capacity(upstream.in_use());  // no room to grow: the block, or nothing
        upstream.clear_calls();
        const bool taken = pool.allocate(kBlock, kNext).ptr == last;
        if (host_waits_fail && key_refused) ++refused_runs;
        if (!taken || own == 0) continue;
        bool waited = synced;  // the block: after its work, on the host or on the device
        for (const auto& c : upstream.calls()) {
          waited |= (c.kind == VirtualUpstream::Call::Wait && c.event == own) ||
                    c.kind == VirtualUpstream::Call::SyncDevice;
        }
        CHECK(waited);
      }
    }
  }
  CHECK_FALSE(waited_on_host.empty());
  CHECK(refused_runs == static_cast<long>(waited_on_host.size()));
}

TEST_CASE("a host allocation failing anywhere in the stream ordering leaves no event held twice") {
#ifndef GPUPOOL_FAILING_NEW
  WARN("skipped under ASan");
  return;
#endif
  long failures = 0;
  for (long n = 1;; ++n) {
    VirtualUpstream upstream;
    PoolOptions options;
    StreamOrdering ordering(upstream, options);
    upstream.set_events_complete_at_once(false);
    g_allocations_until_failure = n;
    try {
      run_streams(ordering, upstream);
    } catch (const std::bad_alloc&) {
      // (Some failures are absorbed inside: a spare event is dropped.)
    }
    const bool failed = g_allocations_until_failure == 0;
    g_allocations_until_failure = 0;
    INFO("failing at allocation " << n);
    REQUIRE(ordering.events_held_once());
    if (!failed) break;  // past the last allocation the run makes
    ++failures;
    // A call in flight goes on with what the failure left.
    run_streams(ordering, upstream);
    REQUIRE(ordering.events_held_once());
  }
  CHECK(failures >= 40);
}

}  // namespace gpupool
