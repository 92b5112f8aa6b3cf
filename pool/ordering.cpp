// The fences and barriers that order reuse between streams, and when a freed
// block is ready for its next user (the protocol: ordering.hpp). The books of
// the streams themselves are in stream_books.cpp.
#include "pool/ordering.hpp"

#include <algorithm>
#include <new>

namespace gpupool {

namespace {
// A non-blocking stream found busy is asked again after this many barriers.
constexpr std::uint8_t kBusyCheckInterval = 8;
// From this many non-blocking streams on, a barrier first looks whether the
// device has caught up (see record_barrier).
constexpr std::size_t kCaughtUpCheckStreams = 4;
}  // namespace

StreamOrdering::StreamOrdering(Upstream& upstream, const PoolOptions& options)
    : upstream_(upstream), options_(options) {
  device_.id = kAnyStream;
  device_.kind = StreamKind::Legacy;
  destroyed_.reserve(kDestroyedStreamsReported);  // so that report_gone never allocates
}

StreamOrdering::FreeStamp StreamOrdering::stamp_free(StreamId site) {
  unfenced_frees_ = true;
  FreeStamp stamp{0, device_.free_epoch};
  if (site != kAnyStream) stamp.stream_epoch = stream(site).free_epoch;
  return stamp;
}

EventHandle StreamOrdering::take_event() {
  if (!spare_events_.empty()) {
    const EventHandle e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return upstream_.create_event();
}

void StreamOrdering::give_back_event(EventHandle event) {
  // Out of host memory, the event is dropped (leaked): the callers go on to
  // forget where they held it, and must not be cut short in between.
  try {
    spare_events_.push_back(event);
  } catch (const std::bad_alloc&) {
  }
}

void StreamOrdering::refill_spare_events() {
  if (!spare_events_.empty()) return;
  // A plain loop of cudaMalloc/cudaFree records a barrier per reuse, and
  // querying the last one before recording the next would double its driver
  // calls. Every device fence has an event on the legacy stream and the
  // newest completes after all older ones, so the oldest, if it is just that
  // one event, may be recorded again unqueried: its epoch is learned complete
  // when a newer fence's is. Not the latest barrier's: a non-blocking stream
  // created later waits on it. Otherwise completed events are collected.
  if (device_.pending.size() >= 2) {
    const Fence& oldest = device_.pending.front();
    if (oldest.more.empty() && oldest.event != last_barrier_.event) {
      spare_events_.push_back(oldest.event);
      device_.pending.pop_front();
      return;
    }
  }
  // Only the latest barrier pending (a device that keeps up, whose fences are
  // seen complete and recycled at every turn): one more event instead of a
  // query, so that from the next barrier on the older one is taken unqueried.
  if (device_.pending.size() == 1 && device_.pending.front().event == last_barrier_.event) {
    const EventHandle fresh = upstream_.create_event();
    if (fresh != 0) {
      spare_events_.push_back(fresh);
      return;
    }
  }
  poll();  // (also when no event can be made: a completed one may be recycled)
}

bool StreamOrdering::seen_idle(StreamState& s) {
  if (s.idle_checks_skipped > 0) {
    --s.idle_checks_skipped;
    return false;
  }
  if (!addressable(s) || !usable(s)) {
    s.idle_checks_skipped = kBusyCheckInterval - 1;
    return false;
  }
  ++s.counters.idle_queries;
  if (query(s) != EventStatus::Complete) {
    s.idle_checks_skipped = kBusyCheckInterval - 1;
    return false;
  }
  return true;
}

bool StreamOrdering::record_fence(StreamState& s) {
  const EventHandle event = take_event();
  if (event == 0) return false;
  if (!record_on(s, event)) {
    give_back_event(event);
    return false;
  }
  s.pending.push_back(Fence{s.free_epoch, event, {}});
  s.fenced_epoch = s.free_epoch++;
  ++s.counters.fences_recorded;
  return true;
}

bool StreamOrdering::record_on(StreamState& s, EventHandle event) {
  if (upstream_.record_event(event, s.id)) return true;
  if (upstream_.failed_for_gone_stream()) found_gone(s);
  return false;
}

bool StreamOrdering::wait_on(StreamState& s, EventHandle event) {
  if (upstream_.wait_event(s.id, event)) return true;
  if (upstream_.failed_for_gone_stream()) found_gone(s);
  return false;
}

EventStatus StreamOrdering::query(StreamState& s) {
  const EventStatus status = upstream_.query_stream(s.id);
  if (status == EventStatus::Error && upstream_.failed_for_gone_stream()) found_gone(s);
  return status;
}

bool StreamOrdering::record_barrier() {
  if (capture_active()) return false;
  // Destroyed streams' events are dropped as soon as complete (the barrier
  // waits for each one still pending).
  if (!retired_streams_.empty()) poll();
  if (destroyed_work_unordered_) return false;
  refill_spare_events();  // one is enough: the non-blocking streams' are given back at once
  const StreamId legacy = upstream_.legacy_stream();
  // 0. With many non-blocking streams, each costs a wait per barrier (step 3).
  //    The legacy stream's event goes first then: if it has completed by the
  //    time every non-blocking stream is found idle, all work queued before
  //    the frees is done, and there is nothing to order (a query more when
  //    the device lags, instead of a wait per stream when it has caught up).
  //    Not while a stream is taken as busy without asking (see seen_idle).
  const bool one_taken_as_busy = std::any_of(streams_.begin(), streams_.end(), [](const auto& entry) {
    const auto& s = entry.second;
    return s.kind == StreamKind::NonBlocking && !s.gone && s.idle_checks_skipped > 0;
  });
  EventHandle early = 0;
  if (!one_taken_as_busy && retired_streams_.empty() &&
      non_blocking_streams() >= kCaughtUpCheckStreams) {
    early = take_event();
    if (early == 0) return false;
    if (!upstream_.record_event(early, legacy)) {
      give_back_event(early);
      return false;
    }
  }
  auto fail = [&] {
    if (early != 0) give_back_event(early);
    return false;
  };
  bool any_busy = false;
  // 1. The legacy stream waits for every stream it does not order implicitly,
  //    unless that stream has nothing left to wait for. PyTorch creates 32
  //    non-blocking streams per priority level the first time a program asks
  //    for a side stream, and most of them never run anything: one query
  //    each, instead of a record and a wait that the device executes. (One
  //    still waiting for the last barrier is busy: this pays off only where
  //    the device has caught up with the barriers.)
  for (auto& [id, s] : streams_) {
    if (s.kind != StreamKind::NonBlocking || s.gone || seen_idle(s)) continue;
    if (s.gone) return fail();  // found so by its query: its work waits for the device wait
    any_busy = true;
    const EventHandle event = take_event();
    if (event == 0) return fail();
    const bool ok = record_on(s, event) && upstream_.wait_event(legacy, event);
    give_back_event(event);  // the wait captured it; it may be recorded again
    if (!ok) return fail();
    ++s.counters.fences_recorded;
  }
  for (const RetiredStream& r : retired_streams_) {
    // (One whose query failed has set destroyed_work_unordered_: no barrier.)
    if (!r.done && r.event != 0 && !upstream_.wait_event(legacy, r.event)) return fail();
  }
  if (early != 0 && !any_busy && upstream_.query_event(early) == EventStatus::Complete) {
    give_back_event(early);
    device_.fenced_epoch = device_.completed_epoch = device_.free_epoch++;
    unfenced_frees_ = false;
    ++device_.counters.fences_recorded;  // a barrier all the same
    ++device_.counters.caught_up_barriers;
    return true;
  }
  // 2. The legacy action itself: after all blocking streams' earlier work, and
  //    before their later work (step 0's, unless the legacy stream has had to
  //    wait for a busy stream since).
  EventHandle barrier = any_busy ? 0 : early;
  if (barrier == 0) {
    if (early != 0) give_back_event(early);
    barrier = take_event();
    if (barrier == 0) return false;
    if (!upstream_.record_event(barrier, legacy)) {
      give_back_event(barrier);
      return false;
    }
  }
  // 3. Non-blocking streams' later work waits for it too.
  for (auto& [id, s] : streams_) {
    if (s.kind != StreamKind::NonBlocking || s.gone) continue;  // a gone stream gets no later work
    if (!wait_on(s, barrier)) {
      // That stream is unordered: the barrier does not count. Its event is
      // recycled once complete.
      to_recycle_.push_back(barrier);
      return false;
    }
    ++s.counters.barrier_waits;
  }
  device_.pending.push_back(Fence{device_.free_epoch, barrier, {}});
  last_barrier_ = device_.pending.back();
  device_.fenced_epoch = device_.free_epoch++;
  unfenced_frees_ = false;
  ++device_.counters.fences_recorded;
  return true;
}

void StreamOrdering::poll(StreamState& s) {
  while (!s.pending.empty()) {
    Fence& f = s.pending.front();
    if (f.retired_mark != 0 && !retired_done_before(f.retired_mark)) break;
    EventStatus status = upstream_.query_event(f.event);
    // A completion fence completes when every one of its events has.
    while (status == EventStatus::Complete && !f.more.empty()) {
      status = upstream_.query_event(f.more.back());
      if (status == EventStatus::Pending) break;
      give_back_event(f.more.back());
      f.more.pop_back();
    }
    if (status == EventStatus::Pending) break;
    // An errored event is treated as complete only for recycling; the epoch is
    // not advanced, so its blocks keep needing ordering. Not the latest
    // barrier's, though: a non-blocking stream made later still waits on it
    // (stream_created), and recorded again it would stand for other work. It
    // is dropped (leaked) instead; errors come from a broken device.
    if (status == EventStatus::Complete && f.epoch > s.completed_epoch) s.completed_epoch = f.epoch;
    if (status == EventStatus::Complete || f.event != last_barrier_.event) give_back_event(f.event);
    for (EventHandle e : f.more) give_back_event(e);
    s.pending.pop_front();
  }
}

bool StreamOrdering::record_completion_fence() {
  // Work of destroyed streams still in flight: the fence completes once
  // their keys' events have too (a stream made for each task, beside one
  // kept fed: a barrier would make the next task's stream wait behind it).
  // Where a call failed, that work no event covers: no fence or barrier may
  // claim to until the host has waited for the whole device (rare).
  poll();
  if (destroyed_work_unordered_) return false;
  const StreamId legacy = upstream_.legacy_stream();
  Fence fence{device_.free_epoch, 0, {}, retired_streams_.empty() ? 0 : next_retired_key_};
  auto record_on_stream = [&](StreamState* s) {  // null: the legacy stream
    const EventHandle e = take_event();
    if (e == 0) return false;
    if (!(s == nullptr ? upstream_.record_event(e, legacy) : record_on(*s, e))) {
      give_back_event(e);
      return false;
    }
    if (fence.event == 0) {
      fence.event = e;
    } else {
      fence.more.push_back(e);
    }
    return true;
  };
  // The legacy stream's event completes after all earlier work of blocking
  // streams; each non-blocking stream needs its own. (Skipping idle ones, as
  // barriers do, made such fences complete sooner, and plain requests took
  // more of other streams' blocks: the demo's peak went from 260 to 262-268 MiB.)
  bool ok = record_on_stream(nullptr);
  for (auto& [id, s] : streams_) {
    if (ok && s.kind == StreamKind::NonBlocking && s.captures == 0 && !s.gone) ok = record_on_stream(&s);
  }
  if (!ok) {
    if (fence.event != 0) to_recycle_.push_back(fence.event);
    for (EventHandle e : fence.more) to_recycle_.push_back(e);
    return false;
  }
  // Ordered only for streams that follow the legacy stream (for a stream's
  // own frees: its legacy event need not follow destroyed streams' work).
  legacy_fenced_epoch_ = fence.epoch;
  device_.pending.push_back(std::move(fence));
  ++device_.free_epoch;  // later frees are not covered; fenced_epoch stays (non-blocking streams are not ordered)
  unfenced_frees_ = false;
  return true;
}

void StreamOrdering::poll() {
  poll(device_);
  for (auto& [id, s] : streams_) poll(s);
  // Of the events nothing waits for, an error tells nothing: each goes back
  // once no longer pending. (A destroyed stream's own event that errs leaves
  // its work uncovered: see ask_retired.)
  give_back_done(to_recycle_);
  for (RetiredStream& r : retired_streams_) ask_retired(r);
  drop_done_retired();
}

void StreamOrdering::give_back_done(std::vector<EventHandle>& events) {
  std::size_t kept = 0;
  for (EventHandle event : events) {
    if (upstream_.query_event(event) == EventStatus::Pending) {
      events[kept++] = event;
    } else {
      give_back_event(event);
    }
  }
  events.resize(kept);
}

bool StreamOrdering::device_complete(std::uint64_t device_epoch) {
  if (device_epoch <= device_.completed_epoch) return true;
  poll(device_);
  return device_epoch <= device_.completed_epoch;
}

bool StreamOrdering::known_complete(StreamId stream, std::uint64_t stream_epoch, std::uint64_t device_epoch) {
  if (device_epoch == 0 || device_epoch <= device_.completed_epoch) return true;
  if (stream == kAnyStream) return false;
  if (is_retired_key(stream)) return retired_done(stream, false);
  auto it = streams_.find(stream);
  return it != streams_.end() && stream_epoch <= it->second.completed_epoch;
}

bool StreamOrdering::device_ready_slow(std::uint64_t device_epoch) {
  if (options_.unsafe_skip_ordering) return true;
  if (device_epoch <= device_.fenced_epoch) {
    // A barrier recorded after the free orders every live stream; during a
    // capture we cannot rely on what a capturing stream will do, so require
    // completion then.
    return !capture_active() || device_complete(device_epoch);
  }
  if (capture_active()) return false;
  return record_barrier();
}

bool StreamOrdering::wait_out_unordered_work() {
  return destroyed_work_unordered_ && unsafe_calls_allowed() && synchronize_device();
}

bool StreamOrdering::stream_ready(StreamId from, std::uint64_t stream_epoch,
                                  std::uint64_t device_epoch, StreamId to, bool may_wait) {
  if (options_.unsafe_skip_ordering) return true;
  const bool auto_policy = options_.cross_stream_reuse == CrossStreamReuse::Auto;
  if (auto_covered(device_epoch)) return true;
  // Through the device alone: for another thread's per-thread default stream
  // (or an ended thread's, whose state is gone), where nothing can be
  // recorded on it or asked of it from here, and for a stream found gone.
  // Its frees are seen done through completion fences (the legacy stream's
  // event comes after its work), and a look at one of its blocks starts one
  // for the frees since the last: its thread may have ended, and threads
  // that come and go would otherwise each find the blocks of the one before
  // still pending, and grow the pool.
  StreamState* const known_src = known(from);
  // A per-thread stream is a blocking one: a legacy-stream action queued
  // after the free follows its work (the first event of a completion fence
  // is one), and the later work of a consumer that follows the legacy stream
  // follows that action. Such a consumer takes the block at once, with no
  // wait: its work already depends on the fence, reused or not (so threads
  // that come and go, each on its own per-thread stream, do not grow the
  // pool while the device is still behind). A stream found gone may have
  // been a non-blocking one; so may a destroyed stream's key left behind.
  const bool from_follows_legacy =
      known_src == nullptr ? !destroyed_keys_left_ : known_src->kind == StreamKind::PerThread && !known_src->gone;
  auto legacy_ordered = [&] {
    if (!from_follows_legacy || !auto_policy || capture_active()) return false;
    if (device_epoch > legacy_fenced_epoch_) return false;
    return follows_legacy(stream(to));
  };
  auto through_device = [&] {
    fence_frees();  // a completion fence (none while a destroyed stream's work is uncovered)
    if (complete_or_covered(device_epoch) || legacy_ordered()) return true;
    return may_wait && usable(stream(to)) && device_ready(device_epoch);
  };
  if (known_src == nullptr || !addressable(*known_src) || known_src->gone) return through_device();
  StreamState& src = *known_src;
  if (stream_epoch <= src.completed_epoch) return true;
  poll(src);
  if (stream_epoch <= src.completed_epoch) return true;
  if (device_complete(device_epoch)) return true;
  // An idle stream has finished everything queued before the free: no fence,
  // no wait. Its frees so far close an epoch, as if fenced and completed.
  if (usable(src)) {
    if (query(src) == EventStatus::Complete) {
      src.fenced_epoch = src.completed_epoch = src.free_epoch++;
      return true;
    }
    if (src.gone) return through_device();
  }

  if (!may_wait) {
    // Start a fence now so that a later request can find it complete.
    if (stream_epoch > src.fenced_epoch && usable(src)) record_fence(src);
    return false;
  }
  StreamState& dst = stream(to);
  if (!usable(dst)) return false;
  // Cannot record on the freeing stream while it captures: the device
  // barrier orders it instead.
  if (!usable(src)) return device_ready(device_epoch);
  // Fenced and still pending: wait for the newest fence (it covers older ones).
  if ((stream_epoch > src.fenced_epoch || src.pending.empty()) && !record_fence(src)) return false;
  if (!wait_on(dst, src.pending.back().event)) return false;
  ++dst.counters.event_waits;
  return true;
}

bool StreamOrdering::wait_for_frees() {
  if (options_.unsafe_skip_ordering) return true;
  if (capture_active()) return false;
  // No barrier to wait for (an event could not be made or recorded): the
  // whole device, then. Before an out-of-memory, a longer wait beats failing.
  if (!record_barrier()) return synchronize_device();
  if (device_.completed_epoch >= device_.fenced_epoch) return true;  // it found the device caught up
  const Fence newest = device_.pending.back();  // the barrier just recorded
  if (!upstream_.synchronize_event(newest.event)) return false;
  ++device_.counters.host_syncs;
  device_.completed_epoch = newest.epoch;
  poll();
  return true;
}

bool StreamOrdering::synchronize_device() {
  if (!upstream_.synchronize_device()) return false;
  destroyed_work_unordered_ = false;
  all_retired_done();
  ++device_.counters.host_syncs;
  device_.fenced_epoch = device_.completed_epoch = device_.free_epoch++;
  unfenced_frees_ = false;
  poll();
  return true;
}

void StreamOrdering::fence_frees() {
  if (options_.unsafe_skip_ordering) return;
  if (unfenced_frees_ && !capture_active()) record_completion_fence();
  poll();
}

bool StreamOrdering::events_held_once() const {
  std::vector<EventHandle> held(spare_events_.begin(), spare_events_.end());
  held.insert(held.end(), to_recycle_.begin(), to_recycle_.end());
  for (const RetiredStream& r : retired_streams_) {
    if (r.event != 0) held.push_back(r.event);
  }
  auto add_fences = [&](const StreamState& s) {
    for (const Fence& f : s.pending) {
      held.push_back(f.event);
      held.insert(held.end(), f.more.begin(), f.more.end());
    }
  };
  add_fences(device_);
  for (const auto& [id, s] : streams_) add_fences(s);
  for (const auto& [id, s] : destroying_) add_fences(s);
  std::sort(held.begin(), held.end());
  return std::adjacent_find(held.begin(), held.end()) == held.end();
}


}  // namespace gpupool
