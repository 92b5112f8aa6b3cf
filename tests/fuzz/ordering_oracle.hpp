// An Upstream between the pool and a VirtualUpstream that knows what the
// device would know: vector clocks of stream work, with CUDA's rules (a
// recorded event captures its stream's work so far, a wait makes later work
// on a stream follow it, the legacy stream and blocking streams order each
// other, a completed event means the work it captured is done). The fuzz
// target tells it what the program does (frees, new streams, captures); it
// then says whether the bytes of an allocation may be used by its consumer
// without racing the work queued before their last free, and checks that
// pages are unmapped only once that work is done. It keeps the device's
// answers consistent with that order: an event or a stream behind a wait for
// work not done is not complete.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pool/types.hpp"
#include "pool/virtual_upstream.hpp"

namespace gpupool::fuzz {

class OrderingOracle final : public Upstream {
 public:
  explicit OrderingOracle(VirtualUpstream& device) : device_(device) {}

  // --- what the program does ---
  // A stream (handle) begins: a new identity, even for a handle seen before.
  void stream_begins(StreamId handle, StreamKind kind) {
    if (auto old = streams_.find(handle); old != streams_.end()) ended_.push_back(old->second.identity);
    streams_[handle] = Stream{next_identity_++, kind, false};
    forget_finished_identities();
  }
  // A stream is destroyed where the pool cannot see it, and its handle given
  // to no new stream yet: the device refuses calls naming it (see
  // VirtualUpstream::set_gone_stream), and it gets no more work.
  void stream_gone(StreamId handle) {
    auto it = streams_.find(handle);
    if (it == streams_.end()) return;
    ended_.push_back(it->second.identity);
    streams_.erase(it);
    forget_finished_identities();
  }
  void set_capturing(StreamId handle, bool capturing) { streams_.at(handle).capturing = capturing; }
  // A stream of another device captures (in global mode: see check_no_capture).
  void set_capture_elsewhere(bool yes) { capture_elsewhere_ = yes; }
  // The program freed [ptr, ptr+bytes): plainly (kAnyStream: its work may be
  // on any stream), or stream-ordered on `site`.
  void freed(DevicePtr ptr, std::size_t bytes, StreamId site) {
    // A stream-ordered free promises that the block's uses are ordered before
    // it on `site`: at least the consumer's work up to the allocation.
    if (auto use = in_use_.find(ptr); use != in_use_.end()) {
      if (site != kAnyStream && !streams_.at(site).capturing) merge(knowledge_[identity(site)], use->second);
      in_use_.erase(use);
    }
    plain_obligations_.erase(ptr);
    Clock requirement;
    if (site == kAnyStream) {
      for (auto& [handle, s] : streams_) requirement[s.identity] = ++position_[s.identity];
    } else if (streams_.at(site).capturing) {
      requirement[kGraph] = 1;  // freed when a graph runs: never known done
    } else {
      const std::uint32_t id = streams_.at(site).identity;
      requirement[id] = ++position_[id];
    }
    freed_.emplace(ptr, Freed{ptr + bytes, std::move(requirement)});
  }
  // Whether the consumer (a stream, or kAnyStream: any stream) may use
  // [ptr, ptr+bytes) now; the bytes are in use from then on.
  bool safe_to_use(DevicePtr ptr, std::size_t bytes, StreamId consumer, std::string* why) {
    bool safe = true;
    Clock obligations;  // what a stream made later must follow too, for a plain allocation
    for_each_freed(ptr, ptr + bytes, [&](DevicePtr start, const Freed& f) {
      const DevicePtr begin = std::max(start, ptr), end = std::min(f.end, ptr + bytes);
      for (const auto& [id, at] : f.requirement) {
        if (covered(completed_, id, at)) continue;
        obligations[id] = std::max(obligations[id], at);
        for (const auto& [handle, s] : streams_) {
          if (consumer != kAnyStream && handle != consumer) continue;
          if (id == s.identity || covered(effective(handle), id, at)) continue;
          if (waived(s.identity, begin, end, id, at)) continue;
          *why = "bytes freed at position " + std::to_string(at) + " of stream identity " + std::to_string(id) +
                 " handed to a consumer whose stream " + std::to_string(handle) + " is not ordered after it";
          safe = false;
        }
      }
    });
    forget(ptr, ptr + bytes);
    if (consumer == kAnyStream && !obligations.empty()) plain_obligations_[ptr] = std::move(obligations);
    Clock& use = in_use_[ptr];
    use.clear();
    if (consumer != kAnyStream) {
      use = effective(consumer);
      use[identity(consumer)] = std::max(use[identity(consumer)], position_[identity(consumer)]);
    }
    return safe;
  }
  // After the pool has seen a stream begin: the program may use any live
  // plain allocation on it at once, so it must already follow the work queued
  // before those bytes were freed (or that work be known done).
  bool stream_ready_for_plain(StreamId handle, std::string* why) {
    const Clock follows = effective(handle);
    for (const auto& [ptr, obligations] : plain_obligations_) {
      for (const auto& [id, at] : obligations) {
        if (covered(completed_, id, at) || covered(follows, id, at)) continue;
        *why = "stream " + std::to_string(handle) + " made while plain allocation " + std::to_string(ptr) +
               " is live is not ordered after position " + std::to_string(at) + " of stream identity " +
               std::to_string(id) + ", queued before its bytes were freed";
        return false;
      }
    }
    return true;
  }
  // The pool could not order `handle`, a stream made just now, after earlier
  // work, and said so (the shim warns that memory cudaFree released before
  // may still be in use by earlier work when used on it; a device refusing
  // both a wait and a host wait has stopped running work). The plain
  // allocations live now, whose blocks span `plain_blocks`, may then be used
  // on it, and their blocks reused there after a free on it, without
  // following the work their bytes' last frees before now required.
  void stream_not_ordered(StreamId handle, const std::vector<std::pair<DevicePtr, DevicePtr>>& plain_blocks) {
    for (const auto& [begin, end] : plain_blocks) {
      Clock waived;
      for_each_freed(begin, end, [&](DevicePtr, const Freed& f) { merge(waived, f.requirement); });
      if (auto o = plain_obligations_.find(begin); o != plain_obligations_.end()) merge(waived, o->second);
      waivers_.push_back(Waiver{identity(handle), begin, end, std::move(waived)});
    }
  }
  void set_events_complete_at_once(bool yes) {
    at_once_ = yes;
    device_.set_events_complete_at_once(yes);
  }
  // Events recorded on this stream from now on stay pending until
  // complete_all(), even when others complete at once (0: none): its work
  // lags behind the rest of the device's.
  void set_lagging_stream(StreamId handle) {
    lagging_ = handle;
    device_.set_lagging_stream(handle);
  }
  void complete_all() {
    device_.complete_all();
    for (const auto& [event, clock] : recorded_) merge(completed_, clock);
    held_.clear();
  }
  // The first rule broken by the pool's own calls, or empty.
  const std::string& violation() const { return violation_; }

  // --- Upstream ---
  DevicePtr allocate_segment(std::size_t bytes) override { return device_.allocate_segment(bytes); }
  bool release_segment(DevicePtr base, std::size_t bytes) override {
    check_no_capture("release_segment");
    all_done();  // cudaFree waits for the device
    forget(base, base + bytes);
    return device_.release_segment(base, bytes);
  }
  bool failed_for_memory() const override { return device_.failed_for_memory(); }
  bool failed_for_gone_stream() const override { return device_.failed_for_gone_stream(); }
  EventHandle create_event() override { return device_.create_event(); }
  void destroy_event(EventHandle event) override {
    recorded_.erase(event);
    held_.erase(event);
    device_.destroy_event(event);
  }
  bool record_event(EventHandle event, StreamId stream) override {
    if (!device_.record_event(event, stream)) return false;
    check_not_capturing(stream, "record_event");
    Clock clock = settle(stream);
    const std::uint32_t id = identity(stream);
    clock[id] = std::max(clock[id], position_[id]);
    held_.erase(event);
    if (at_once_ && (lagging_ == 0 || stream != lagging_)) {
      // The stream's own work is done at once; what it waited for may not be.
      if (follows_undone(clock, id)) {
        held_[event] = id;
      } else {
        merge(completed_, clock);
      }
    }
    recorded_[event] = std::move(clock);
    return true;
  }
  bool wait_event(StreamId stream, EventHandle event) override {
    if (!device_.wait_event(stream, event)) return false;
    check_not_capturing(stream, "wait_event");
    settle(stream);
    auto it = recorded_.find(event);
    if (it != recorded_.end()) merge(knowledge_[identity(stream)], it->second);
    return true;
  }
  // The device completes events at once (but the lagging stream's) and
  // reports streams idle as told; the oracle keeps its answers consistent
  // with the work they follow: an event, or a stream, behind work not done
  // (a wait for the lagging stream) is pending until that work is done.
  EventStatus query_event(EventHandle event) override {
    const EventStatus status = device_.query_event(event);
    auto held = held_.find(event);
    if (status != EventStatus::Complete || held == held_.end()) return status;
    const Clock& clock = recorded_.at(event);
    if (follows_undone(clock, held->second)) return EventStatus::Pending;
    merge(completed_, clock);
    held_.erase(held);
    return status;
  }
  EventStatus query_stream(StreamId stream) override {
    EventStatus status = device_.query_stream(stream);
    if (status == EventStatus::Complete && follows_undone(effective(stream), identity(stream))) {
      status = EventStatus::Pending;
    }
    if (status == EventStatus::Complete) stream_done(stream);
    return status;
  }
  bool synchronize_event(EventHandle event) override {
    if (!device_.synchronize_event(event)) return false;
    held_.erase(event);
    auto it = recorded_.find(event);
    if (it != recorded_.end()) merge(completed_, it->second);
    return true;
  }
  bool synchronize_stream(StreamId stream) override {
    if (!device_.synchronize_stream(stream)) return false;
    stream_done(stream);
    return true;
  }
  bool synchronize_device() override {
    check_no_capture("synchronize_device");
    if (!device_.synchronize_device()) return false;
    all_done();
    return true;
  }
  StreamId legacy_stream() const override { return device_.legacy_stream(); }
  // As the shim counts them: this device's captures and any other's.
  bool capture_forbids_unsafe_calls() const override {
    if (capture_elsewhere_) return true;
    for (const auto& [handle, s] : streams_) {
      if (s.capturing) return true;
    }
    return false;
  }
  bool memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    return device_.memory_info(free_bytes, total_bytes);
  }
  std::size_t page_size() const override { return device_.page_size(); }
  DevicePtr reserve_address_space(std::size_t bytes) override { return device_.reserve_address_space(bytes); }
  bool map_pages(DevicePtr addr, std::size_t bytes) override { return device_.map_pages(addr, bytes); }
  std::size_t unmap_pages(DevicePtr addr, std::size_t bytes) override {
    check_no_capture("unmap_pages");
    // No wait here: work still queued on these bytes would fault.
    for_each_freed(addr, addr + bytes, [&](DevicePtr, const Freed& f) {
      for (const auto& [id, at] : f.requirement) {
        if (!covered(completed_, id, at) && violation_.empty()) {
          violation_ = "pages unmapped under work not known done (stream identity " + std::to_string(id) + ")";
        }
      }
    });
    forget(addr, addr + bytes);
    return device_.unmap_pages(addr, bytes);
  }

 private:
  // A vector clock, stream identity -> position, sorted in one vector: the
  // oracle copies clocks at every call, and a map's node per entry (each one
  // an allocation that ASan records a stack for) was most of fuzz-pool's time
  // on inputs with many streams.
  class Clock {
   public:
    using Entry = std::pair<std::uint32_t, std::uint64_t>;
    using const_iterator = std::vector<Entry>::const_iterator;
    std::uint64_t& operator[](std::uint32_t id) {
      auto it = std::lower_bound(entries_.begin(), entries_.end(), id,
                                 [](const Entry& e, std::uint32_t key) { return e.first < key; });
      if (it == entries_.end() || it->first != id) it = entries_.insert(it, Entry{id, 0});
      return it->second;
    }
    const_iterator find(std::uint32_t id) const {
      auto it = std::lower_bound(entries_.begin(), entries_.end(), id,
                                 [](const Entry& e, std::uint32_t key) { return e.first < key; });
      return it != entries_.end() && it->first == id ? it : entries_.end();
    }
    const_iterator begin() const { return entries_.begin(); }
    const_iterator end() const { return entries_.end(); }
    bool empty() const { return entries_.empty(); }
    void clear() { entries_.clear(); }
    void erase(std::uint32_t id) {
      auto it = find(id);
      if (it != end()) entries_.erase(it);
    }
    // Each entry the later of the two: in place when `from` names no stream
    // this clock lacks (the usual case), else one sorted merge.
    void merge(const Clock& from) {
      auto mine = entries_.begin();
      bool in_place = true;
      for (const Entry& e : from.entries_) {
        while (mine != entries_.end() && mine->first < e.first) ++mine;
        if (mine == entries_.end() || mine->first != e.first) {
          in_place = false;
          break;
        }
        mine->second = std::max(mine->second, e.second);
      }
      if (in_place) return;
      std::vector<Entry> out;
      out.reserve(entries_.size() + from.entries_.size());
      auto a = entries_.begin();
      auto b = from.entries_.begin();
      while (a != entries_.end() || b != from.entries_.end()) {
        if (b == from.entries_.end() || (a != entries_.end() && a->first < b->first)) {
          out.push_back(*a++);
        } else if (a == entries_.end() || b->first < a->first) {
          out.push_back(*b++);
        } else {
          out.emplace_back(a->first, std::max(a->second, b->second));
          ++a;
          ++b;
        }
      }
      entries_.swap(out);
    }

   private:
    std::vector<Entry> entries_;
  };
  static constexpr std::uint32_t kGraph = 0;
  struct Stream {
    std::uint32_t identity;
    StreamKind kind;
    bool capturing;
  };
  struct Freed {
    DevicePtr end;
    Clock requirement;  // positions of work that must be done, or followed
  };

  // Bytes [begin, end) of a plain allocation's block, used on a stream the
  // pool could not order: what their frees required then (stream_not_ordered).
  struct Waiver {
    std::uint32_t stream;
    DevicePtr begin;
    DevicePtr end;
    Clock requirement;
  };

  static void merge(Clock& into, const Clock& from) { into.merge(from); }
  bool waived(std::uint32_t stream, DevicePtr begin, DevicePtr end, std::uint32_t id, std::uint64_t at) const {
    for (const Waiver& w : waivers_) {
      if (w.stream == stream && w.begin <= begin && end <= w.end && covered(w.requirement, id, at)) return true;
    }
    return false;
  }
  // Whether `clock` follows work of another stream than `own` not known done.
  bool follows_undone(const Clock& clock, std::uint32_t own) const {
    for (const auto& [id, at] : clock) {
      if (id != own && !covered(completed_, id, at)) return true;
    }
    return false;
  }
  static bool covered(const Clock& clock, std::uint32_t id, std::uint64_t at) {
    auto it = clock.find(id);
    return it != clock.end() && it->second >= at;
  }
  std::uint32_t identity(StreamId handle) const { return streams_.at(handle).identity; }
  // What later work on `handle` follows: its own knowledge, and the legacy
  // stream's and the blocking streams' ordering of each other.
  Clock effective(StreamId handle) {
    const Stream& s = streams_.at(handle);
    Clock clock = knowledge_[s.identity];
    add_implicit_order(clock, s);
    return clock;
  }
  void add_implicit_order(Clock& clock, const Stream& s) {
    for (const auto& [other, o] : streams_) {
      // A per-thread default stream is a blocking one.
      auto blocking = [](StreamKind k) { return k == StreamKind::Blocking || k == StreamKind::PerThread; };
      const bool orders = (blocking(s.kind) && o.kind == StreamKind::Legacy) ||
                          (s.kind == StreamKind::Legacy && blocking(o.kind));
      if (!orders) continue;
      merge(clock, knowledge_[o.identity]);  // another identity: `clock` stays where it is
      clock[o.identity] = std::max(clock[o.identity], position_[o.identity]);
    }
  }
  // An operation on the stream: from now on it knows what it follows (its
  // knowledge updated in place, not copied: clocks of long inputs are large).
  Clock& settle(StreamId handle) {
    const Stream& s = streams_.at(handle);
    Clock& clock = knowledge_[s.identity];
    add_implicit_order(clock, s);
    return clock;
  }
  void stream_done(StreamId handle) {
    merge(completed_, effective(handle));
    const std::uint32_t id = identity(handle);
    completed_[id] = std::max(completed_[id], position_[id]);
  }
  // The host waited for the whole device: everything queued so far is done,
  // on every stream, destroyed ones too.
  void all_done() {
    for (const auto& [id, at] : position_) completed_[id] = std::max(completed_[id], at);
  }
  // An ended stream's identity gets no more work, and no new requirement
  // names it. Once all of its work is known done (`completed_` alone then
  // answers for it: each check asks `completed_` first), or no requirement
  // names it any longer (what follows it matters to nobody), every clock but
  // `completed_` drops it. Without this, each stream made again grows every
  // clock by an entry for good, and inputs that remake streams spent most of
  // their time merging clocks.
  void forget_finished_identities() {
    if (ended_.empty()) return;
    std::set<std::uint32_t> named;  // ended identities a requirement still names
    auto note = [&](const Clock& requirement) {
      for (const auto& [id, at] : requirement) {
        if (std::find(ended_.begin(), ended_.end(), id) != ended_.end()) named.insert(id);
      }
    };
    for (const auto& [ptr, f] : freed_) note(f.requirement);
    for (const auto& [ptr, clock] : plain_obligations_) note(clock);
    for (const Waiver& w : waivers_) note(w.requirement);
    auto finished = [&](std::uint32_t id) {
      const auto at = position_.find(id);
      return at == position_.end() || covered(completed_, id, at->second) || named.count(id) == 0;
    };
    auto first = std::stable_partition(ended_.begin(), ended_.end(), [&](std::uint32_t id) { return !finished(id); });
    for (auto it = first; it != ended_.end(); ++it) {
      const std::uint32_t id = *it;
      knowledge_.erase(id);
      for (auto& [other, clock] : knowledge_) clock.erase(id);
      for (auto& [event, clock] : recorded_) clock.erase(id);
      for (auto& [ptr, f] : freed_) f.requirement.erase(id);
      for (auto& [ptr, clock] : in_use_) clock.erase(id);
      for (auto& [ptr, clock] : plain_obligations_) clock.erase(id);
      std::erase_if(waivers_, [id](const Waiver& w) { return w.stream == id; });
      for (Waiver& w : waivers_) w.requirement.erase(id);
    }
    ended_.erase(first, ended_.end());
  }
  void check_not_capturing(StreamId handle, const char* call) {
    if (!violation_.empty()) return;
    const bool legacy = handle == device_.legacy_stream();
    for (const auto& [other, s] : streams_) {
      if (s.capturing && (other == handle || legacy)) {
        violation_ = std::string(call) + " on stream " + std::to_string(handle) + " while stream " +
                     std::to_string(other) + " captures";
      }
    }
  }
  // cudaFree, cudaDeviceSynchronize, cuMemUnmap: a global-mode capture,
  // here or on another device, forbids them from every thread.
  void check_no_capture(const char* call) {
    if (violation_.empty() && capture_forbids_unsafe_calls()) violation_ = std::string(call) + " during a capture";
  }
  template <typename F>
  void for_each_freed(DevicePtr begin, DevicePtr end, F&& f) {
    auto it = freed_.upper_bound(begin);
    if (it != freed_.begin()) --it;
    for (; it != freed_.end() && it->first < end; ++it) {
      if (it->second.end > begin) f(it->first, it->second);
    }
  }
  // The bytes no longer carry a free's history; the parts of freed ranges
  // outside them keep theirs.
  void forget(DevicePtr begin, DevicePtr end) {
    std::vector<std::pair<DevicePtr, Freed>> kept;
    auto it = freed_.upper_bound(begin);
    if (it != freed_.begin()) --it;
    while (it != freed_.end() && it->first < end) {
      if (it->second.end <= begin) {
        ++it;
        continue;
      }
      if (it->first < begin) kept.emplace_back(it->first, Freed{begin, it->second.requirement});
      if (it->second.end > end) kept.emplace_back(end, Freed{it->second.end, it->second.requirement});
      it = freed_.erase(it);
    }
    for (auto& [at, f] : kept) freed_.emplace(at, std::move(f));
  }

  VirtualUpstream& device_;
  bool at_once_ = true;
  StreamId lagging_ = 0;
  bool capture_elsewhere_ = false;
  std::map<StreamId, Stream> streams_;
  std::uint32_t next_identity_ = kGraph + 1;
  std::map<std::uint32_t, std::uint64_t> position_;  // frees so far, per stream identity
  std::vector<std::uint32_t> ended_;                 // identities of streams made again, still in the clocks
  std::map<std::uint32_t, Clock> knowledge_;         // per stream identity
  std::map<EventHandle, Clock> recorded_;            // each event's latest record
  // Events the device completed at once, recorded on a stream (the value's
  // identity) after it waited for work not yet done: pending until it is.
  std::map<EventHandle, std::uint32_t> held_;
  Clock completed_;                                  // work known done on the device
  std::map<DevicePtr, Freed> freed_;
  std::map<DevicePtr, Clock> in_use_;  // each live allocation's consumer clock when it was made
  // Each live plain allocation's frees not known done when it was made.
  std::map<DevicePtr, Clock> plain_obligations_;
  std::vector<Waiver> waivers_;
  std::string violation_;
};

}  // namespace gpupool::fuzz
