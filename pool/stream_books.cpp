// The books of streams: each stream's life as the pool learns of it (made,
// destroyed, ended with its thread, found gone where the runtime no longer
// knows it), its captures, and the report's rows of streams gone. The
// fences and barriers that order reuse between them are in ordering.cpp.
#include <algorithm>
#include <new>

#include "pool/ordering.hpp"

namespace gpupool {

StreamState& StreamOrdering::lookup(StreamId id) {
  auto [it, added] = streams_.try_emplace(id);
  if (added) {
    it->second.id = id;
    it->second.kind = StreamKind::NonBlocking;
  }
  last_stream_ = &it->second;  // elements of an unordered_map stay put until erased
  return it->second;
}

bool StreamOrdering::stream_created(StreamId id, StreamKind kind) {
  // A handle the books hold, given to a new stream: the one it named was
  // destroyed where gpupool could not see it (a driver call of the program's,
  // a library not taken over). (A per-thread id is never reused: met again,
  // it is the same stream.)
  const bool gone_unseen = kind != StreamKind::PerThread && known(id) != nullptr;
  StreamState& s = stream(id);
  // Its fences are kept until they complete. Nothing may fail once the first
  // event is set aside, or it would stay pending too: room comes first.
  to_recycle_.reserve(to_recycle_.size() + s.pending.size());
  for (const Fence& f : s.pending) to_recycle_.push_back(f.event);
  captures_active_ -= s.captures;
  if (gone_unseen) {
    // Its work since its last fence was never fenced, and can no longer be:
    // the handle names the new stream now. As for a destroyed stream whose
    // fence could not be recorded, only a device wait covers it. (Found gone
    // already, it was left to one then.)
    if (!s.gone) ++s.counters.destroyed_unseen;  // (found gone, it was counted then)
    if (addressable(s) && !s.gone && !options_.unsafe_skip_ordering) destroyed_work_unordered_ = true;
    report_destroyed(s);
  }
  s.restart(id, kind);
  // A non-blocking stream ignores the legacy stream, so it would not be ordered
  // after barriers recorded before it existed: make it wait for the latest.
  if (kind == StreamKind::NonBlocking && last_barrier_.epoch > device_.completed_epoch &&
      !options_.unsafe_skip_ordering) {
    return order_after_last_barrier(s);
  }
  return true;
}

bool StreamOrdering::order_after_last_barrier(StreamState& s) {
  if (upstream_.wait_event(s.id, last_barrier_.event)) {
    ++s.counters.barrier_waits;
    return true;
  }
  // Refused. Plain allocations the barrier covered may be live, and the
  // program may use them on the new stream at once: the host waits for the
  // barrier instead. (Allowed during a capture: the event was recorded
  // outside it, and is never recorded again while it is the latest barrier's.)
  if (upstream_.synchronize_event(last_barrier_.event)) {
    ++device_.counters.host_syncs;
    device_.completed_epoch = std::max(device_.completed_epoch, last_barrier_.epoch);
    return true;
  }
  // Not even that: the barriers so far no longer count for reuse. The next
  // one makes this stream wait too, or fails.
  device_.fenced_epoch = std::min(device_.fenced_epoch, device_.completed_epoch);
  return false;
}

StreamId StreamOrdering::stream_destroy_begin(StreamId id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return kAnyStream;
  StreamState& s = it->second;
  EventHandle own = 0;  // the blocks' event (see retired_done)
  to_recycle_.reserve(to_recycle_.size() + s.pending.size() + 1);  // (+1: see add_retired_stream)
  destroying_.reserve(destroying_.size() + 1);  // so that holding it aside cannot fail
  // Work queued on s may still run after the destroy returns. Keep an event at
  // its end: barriers make the legacy stream wait for it until it completes.
  // A capturing stream gets neither an event nor a host wait: either breaks
  // the capture, which goes on if the runtime refuses the destroy. Its work
  // from before the capture is left to the answer (see forget_destroyed).
  if (!options_.unsafe_skip_ordering && addressable(s) && s.captures == 0 && !s.gone) {
    const EventHandle event = take_event();
    if (event != 0 && upstream_.record_event(event, id)) {
      ++s.counters.fences_recorded;
      own = event;  // the blocks' key holds it (barriers and completion fences wait for it there)
    } else {
      if (event != 0) give_back_event(event);
      if (upstream_.synchronize_stream(id)) {
        ++s.counters.host_syncs;
      } else {
        // Nothing covers that work now: no barrier or completion fence may
        // claim to until the host has waited for the whole device.
        destroyed_work_unordered_ = true;
      }
    }
  }
  // Its fences only wait to be recycled: the event above, a host wait, or
  // (for work nothing covers) the device wait barriers stop for covers it.
  for (const Fence& f : s.pending) to_recycle_.push_back(f.event);
  s.pending.clear();
  // Its captures still count until the runtime answers: a refused destroy
  // leaves them going, and no barrier may touch the legacy stream meanwhile.
  if (last_stream_ == &it->second) last_stream_ = nullptr;
  // Moved as a node (no allocation); a stream held aside already (a destroy
  // of it under way on another thread) is reported gone.
  auto held = destroying_.insert(streams_.extract(it));
  if (!held.inserted) forget_destroyed(held.node.mapped());
  const StreamId key = own != 0 ? add_retired_stream(own) : kAnyStream;
  // Under "never" no other stream takes its blocks: they are plain requests'
  // (the key still tells barriers and completion fences what to wait for).
  return options_.cross_stream_reuse == CrossStreamReuse::Never ? kAnyStream : key;
}

StreamId StreamOrdering::add_retired_stream(EventHandle event) {
  // Each destroy asks after the oldest: streams tend to finish in the order
  // they were destroyed, so the list holds about those still running.
  while (!retired_streams_.empty() && retired_done(retired_streams_.front().key, true)) {
  }
  try {
    retired_streams_.push_back(RetiredStream{next_retired_key_++, event, false});
    return retired_streams_.back().key;
  } catch (const std::bad_alloc&) {
    // Out of host memory: no key, so nothing could wait for the event. The
    // host waits for it now (the blocks then need only a barrier's cover);
    // failing that, nothing covers the work until a device-wide wait.
  }
  if (upstream_.synchronize_event(event)) {
    ++device_.counters.host_syncs;
    give_back_event(event);
  } else {
    destroyed_work_unordered_ = true;
    to_recycle_.push_back(event);  // (room reserved by the caller)
  }
  return kAnyStream;
}

std::deque<StreamOrdering::RetiredStream>::iterator StreamOrdering::retired_entry(StreamId key) {
  const auto it = std::lower_bound(retired_streams_.begin(), retired_streams_.end(), key,
                                   [](const RetiredStream& r, StreamId k) { return r.key < k; });
  return it != retired_streams_.end() && it->key == key ? it : retired_streams_.end();
}

bool StreamOrdering::retired_done(StreamId key, bool ask) {
  if (retired_streams_.empty() || key < retired_streams_.front().key) return true;
  const auto it = retired_entry(key);
  if (it == retired_streams_.end()) return false;  // never given out
  if (it->done) return true;
  if (!ask || !ask_retired(*it)) return false;
  drop_done_retired();
  return true;
}

bool StreamOrdering::ask_retired(RetiredStream& r) {
  if (r.done) return true;
  if (r.event == 0) return false;
  const EventStatus status = upstream_.query_event(r.event);
  if (status == EventStatus::Pending) return false;
  give_back_event(r.event);
  r.event = 0;
  // An error tells nothing of the stream's work: nothing covers it now, as
  // when no event could be recorded at the destroy, and its blocks wait for
  // the device (barriers stop until the host has waited for the whole device).
  if (status != EventStatus::Complete) {
    destroyed_work_unordered_ = true;
    return false;
  }
  r.done = true;
  return true;
}

void StreamOrdering::drop_done_retired() {
  while (!retired_streams_.empty() && retired_streams_.front().done) retired_streams_.pop_front();
}

bool StreamOrdering::retired_done_before(StreamId mark) {
  while (!retired_streams_.empty() && retired_streams_.front().key < mark) {
    if (!ask_retired(retired_streams_.front())) return false;
    drop_done_retired();
  }
  return true;
}

void StreamOrdering::all_retired_done() {
  for (RetiredStream& r : retired_streams_) {
    if (r.event != 0) give_back_event(r.event);
  }
  retired_streams_.clear();
}

bool StreamOrdering::wait_for_retired(StreamId key, StreamId to) {
  if (retired_streams_.empty() || key < retired_streams_.front().key) return false;  // done: nothing to wait for
  const auto it = retired_entry(key);
  if (it == retired_streams_.end() || it->event == 0) return false;
  StreamState& dst = stream(to);
  if (!usable(dst) || !wait_on(dst, it->event)) return false;
  ++dst.counters.event_waits;
  ++dst.counters.destroyed_stream_waits;
  return true;
}

void StreamOrdering::stream_destroy_end(StreamId id, bool destroyed) {
  auto it = destroying_.find(id);
  if (it == destroying_.end()) return;
  auto node = destroying_.extract(it);
  StreamState& s = node.mapped();
  if (destroyed) {
    forget_destroyed(s);
    return;
  }
  // Met again meanwhile (a call on it from another thread), it was made to
  // follow the latest barrier then: one stream.
  if (StreamState* live = known(id)) {
    live->counters += s.counters;
    live->captures += s.captures;
    return;
  }
  StreamState& back = streams_.insert(std::move(node)).position->second;
  // A barrier recorded while it was held aside did not make it wait: it
  // follows the latest as a new stream does. (None was, had it captured.)
  if (back.kind == StreamKind::NonBlocking && back.captures == 0 && last_barrier_.epoch > device_.completed_epoch &&
      !options_.unsafe_skip_ordering) {
    order_after_last_barrier(back);
  }
}

void StreamOrdering::thread_stream_ended(StreamId id, bool again) {
  const auto it = streams_.find(id);
  // Never recorded on (it cannot be named from other threads), so it holds
  // no fence; one that did would be kept, not lost.
  if (it == streams_.end() || it->second.kind != StreamKind::PerThread || it->second.captures > 0 ||
      !it->second.pending.empty()) {
    return;
  }
  if (again) {
    report_gone_again(it->second);
  } else {
    report_destroyed(it->second);
  }
  if (last_stream_ == &it->second) last_stream_ = nullptr;
  streams_.erase(it);
}

void StreamOrdering::forget_destroyed(const StreamState& s) {
  captures_active_ -= s.captures;  // ended with it
  // Destroyed while it captured, it got no fence (stream_destroy_begin):
  // nothing covers its work from before the capture now. Refused, it would
  // have lived on, its capture to end, and later barriers would cover it.
  if (s.captures > 0 && addressable(s) && !options_.unsafe_skip_ordering) destroyed_work_unordered_ = true;
  report_destroyed(s);
}

void StreamOrdering::report_destroyed(const StreamState& s) {
  StreamReport r;
  r.id = s.id;
  r.kind = s.kind;
  r.counters = s.counters;
  report_gone(r);
}

void StreamOrdering::report_gone_again(const StreamState& s) {
  // Per-thread stream ids are never reused: a row with its id is its own.
  for (StreamReport& r : destroyed_) {
    if (r.id == s.id) {
      r.counters += s.counters;
      return;
    }
  }
  // Else its first end went to the row of later gone streams, which counts it.
  if (!destroyed_.empty() && destroyed_.back().id == 0) {
    destroyed_.back().counters += s.counters;
    return;
  }
  report_destroyed(s);
}

void StreamOrdering::report_gone(const StreamReport& r) {
  if (destroyed_.size() < kDestroyedStreamsReported) {
    destroyed_.push_back(r);
    destroyed_.back().alive = false;
    return;
  }
  StreamReport& rest = destroyed_.back();
  rest.id = 0;  // the last row stands for "this and every later gone stream"
  rest.streams += r.streams;
  rest.counters += r.counters;
}

void StreamOrdering::continue_history(const StreamOrdering& before) {
  device_.counters += before.device_.counters;
  for (const StreamReport& r : before.destroyed_) report_gone(r);
  for (const auto& [id, s] : before.destroying_) report_destroyed(s);  // destroyed with the rest
  for (const auto& [id, s] : before.streams_) {
    // The reset destroyed the streams the program created; the legacy and
    // per-thread streams are the runtime's and go on, their kind known.
    if (s.kind == StreamKind::Legacy || s.kind == StreamKind::PerThread) {
      StreamState& kept = stream(id);
      kept.kind = s.kind;
      kept.counters += s.counters;
    } else {
      report_destroyed(s);
    }
  }
}

void StreamOrdering::capture_began(StreamId id) {
  ++stream(id).captures;
  ++captures_active_;
}

void StreamOrdering::capture_ended(StreamId id) {
  StreamState& s = stream(id);
  if (s.captures > 0) {
    --s.captures;
    --captures_active_;
  }
}

bool StreamOrdering::capturing(StreamId id) const {
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.captures > 0;
}

void StreamOrdering::found_gone(StreamState& s) {
  // The runtime's own streams never go.
  if (s.gone || s.kind == StreamKind::Legacy || s.kind == StreamKind::PerThread) return;
  s.gone = true;
  ++s.counters.destroyed_unseen;
  gone_found_ = true;
  if (!options_.unsafe_skip_ordering) destroyed_work_unordered_ = true;
}

std::vector<StreamId> StreamOrdering::gone_streams() const {
  std::vector<StreamId> out;
  for (const auto& [id, s] : streams_) {
    if (s.gone) out.push_back(id);
  }
  return out;
}

std::vector<StreamId> StreamOrdering::forget_gone_streams() {
  // Room first: nothing may fail once one is dropped.
  std::vector<StreamId> dropped = gone_streams();
  std::size_t fences = 0;
  for (StreamId id : dropped) fences += streams_.at(id).pending.size();
  to_recycle_.reserve(to_recycle_.size() + fences);
  dropped.clear();
  for (auto it = streams_.begin(); it != streams_.end();) {
    StreamState& s = it->second;
    if (!s.gone) {
      ++it;
      continue;
    }
    // Its fences are kept until they complete (as a destroyed stream's; its
    // work waits for a device wait).
    for (const Fence& f : s.pending) to_recycle_.push_back(f.event);
    s.pending.clear();
    report_destroyed(s);
    if (last_stream_ == &s) last_stream_ = nullptr;
    if (s.captures > 0) {
      // A capture began on the handle since: a new stream has it. It stays,
      // as one never seen created, with its captures.
      const int captures = s.captures;
      s.restart(it->first, StreamKind::NonBlocking);
      s.captures = captures;
      ++it;
      continue;
    }
    dropped.push_back(it->first);
    it = streams_.erase(it);
  }
  gone_found_ = false;
  return dropped;
}

std::size_t StreamOrdering::non_blocking_streams() const {
  std::size_t n = 0;
  for (const auto& [id, s] : streams_) n += s.kind == StreamKind::NonBlocking && !s.gone ? 1 : 0;
  return n;
}

std::vector<StreamReport> StreamOrdering::stream_reports() const {
  std::vector<StreamReport> out;
  StreamReport d;
  d.id = kAnyStream;
  d.kind = StreamKind::Legacy;
  d.counters = device_.counters;
  out.push_back(d);
  // A stream whose destroy is under way is alive until the runtime answers.
  for (const auto* streams : {&streams_, &destroying_}) {
    for (const auto& [id, s] : *streams) {
      StreamReport r;
      r.id = id;
      r.kind = s.kind;
      r.counters = s.counters;
      out.push_back(r);
    }
  }
  out.insert(out.end(), destroyed_.begin(), destroyed_.end());
  return out;
}

}  // namespace gpupool
