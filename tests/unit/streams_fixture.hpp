// What the stream tests share: stream ids, the calls counted, and set-ups
// several files use.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "pool_fixture.hpp"

namespace gpupool::testing::stream_tests {

using Call = VirtualUpstream::Call;

inline constexpr StreamId kS1 = 0x1000;  // blocking (both as make_two_streams_with_pending_work makes them)
inline constexpr StreamId kS2 = 0x2000;  // blocking
inline constexpr StreamId kNB = 0x3000;  // non-blocking
inline constexpr StreamId kLegacy = VirtualUpstream::kLegacy;
// A quarter of its 2 MiB small segment: freed and asked for again, a plain
// request of it goes back to its place after a barrier, since the segment has
// no room for the 8 more that a loop of one size sweeps through instead
// (plain_reuse.cpp). The tests of the barrier's calls make theirs so.
inline constexpr std::size_t kTakesBarrier = 512 * kKiB;

// n non-blocking streams kNB, kNB + 1, ...: PyTorch's stream pool.
inline void add_non_blocking_streams(DevicePool& pool, int n) {
  for (int i = 0; i < n; ++i) pool.stream_created(kNB + i, StreamKind::NonBlocking);
}

inline int count(const std::vector<Call>& calls, Call::Kind kind, StreamId stream) {
  int n = 0;
  for (const Call& c : calls) n += (c.kind == kind && c.stream == stream) ? 1 : 0;
  return n;
}

inline constexpr StreamId kPtdsA = 0x12;  // two threads' per-thread default streams
inline constexpr StreamId kPtdsB = 0x22;

// Thread A frees a 1 MiB block on its per-thread stream, its work pending;
// thread B's stream is known too. With `only_room` the device holds 2 MiB and
// the rest of the block's segment is taken first: the freed block is then
// the only room.
inline DevicePtr freed_on_thread_a(PoolFixture& f, bool only_room) {
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
inline StreamId pair_on_thread(PoolFixture& f, StreamId t, bool end) {
  const StreamId stream = (t << 4) | 0x2;
  f.pool->stream_created(stream, StreamKind::PerThread);
  f.release(f.alloc(kMiB, stream), stream);
  if (end) f.pool->thread_stream_ended(stream);
  return stream;
}

// Blocking streams kS1 and kS2 on a 2 MiB device; kS1 frees a 1 MiB block
// whose work is pending, and the rest of the device is taken (*rest, a plain
// block): that block is the only room. Returns it.
inline DevicePtr only_room_freed_on_s1(PoolFixture& f, DevicePtr* rest) {
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
inline std::vector<StreamReport> rows_of(const DevicePool& pool, StreamId id) {
  std::vector<StreamReport> rows;
  for (const StreamReport& r : pool.streams()) {
    if (r.id == id) rows.push_back(r);
  }
  return rows;
}

// The gone streams the pool reports, and the rows they take.
// Streams the pool's rows say were destroyed where it could not see it.
inline std::uint64_t destroyed_unseen(const DevicePool& pool) {
  std::uint64_t n = 0;
  for (const StreamReport& r : pool.streams()) n += r.counters.destroyed_unseen;
  return n;
}

inline std::pair<std::uint64_t, int> gone_streams(const DevicePool& pool) {
  std::uint64_t streams = 0;
  int rows = 0;
  for (const StreamReport& r : pool.streams()) {
    if (r.alive) continue;
    streams += r.streams;
    ++rows;
  }
  return {streams, rows};
}

// A stream made for each task: a 1 MiB pair on it, then destroyed, its work
// still pending. Returns the pair's address.
inline DevicePtr task_on_new_stream(PoolFixture& f, StreamId s, StreamKind kind = StreamKind::NonBlocking) {
  f.pool->stream_created(s, kind);
  const DevicePtr a = f.alloc(kMiB, s);
  f.release(a, s);
  f.pool->stream_destroying(s);
  return a;
}

}  // namespace gpupool::testing::stream_tests
