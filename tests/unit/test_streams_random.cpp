// Random stream work against an oracle of which bytes each stream may touch.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "pool_fixture.hpp"
#include "random_ops.hpp"
#include "streams_fixture.hpp"

using namespace gpupool;
using namespace gpupool::testing::stream_tests;
using gpupool::testing::PoolFixture;
using gpupool::testing::FreedRanges;
using gpupool::testing::take_any;
using gpupool::testing::test_seed;

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
