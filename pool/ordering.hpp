// The cross-stream protocol: when may a cached block be handed to a consumer
// without racing with work queued before it was freed?
//
// Every free is stamped with two epochs: the freeing stream's and the device's.
// - Reuse on the stream that freed it needs nothing: stream order.
// - Reuse on another stream t needs a *fence*: an event recorded on the freeing
//   stream after the free. Either it has completed (checked with a query), or t
//   waits for it on the device (cudaStreamWaitEvent; no host wait).
// - Plain cudaFree promised a device-wide synchronization, and plain cudaMalloc
//   names no stream, so such reuse needs the *device barrier*: each live
//   non-blocking stream not found idle (and each destroyed stream with work in
//   flight) records an event that the legacy stream waits for; the legacy
//   stream records event L; each live non-blocking stream waits for L (idle
//   or not: its later work must follow). CUDA's legacy-stream rule does
//   the rest: a legacy action waits for all prior work of blocking streams, and
//   later work of blocking streams waits for it. After one barrier, every
//   stream's later work runs after every stream's earlier work, with no host
//   wait. Non-blocking streams created later are made to wait for the latest L
//   (where they cannot, the host waits for it).
// Fences and barriers are recorded lazily, when a reuse needs them, so a burst
// of frees costs one barrier. While any stream capture is active nothing is
// recorded (it would invalidate the capture): only completed frees are reused.
#pragma once

#include <deque>
#include <unordered_map>
#include <vector>

#include "pool/options.hpp"
#include "pool/stats.hpp"
#include "pool/upstream.hpp"

namespace gpupool {

struct Fence {
  std::uint64_t epoch = 0;  // frees stamped <= epoch are covered
  EventHandle event = 0;
  // A completion fence (device only) also needs these; it orders nothing.
  std::vector<EventHandle> more;
  // And, made while destroyed streams' work was in flight (their events
  // pending under keys below this; 0: none), those events.
  StreamId retired_mark = 0;
};

struct StreamState {
  static constexpr std::uint64_t kFirstEpoch = 1;
  StreamId id = 0;
  StreamKind kind = StreamKind::Blocking;
  std::uint64_t free_epoch = kFirstEpoch;  // stamped on frees until the next fence
  std::uint64_t fenced_epoch = 0;     // frees stamped <= this are fenced
  std::uint64_t completed_epoch = 0;  // frees stamped <= this are complete
  std::deque<Fence> pending;          // recorded, not yet seen complete
  int captures = 0;                   // captures under way on this stream
  // The runtime said it knows no such stream: destroyed where the pool could
  // not see it (see StreamOrdering::found_gone). Named in no call from then.
  bool gone = false;
  // Device barriers to go before this stream, found busy, is asked again
  // whether it is idle (see seen_idle).
  std::uint8_t idle_checks_skipped = 0;
  StreamCounters counters;

  // Starts afresh as a new stream. Allocates nothing: the fences' storage is
  // kept (a new deque allocates). The caller has taken the pending fences.
  void restart(StreamId new_id, StreamKind new_kind) {
    pending.clear();
    id = new_id;
    kind = new_kind;
    free_epoch = kFirstEpoch;
    fenced_epoch = 0;
    completed_epoch = 0;
    captures = 0;
    gone = false;
    idle_checks_skipped = 0;
    counters = StreamCounters{};
  }
};

class StreamOrdering {
 public:
  StreamOrdering(Upstream& upstream, const PoolOptions& options);
  // Never calls upstream: at process exit the device may be gone. Events held
  // are deliberately leaked (as RMM does).
  ~StreamOrdering() = default;
  StreamOrdering(const StreamOrdering&) = delete;
  StreamOrdering& operator=(const StreamOrdering&) = delete;

  // --- stream life ---
  // A non-blocking stream is made to follow the latest barrier: plain
  // allocations it covered may be live, and used on the stream at once.
  // False when the runtime refused both the wait and a host wait for it: the
  // stream is unordered after that barrier (which no longer counts for reuse).
  bool stream_created(StreamId id, StreamKind kind);
  // Before the real destroy: fences the stream's queued work so that nothing it
  // used is reused early. The caller re-keys the stream's cached blocks.
  void stream_destroying(StreamId id) {
    stream_destroy_begin(id);
    stream_destroy_end(id, true);
  }
  // The same in two steps, around a destroy the runtime may refuse: the
  // fencing first, with the stream's state held aside (its captures still
  // count, so no barrier is made meanwhile if it captures); then, destroyed,
  // its counters go to the report's gone streams, and refused, the stream
  // lives on with its kind, counters and captures (its fences stay retired).
  // Returns the key for the stream's cached blocks: one of their own (see
  // retired_done), or kAnyStream, whose blocks wait for the device barrier or
  // a completion fence.
  StreamId stream_destroy_begin(StreamId id);
  void stream_destroy_end(StreamId id, bool destroyed);
  // A destroyed stream's cached blocks are keyed to a pool-made id (the top
  // bit set: no stream handle, a user-space address, has it), with an event
  // recorded at the destroy after all the stream's work. Once that event has
  // completed, they are done, whatever other streams still have queued:
  // without it they would wait for a completion fence, which a stream that
  // the program keeps fed never lets complete, and a program that makes a
  // stream for each task would grow the pool at every task. True when known
  // done; `ask`: query the event if not known yet.
  static bool is_retired_key(StreamId id) { return (id & kRetiredKeyBit) != 0 && id != kAnyStream; }
  bool retired_done(StreamId key, bool ask);
  // Makes `to` wait on the device for that event, while pending: its later
  // work then follows the destroyed stream's, and only that (a barrier would
  // make it follow every busy stream's). False where it cannot.
  bool wait_for_retired(StreamId key, StreamId to);
  // Some of a destroyed stream's cached blocks could not be re-keyed.
  void destroyed_stream_keys_left() { destroyed_keys_left_ = true; }
  // The thread whose per-thread default stream this is has ended. Its state
  // goes (its counters to the report's gone streams), so that a program whose
  // threads come and go does not make the pool keep, poll and report a
  // stream for each. Blocks freed on it keep its id as their key: such ids are
  // never reused, and a stream this ordering does not know is ordered as
  // another thread's per-thread stream is, through the device (stream_ready).
  // Left as it is while it captures. `again`: it ended before and was used
  // since (from a pthread key's destructor that ran after the shim's): the
  // same stream, whose counters join the row its first end made.
  void thread_stream_ended(StreamId id, bool again = false);
  // After a device reset, in a fresh ordering (see DevicePool::continue_history):
  // the streams of `before` are reported on, as destroyed where the reset
  // destroyed them. Its events are gone with the reset: none is taken over.
  void continue_history(const StreamOrdering& before);
  void capture_began(StreamId id);
  void capture_ended(StreamId id);
  bool capture_active() const { return captures_active_ > 0; }
  // cudaFree, cudaDeviceSynchronize and page unmapping: never while a stream
  // of this device captures, nor while another device's capture forbids them
  // (see Upstream::capture_forbids_unsafe_calls).
  bool unsafe_calls_allowed() const { return !capture_active() && !upstream_.capture_forbids_unsafe_calls(); }
  bool is_capturing(StreamId id) const { return captures_active_ > 0 && capturing(id); }
  // Streams the runtime said are gone, since the last forget_gone_streams.
  // The caller re-keys their cached blocks (a later stream may get the
  // handle) and then has them forgotten: their fences retired, their rows
  // reported as destroyed, and their state dropped (returned: the ids), but
  // for one a capture began on since (a new stream has its handle then,
  // which stays as one never seen created). A handle dropped names a new
  // stream when next met, to be introduced with stream_created.
  bool streams_found_gone() const { return gone_found_; }
  std::vector<StreamId> gone_streams() const;
  std::vector<StreamId> forget_gone_streams();
  bool knows(StreamId id) const { return streams_.count(id) != 0; }  // in the books, alive
  // Live non-blocking streams: each one a device barrier must ask or make wait.
  std::size_t non_blocking_streams() const;

  // The stream's state, added on first sight. A stream never seen created is
  // taken as non-blocking: the kind that needs the most ordering.
  StreamState& stream(StreamId id) {
    // Most calls name the same stream as the one before: skip the hash.
    if (last_stream_ != nullptr && last_stream_->id == id) return *last_stream_;
    return lookup(id);
  }
  StreamState& device() { return device_; }
  const StreamState& device() const { return device_; }

  // --- frees and reuse ---
  struct FreeStamp {
    std::uint64_t stream_epoch;
    std::uint64_t device_epoch;
  };
  FreeStamp stamp_free(StreamId site);

  // True when a block freed at `device_epoch` may be used on any live stream
  // (recording a device barrier if needed). False when that is impossible now.
  // Inline where a barrier already covers it and no capture is under way
  // (nearly every plain reuse): the rest is device_ready_slow.
  bool device_ready(std::uint64_t device_epoch) {
    if (device_epoch <= device_.fenced_epoch && !capture_active()) return true;
    return device_ready_slow(device_epoch);
  }
  // The same for a plain cudaMalloc. Where a destroyed stream's work that
  // nothing covers stops the barriers, the host waits for the whole device
  // now instead: the runtime's own cudaFree would have waited so, and
  // without it the pool grows at every plain request until out of memory.
  bool plain_ready(std::uint64_t device_epoch) { return device_ready(device_epoch) || wait_out_unordered_work(); }
  // True when a block freed at `device_epoch` is already covered: by a
  // recorded barrier, or known complete. Records nothing.
  bool device_ordered(std::uint64_t device_epoch) const {
    return device_epoch <= device_.fenced_epoch || device_epoch <= device_.completed_epoch;
  }
  // True when a barrier recorded since the free orders every stream's later
  // work after it (not during a capture: see device_ready_slow). Records nothing.
  bool device_covered(std::uint64_t device_epoch) const {
    return device_epoch <= device_.fenced_epoch && !capture_active();
  }
  // True when another stream may take a block freed at `device_epoch` with
  // no call and no dependency under the `auto` policy: a barrier recorded
  // since the free already orders every stream's later work after it.
  // (The `completed` policy waits for completion instead.) Records nothing.
  bool auto_covered(std::uint64_t device_epoch) const {
    return options_.cross_stream_reuse == CrossStreamReuse::Auto && device_covered(device_epoch);
  }
  // The same, or the work queued before the free known complete (this may
  // query the device's oldest pending fence).
  bool complete_or_covered(std::uint64_t device_epoch) {
    return device_complete(device_epoch) || auto_covered(device_epoch);
  }
  bool device_complete(std::uint64_t device_epoch);
  // True when the work queued before a free with this history is known done,
  // from what fences and idle queries have already shown. Queries nothing.
  bool known_complete(StreamId stream, std::uint64_t stream_epoch, std::uint64_t device_epoch);

  // True when a block freed on `from` at `stream_epoch` may be used on `to`:
  // when known complete (or `from` is idle); else, with `may_wait`, after
  // making `to` wait for a fence on `from` (on the device). Without it a
  // fence is recorded so that the block can be seen complete later: on
  // `from`, or, where `from` cannot be named (another thread's per-thread
  // default stream), a completion fence; under pressure the device barrier
  // orders such a block instead.
  bool stream_ready(StreamId from, std::uint64_t stream_epoch, std::uint64_t device_epoch,
                    StreamId to, bool may_wait);

  // Queries outstanding fences and recycles completed events. Never blocks.
  void poll();

  // Blocks the host until everything queued before now, on every stream, has
  // completed (a barrier and a wait on it; with no event to record one, a
  // wait for the whole device). Off the fast path: used before device memory
  // is given back page by page.
  bool wait_for_frees();
  // Records a completion fence (an event on every stream, no waits) if frees
  // happened since the last fence, so that they can be seen complete later;
  // polls what is outstanding. Never waits, never orders streams.
  void fence_frees();

  std::vector<StreamReport> stream_reports() const;  // cached_* left for the pool

  // False when an event is held in two places (spare, retired, or a pending
  // fence): it could be recorded for two fences, and the first be seen
  // complete by the second's work. For validate(). (A host allocation that
  // fails partway through an operation leaves none held twice; it may leave
  // one held nowhere, which only leaks it.)
  bool events_held_once() const;

 private:
  bool device_ready_slow(std::uint64_t device_epoch);
  // Destroyed streams kept individually in the report; later ones are folded
  // into the last entry.
  static constexpr std::size_t kDestroyedStreamsReported = 64;
  static constexpr StreamId kRetiredKeyBit = StreamId{1} << (8 * sizeof(StreamId) - 1);
  // A destroyed stream whose event is pending, or failed.
  struct RetiredStream {
    StreamId key;
    EventHandle event;  // 0: done (or, not done, its query failed: never known done)
    bool done;
  };
  // A key for a stream being destroyed whose event `event` was recorded after
  // its work, or kAnyStream (no host memory for one: the host waits for the
  // event instead). Takes the event either way.
  StreamId add_retired_stream(EventHandle event);
  std::deque<RetiredStream>::iterator retired_entry(StreamId key);  // end() where none
  bool ask_retired(RetiredStream& r);  // queries its event while pending; true once done
  void drop_done_retired();            // from the front
  bool retired_done_before(StreamId mark);  // every key below mark done (asked in order)
  void all_retired_done();             // after a host wait for the whole device

  StreamState& lookup(StreamId id);
  // The stream's state, or null where it has none (see thread_stream_ended).
  StreamState* known(StreamId id) {
    if (last_stream_ != nullptr && last_stream_->id == id) return last_stream_;
    const auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : &it->second;
  }
  // A destroyed stream leaves the books (its captures ended with it).
  void forget_destroyed(const StreamState& s);
  void report_destroyed(const StreamState& s);
  void report_gone_again(const StreamState& s);  // see thread_stream_ended
  void report_gone(const StreamReport& r);  // never allocates (room is reserved)
  bool capturing(StreamId id) const;
  EventHandle take_event();
  void refill_spare_events();  // before a barrier
  void give_back_event(EventHandle event);  // never throws
  // Gives back those of `events` no longer pending (complete or erred).
  void give_back_done(std::vector<EventHandle>& events);
  // True when all work queued on s so far has completed (for a barrier).
  // Asked of the device for a stream found idle at its last check, and for
  // one found busy only every kBusyCheckInterval-th time: a busy stream tends
  // to stay busy, and the query would be a wasted call.
  bool seen_idle(StreamState& s);
  bool order_after_last_barrier(StreamState& s);  // see stream_created
  bool record_fence(StreamState& s);  // one event on s covering its frees so far
  bool record_barrier();
  // Calls naming a stream in the books. Where one fails because the runtime
  // no longer knows the stream, it is marked gone (see found_gone).
  bool record_on(StreamState& s, EventHandle event);
  bool wait_on(StreamState& s, EventHandle event);
  EventStatus query(StreamState& s);
  // The runtime no longer knows s: destroyed through the driver, its handle
  // not given again. Its work since its last fence is covered by nothing
  // now, as a destroyed stream's whose fence failed: the next barrier waits
  // for the whole device on the host first. Barriers and completion fences
  // leave it out from then on; else each would fail on it, and plain reuse
  // would grow the pool until the device is full.
  void found_gone(StreamState& s);
  // A host wait for the whole device, with no event: every free so far is
  // then complete.
  bool synchronize_device();
  // Where a destroyed stream's work that nothing covers stops the barriers,
  // and no capture forbids it: a host wait for the whole device.
  bool wait_out_unordered_work();
  bool record_completion_fence();
  void poll(StreamState& s);
  bool addressable(const StreamState& s) const { return s.kind != StreamKind::PerThread; }
  // Its later work follows every action already queued on the legacy stream
  // (CUDA's legacy-stream rule): the legacy stream itself, a blocking stream,
  // a per-thread default stream.
  static bool follows_legacy(const StreamState& s) { return s.kind != StreamKind::NonBlocking && !s.gone; }
  // Events may be recorded, waited for and queried on it now: not while it
  // captures, and not on the legacy stream while any capture is under way (a
  // capturing blocking stream's capture would break).
  bool usable(const StreamState& s) const {
    return s.captures == 0 && !(s.kind == StreamKind::Legacy && capture_active());
  }

  Upstream& upstream_;
  const PoolOptions& options_;
  StreamState device_;
  std::unordered_map<StreamId, StreamState> streams_;
  std::unordered_map<StreamId, StreamState> destroying_;  // between the steps of a destroy
  std::vector<EventHandle> spare_events_;
  // Events nothing waits for, kept until complete so that none is recorded
  // again while pending: a destroyed or gone stream's fences (its event at
  // the destroy, a host wait or a device wait covers that work), those of a
  // barrier or completion fence that failed, and a destroy's own event where
  // neither a key nor a host wait could be had.
  std::vector<EventHandle> to_recycle_;
  // The keys of destroyed streams' blocks, ascending, each with the event
  // recorded after the stream's work (barriers wait for it while pending,
  // and completion fences count once it is done); each leaves from the front
  // once done, so a key before the front is done. As many as the device has
  // destroyed streams' work in flight: a stream-per-task program's tasks
  // then each wait for the one before, never for a barrier.
  std::deque<RetiredStream> retired_streams_;
  StreamId next_retired_key_ = kRetiredKeyBit | 1;
  std::vector<StreamReport> destroyed_;  // counters of destroyed streams, for the report
  int captures_active_ = 0;
  bool unfenced_frees_ = false;  // a free happened since the last device fence
  // A destroyed stream's work that no event covers (none recorded, or its
  // query failed) and no host wait saw done.
  bool destroyed_work_unordered_ = false;
  bool gone_found_ = false;  // a stream is marked gone and still in the books
  Fence last_barrier_;           // for streams created after it
  // Frees stamped <= this have a completion fence recorded after them, whose
  // first event is on the legacy stream (see stream_ready).
  std::uint64_t legacy_fenced_epoch_ = 0;
  // Blocks of a destroyed stream stayed keyed to it (host memory ran out as
  // they were re-keyed): a key the books do not know is then not surely an
  // ended thread's per-thread stream, whose work the legacy stream follows.
  bool destroyed_keys_left_ = false;
  StreamState* last_stream_ = nullptr;  // stream()'s one-entry cache
};

}  // namespace gpupool
