#include "shim/runtime.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "pool/size_rules.hpp"
#include "report/diagnosis.hpp"
#include "shim/messages.hpp"
#include "shim/real_cuda.hpp"
#include "shim/report_file.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {
// Out-of-memory lines printed as they happen; the report has all of them.
constexpr int kOomWarnings = 8;
}  // namespace

std::atomic<bool> Runtime::report_requested_{false};
std::atomic<Runtime*> Runtime::started_{nullptr};

Runtime& Runtime::start() {
  static Runtime* runtime = [] {
    auto* r = new Runtime();
    started_.store(r, std::memory_order_release);
    return r;
  }();
  return *runtime;
}

Runtime::Runtime() {
  config::ParsedConfig parsed = config::parse_config(config::process_environment());
  config_ = parsed.config;
  problems_ = std::move(parsed.problems);
  config_notes_ = parsed.notes;
  set_log_level(config_.log_level);
  for (const config::Problem& p : problems_) message(config::LogLevel::Error, p.line());
  for (const std::string& note : parsed.notes) message(config::LogLevel::Info, note);
  if (config_.strict && !problems_.empty()) {
    message(config::LogLevel::Error,
            "gpupool: GPUPOOL_STRICT=1 and the configuration has " + std::to_string(problems_.size()) +
                " problem(s): stopping");
    std::_Exit(2);
  }
  disabled_ = config_.disable;
  if (disabled_) return;
  caches_.set_max_bytes(config_.thread_cache_size);
  if (config_.backtrace) call_sites_.enable();
  if (!config_.trace.empty()) {
    auto trace = std::make_unique<TraceWriter>();
    if (trace->open(config_.trace)) {
      trace_ = std::move(trace);
    } else {
      trace_not_opened_ = "gpupool: GPUPOOL_TRACE: cannot write '" + expand_path_template(config_.trace) +
                          "'; not tracing";
      message(config::LogLevel::Error, trace_not_opened_);
    }
  }
  install_report_signal();
}

DeviceState& Runtime::make_device(int index) {
  std::lock_guard<std::mutex> lock(devices_mu_);
  if (DeviceState* d = existing(index)) return *d;
  // A pool needs the runtime's calls; the guard then steps aside, and the
  // call is passed on (and refused while no runtime is found).
  if (real().cudaMalloc == nullptr) throw std::runtime_error("no CUDA runtime found in the process");
  if (!devices_counted_) {
    // Asked once, as the first pool is made (the runtime is in use by then).
    // Every call costs on a real runtime: with one device there is no
    // current device to ask for on each allocation.
    int count = 0;
    devices_counted_ = true;
    one_device_.store(real().cudaGetDeviceCount != nullptr &&
                          internal([&](const RealCuda& r) { return r.cudaGetDeviceCount(&count); }) == cudaSuccess &&
                          count == 1,
                      std::memory_order_relaxed);
  }
  auto* d = new DeviceState(index, unsafe_call_rules_, one_device_.load(std::memory_order_relaxed));
  for (const AccessGrant& g : access_grants_) {
    if (g.owner == index) d->upstream.set_accessor(g.accessor, access_flags(g.reasons));
  }
  std::size_t total = 0;
  std::size_t free_bytes = 0;
  if (!d->upstream.memory_info(&free_bytes, &total)) total = kUnlimited;
  d->pool = std::make_unique<DevicePool>(d->upstream, config::to_pool_options(config_), total, &clock_);
  d->pool->stream_created(kLegacyStream, StreamKind::Legacy);
  if (config_.expandable_segments && !d->pool->options().expandable_segments) {
    message(config::LogLevel::Warn,
            "gpupool: expandable_segments:1 needs the driver's virtual memory calls (cuMemCreate, cuMemMap), which "
            "this driver does not give for device " + std::to_string(index) + "; it uses fixed segments from cudaMalloc");
  }
  if (default_pool_opened_[index].load(std::memory_order_relaxed)) follow_opened_pool(*d);  // before it serves
  devices_[index].store(d, std::memory_order_release);
  only_device_.store(++device_states_ == 1 ? index : -1, std::memory_order_release);
  return *d;
}

int Runtime::asked_current_device() const {
  int dev = 0;
  if (real().cudaGetDevice == nullptr || real().cudaGetDevice(&dev) != cudaSuccess) return 0;
  return dev >= 0 && dev < kMaxDevices ? dev : 0;
}

bool Runtime::take_cached(void** out, std::size_t size, StreamId consumer, int dev) {
  const std::size_t rounded = round_size(size, config_.roundup_power2_divisions);
  CachedBlock b{};
  if (!caches_.take(consumer, dev, rounded, size, &b)) return false;
  caches_.live().insert(b.ptr, LiveBlock{b.block.size, size, dev, false});
  *out = reinterpret_cast<void*>(b.ptr);
  return true;
}

// Never throws: it also runs as a thread ends.
void Runtime::give_back_cached(const CachedBlock& block) {
  if (stepped_aside()) return;  // kept (see keep_after_stepping_aside)
  keep_books("a thread cache's flush", [&] {
    Runtime& rt = get();
    DeviceState* d = rt.existing(block.block.device);
    if (d == nullptr) return;
    LiveBlock parked{};
    // The pool's again: a later free is the pool's to judge.
    const bool tracked = rt.caches_.live().take(block.ptr, &parked);
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    if (tracked) count_last_request(*d, block.ptr, parked.requested);
    d->pool->deallocate(block.ptr, block.stream);
  });
}

void Runtime::count_last_request(DeviceState& d, DevicePtr ptr, std::size_t requested) {
  const Block* b = d.pool->find_allocated(ptr);
  if (b == nullptr) return;
  d.requested_returned_drift[static_cast<int>(b->segment->kind)] +=
      static_cast<std::int64_t>(requested) - static_cast<std::int64_t>(b->requested);
}

cudaError_t Runtime::allocate(void** out, std::size_t size, StreamId consumer, int dev, bool* runtime_serves,
                              bool named_default_pool) {
  if (runtime_serves != nullptr && !named_default_pool && own_pool_current_[dev].load(std::memory_order_relaxed)) {
    own_pool_allocations_.fetch_add(1, std::memory_order_relaxed);
    *runtime_serves = true;  // from the program's own pool, not from a cache of the default one
    return cudaSuccess;
  }
  if (runtime_serves != nullptr && opened_pool_to_runtime_[dev].load(std::memory_order_relaxed)) {
    opened_pool_allocations_.fetch_add(1, std::memory_order_relaxed);
    *runtime_serves = true;  // from the default pool itself, which other devices may use
    return cudaSuccess;
  }
  mark_used();
  const bool caching = caches_.enabled() && consumer != kAnyStream;
  if (caching && captures_active_.load(std::memory_order_relaxed) == 0 && take_cached(out, size, consumer, dev)) {
    if (trace_) trace_->record(TraceWriter::Action::Allocate, reinterpret_cast<DevicePtr>(*out), size, consumer, dev);
    return cudaSuccess;
  }
  DeviceState& d = device(dev);
  const std::uint32_t site = call_sites_.capture();
  Allocation a;
  cudaError_t error = cudaErrorMemoryAllocation;  // when the pool cannot serve it
  std::size_t block_size = 0;
  bool grew = false;
  std::vector<StreamId> forgotten;
  bool capturing = false;
  for (int attempt = 0; attempt < 2 && !capturing; ++attempt) {
    bool last_try = true;
    {
      std::lock_guard<AdaptiveMutex> lock(d.mu);
      if (runtime_serves != nullptr && d.pool->is_capturing(consumer)) {
        capturing = true;  // the runtime serves it
        continue;
      }
      if (!d.foreign_frees.empty()) return_foreign_frees(d, attempt == 1);
      // The block this thread's cache kept past its limit goes back under
      // this lock, not one of its own (and may serve this very request).
      if (caching && attempt == 0 && captures_active_.load(std::memory_order_relaxed) == 0) return_spill(d, dev);
      // A first failure is tried again once the blocks held outside the pool
      // (threads' caches, frees waiting on another device) are back in it.
      last_try = attempt == 1 || (!caches_.enabled() && d.foreign_frees.empty());
      if (caching) {
        const std::int64_t reserved_before = d.pool->stats().reserved_bytes[kAll].current;
        a = d.pool->allocate(size, consumer, site, last_try);
        grew = d.pool->stats().reserved_bytes[kAll].current > reserved_before;
        // Only stream-ordered blocks may go into a cache, so only they are
        // tracked there (the pool counts them apart: see add_pool_figure).
        if (a.ok && a.ptr != 0) block_size = d.pool->find_allocated(a.ptr)->size;
      } else {
        a = d.pool->allocate(size, consumer, site, last_try);
      }
      if (a.device_error) error = d.upstream.last_error();
      if (!a.ok && !a.device_error && last_try) warn_oom(d);
      take_forgotten_streams(d, &forgotten);
    }
    if (a.ok || a.device_error || last_try) break;
    if (caches_.enabled()) caches_.flush_all();  // the blocks other threads keep may be what is missing
  }
  if (!forgotten.empty()) forget_stream_handles(dev, forgotten);
  if (capturing) {
    *runtime_serves = true;
    return cudaSuccess;
  }
  if (a.ok && block_size != 0) {
    caches_.live().insert(a.ptr, LiveBlock{block_size, size, dev, false});
    // The pool took memory from the device: the blocks threads keep go back
    // to it, so that it does not go on growing beside them.
    if (grew) caches_.flush_all();
  }
  if (trace_) {
    trace_->record(a.ok ? TraceWriter::Action::Allocate : TraceWriter::Action::AllocateFailure, a.ptr, size,
                   consumer, dev);
  }
  if (!a.ok) return fail(error);
  *out = reinterpret_cast<void*>(a.ptr);
  return cudaSuccess;
}

void Runtime::return_spill(DeviceState& d, int dev) {
  CachedBlock spill{};
  if (!caches_.take_spill(dev, &spill)) return;
  LiveBlock parked{};
  if (caches_.live().take(spill.ptr, &parked)) {  // the pool's again, as give_back_cached does
    count_last_request(d, spill.ptr, parked.requested);
  }
  d.pool->deallocate(spill.ptr, spill.stream);
}

FreeResult Runtime::deallocate(void* ptr, StreamId site, int site_device, int* owner) {
  const auto p = reinterpret_cast<DevicePtr>(ptr);
  if (stepped_aside()) return keep_after_stepping_aside(p, owner);
  // The freeing stream's device state, made now if it is new (free_foreign
  // needs it): never while a pool's lock is held, which would invert the
  // order fork's handler takes the locks in.
  if (site_device >= 0) device(site_device);
  // The freeing stream's device first: a stream-ordered free is nearly
  // always of its own device's memory. A plain free's block is looked for
  // first on the only device with a pool, else on the current one:
  // cudaGetDevice is a runtime call, which a one-device program's frees skip.
  int first = site_device >= 0 ? site_device : only_device_.load(std::memory_order_acquire);
  if (first < 0) first = current_device();
  std::size_t last_request = 0;  // of a block the live table tracked, going to the pool
  bool tracked = false;
  if (caches_.enabled()) {
    // Only a block of the freeing stream's own device goes into a cache.
    const bool cacheable = site != kAnyStream && captures_active_.load(std::memory_order_relaxed) == 0 && !bypass();
    LiveBlock live{};
    switch (caches_.live().release(p, cacheable ? site_device : -1, &live)) {
      case LiveTable::Freed::AlreadyParked:
        mark_used();
        return FreeResult::NotAllocated;  // freed twice: the first free put it in a thread cache
      case LiveTable::Freed::Live:
        mark_used();
        if (live.parked) {
          // Traced before the cache may pass the block on (see below).
          if (trace_) trace_->record(TraceWriter::Action::Free, p, live.requested, site, live.device);
          caches_.keep(CachedBlock{p, live, site});
          if (owner != nullptr) *owner = live.device;
          return FreeResult::Freed;
        }
        first = live.device;  // a plain free, or a capture under way: the pool's
        tracked = true;
        last_request = live.requested;
        break;
      case LiveTable::Freed::Unknown:
        break;
    }
  }
  for (int i = -1; i < kMaxDevices; ++i) {
    const int index = i < 0 ? first : i;
    if (i == first) continue;
    DeviceState* d = existing(index);
    if (d == nullptr) continue;
    FreeResult r;
    std::vector<StreamId> forgotten;
    {
      std::lock_guard<AdaptiveMutex> lock(d->mu);
      const bool foreign_site = site != kAnyStream && site_device >= 0 && site_device != index;
      if (foreign_site || tracked || trace_ || !d->foreign_frees.empty()) {
        r = free_with_books(*d, p, site, site_device, index, foreign_site, tracked ? &last_request : nullptr);
      } else {
        r = d->pool->deallocate(p, site);
      }
      take_forgotten_streams(*d, &forgotten);
    }
    if (!forgotten.empty()) forget_stream_handles(index, forgotten);
    if (r == FreeResult::NotOwned) continue;
    mark_used();
    if (r == FreeResult::Freed && trace_) trace_->write_full_buffers();
    if (owner != nullptr) *owner = index;
    return r;
  }
  return FreeResult::NotOwned;
}

FreeResult Runtime::free_with_books(DeviceState& d, DevicePtr p, StreamId site, int site_device, int index,
                                    bool foreign_site, const std::size_t* last_request) {
  // The block is looked up here only where it is needed: the pool's own
  // free finds it again.
  const Block* b = foreign_site || trace_ ? d.pool->find_allocated(p) : nullptr;
  const std::size_t size = b != nullptr ? b->requested : 0;
  const bool waiting = std::any_of(d.foreign_frees.begin(), d.foreign_frees.end(),
                                   [p](const DeviceState::ForeignFree& f) { return f.ptr == p; });
  if (last_request != nullptr && !waiting) count_last_request(d, p, *last_request);
  FreeResult r;
  if (waiting) {
    r = FreeResult::NotAllocated;  // freed twice: the first free waits on another device
  } else if (b != nullptr && foreign_site) {
    r = free_foreign(d, p, site, site_device);
  } else {
    r = d.pool->deallocate(p, site);
  }
  // Traced while the lock is held: once it goes, another thread may be
  // handed the block, and the trace must show this free before that
  // allocation. A full buffer is written out after, not under this lock.
  if (r == FreeResult::Freed && trace_) trace_->record(TraceWriter::Action::Free, p, size, site, index, false);
  return r;
}

FreeResult Runtime::keep_after_stepping_aside(DevicePtr ptr, int* owner) {
  // Never lent again, so never lent twice, whatever the failure left half
  // done: only the segment map is read, which an exception leaves whole.
  const int dev = device_holding(reinterpret_cast<const void*>(ptr));
  if (dev < 0) return FreeResult::NotOwned;
  if (owner != nullptr) *owner = dev;
  return FreeResult::Freed;
}

int Runtime::device_holding(const void* ptr) {
  const auto p = reinterpret_cast<DevicePtr>(ptr);
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* d = existing(i);
    // A reset once gpupool stepped aside gave the device's memory back.
    if (d == nullptr || d->reset_after_stepping_aside.load()) continue;
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    if (d->pool->owns(p)) return i;
  }
  return -1;
}

void Runtime::device_reset_after_stepping_aside(int dev, cudaError_t err) {
  DeviceState* d = existing(dev);
  if (d != nullptr && reset_outcome(*d, err) != ResetOutcome::Refused) d->reset_after_stepping_aside.store(true);
}

cudaError_t Runtime::synchronize_for_free(int dev) {
  DeviceState* d = dev >= 0 ? existing(dev) : nullptr;
  return d != nullptr ? d->upstream.synchronize_for_free() : real().cudaDeviceSynchronize();
}

FreeResult Runtime::free_foreign(DeviceState& d, DevicePtr ptr, StreamId site, int site_device) {
  // The event is made and recorded on the stream's device (its upstream
  // switches to it); no pool lock of that device is needed for that. Its
  // state exists: deallocate made sure before taking d's lock.
  CudaUpstream& there = existing(site_device)->upstream;
  if (there.capturing(site)) {
    // Freed inside a capture: the graph's from now on, like a pooled block
    // freed inside one; it waits here for good (event 0), never handed out.
    d.foreign_frees.push_back(DeviceState::ForeignFree{ptr, 0, site_device});
    return FreeResult::Freed;
  }
  const EventHandle event = there.create_event();
  if (event != 0 && there.record_event(event, site)) {
    d.foreign_frees.push_back(DeviceState::ForeignFree{ptr, event, site_device});
    return FreeResult::Freed;
  }
  // No event to be had (a failing runtime): wait for the stream instead.
  if (event != 0) there.destroy_event(event);
  if (there.synchronize_stream(site)) return d.pool->deallocate(ptr, kAnyStream);
  // Not even that: this device's barriers do not reach that stream's work,
  // so the block waits here for good (event 0), never handed out.
  d.foreign_frees.push_back(DeviceState::ForeignFree{ptr, 0, site_device});
  return FreeResult::Freed;
}

void Runtime::settle_foreign_frees(DeviceState& d, bool destroy_events) {
  for (const DeviceState::ForeignFree& f : d.foreign_frees) {
    d.pool->deallocate(f.ptr, kAnyStream);
    if (destroy_events && f.event != 0) d.upstream.destroy_event(f.event);
  }
  d.foreign_frees.clear();
}

void Runtime::return_foreign_frees(DeviceState& d, bool wait, int reset_device) {
  std::size_t kept = 0;
  for (DeviceState::ForeignFree f : d.foreign_frees) {
    if (reset_device >= 0 && f.event_device != reset_device) {
      d.foreign_frees[kept++] = f;
      continue;
    }
    // Events are queried and waited for from any device. An error (a device
    // in error) keeps the block: only a completed event lets it go.
    const bool done = f.event != 0 && (wait ? d.upstream.synchronize_event(f.event)
                                            : d.upstream.query_event(f.event) == EventStatus::Complete);
    if (!done) {
      if (reset_device >= 0 && f.event != 0) {
        // Gone with the reset; its handle may name a new event of the program's.
        d.upstream.destroy_event(f.event);
        f.event = 0;
      }
      d.foreign_frees[kept++] = f;
      continue;
    }
    d.upstream.destroy_event(f.event);
    d.pool->deallocate(f.ptr, kAnyStream);  // as if freed by cudaFree now: reuse waits for this device's barrier
  }
  d.foreign_frees.resize(kept);
}

void Runtime::warn_oom(const DeviceState& d) {
  if (oom_warnings_.fetch_add(1) >= kOomWarnings || d.pool->ooms().empty()) return;
  const report::OomDiagnosis diag = report::diagnose(d.pool->ooms().back(), d.pool->options());
  message(config::LogLevel::Warn, "gpupool: device " + std::to_string(d.device) + ": out of memory: " +
                                      diag.verdict + (diag.advice.empty() ? "" : "; " + diag.advice));
}

// ---------------------------------------------------------------- queries

void Runtime::adjust_mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  DeviceState* d = existing(current_device());
  const std::size_t limit = config_.memory_limit;
  std::size_t reserved = 0;
  std::size_t cached = 0;
  if (d != nullptr) {
    // Cached, as the pool's free blocks are.
    const std::int64_t kept = kept_by_threads(d->device);
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    reserved = static_cast<std::size_t>(d->pool->stats().reserved_bytes[kAll].current);
    cached = d->pool->fragmentation().free_bytes + static_cast<std::size_t>(kept);
  }
  if (config_.mem_get_info == config::MemGetInfo::CachedIsFree) *free_bytes += cached;
  if (limit != kUnlimited && limit < *total_bytes) {
    *total_bytes = limit;
    const std::size_t in_use =
        config_.mem_get_info == config::MemGetInfo::CachedIsFree ? reserved - cached : reserved;
    const std::size_t room = limit > in_use ? limit - in_use : 0;
    if (*free_bytes > room) *free_bytes = room;
  }
  if (*free_bytes > *total_bytes) *free_bytes = *total_bytes;
}

std::int64_t Runtime::kept_by_threads(int device) {
  return caches_.enabled() ? std::max<std::int64_t>(caches_.traffic(device).kept_bytes, 0) : 0;
}

void Runtime::device_resetting(int dev) {
  // Other devices' blocks freed on this device's streams wait on its events,
  // which a reset destroys: wait for them now, while they still mean
  // something (the reset would wait for that work too; a refused one loses
  // nothing by it).
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* other = i == dev ? nullptr : existing(i);
    if (other == nullptr) continue;
    std::lock_guard<AdaptiveMutex> lock(other->mu);
    if (!other->foreign_frees.empty()) return_foreign_frees(*other, true, dev);
  }
}

Runtime::ResetOutcome Runtime::reset_outcome(DeviceState& d, cudaError_t err) {
  if (err == cudaSuccess) return ResetOutcome::Happened;
  // A reset may return an earlier launch's error having reset all the same,
  // or be refused: the memory gpupool holds there says which.
  DevicePtr held = 0;
  {
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    held = d.pool->held_address();
  }
  const std::optional<bool> still = held != 0 ? d.upstream.device_memory_at(held) : std::nullopt;
  if (!still.has_value()) return ResetOutcome::Unknown;
  return *still ? ResetOutcome::Refused : ResetOutcome::Happened;
}

void Runtime::device_reset_answered(int dev, cudaError_t err) {
  DeviceState* d = existing(dev);
  const ResetOutcome outcome = d != nullptr ? reset_outcome(*d, err) : err == cudaSuccess ? ResetOutcome::Happened
                                                                                          : ResetOutcome::Unknown;
  // Refused, the device keeps its memory, pools and captures: so do the books.
  // Unknown, gpupool forgets memory that may be gone (keeping it could lend
  // freed memory), and asks the runtime which captures ended.
  if (outcome == ResetOutcome::Refused) return;
  // The reset destroyed the pools the program made: the default one is
  // current again (asked for anew: the handle may change).
  own_pool_current_[dev].store(false, std::memory_order_relaxed);
  default_pool_opened_[dev].store(false, std::memory_order_relaxed);
  opened_pool_to_runtime_[dev].store(false, std::memory_order_relaxed);
  default_pools_[dev].store(nullptr, std::memory_order_release);
  if (d != nullptr) forget_device_memory(*d);
  forget_device_streams(dev);
  end_grants_at_reset(dev);  // its pages forgotten first: the reset released them
  if (d == nullptr) return;
  if (outcome == ResetOutcome::Unknown) {
    forget_ended_captures(*d);
    return;
  }
  {
    // The reset destroyed its streams, and their captures with them.
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    forget_captures(*d, kAnyStream);
  }
  // Other devices' blocks freed inside a capture of its streams (event 0)
  // were the graphs', which are gone: they go back as freed now.
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* other = i == dev ? nullptr : existing(i);
    if (other == nullptr) continue;
    std::lock_guard<AdaptiveMutex> lock(other->mu);
    std::size_t kept = 0;
    for (const DeviceState::ForeignFree& f : other->foreign_frees) {
      if (f.event_device == dev && f.event == 0) {
        other->pool->deallocate(f.ptr, kAnyStream);  // as if freed by cudaFree now
      } else {
        other->foreign_frees[kept++] = f;
      }
    }
    other->foreign_frees.resize(kept);
  }
}

void Runtime::forget_device_memory(DeviceState& d) {
  // The runtime freed everything on the device, our segments too: forget
  // them and start a fresh pool. Blocks threads keep go back to the pool
  // first, so that what it holds allocated is what the program does (taken
  // before the pool's lock: a flush takes the caches, then the pool).
  const int dev = d.device;
  const std::vector<std::pair<DevicePtr, LiveBlock>> held = caches_.forget_device(dev);
  std::lock_guard<AdaptiveMutex> lock(d.mu);
  // The reset freed them: the pool counts them freed as it forgets them.
  for (const auto& [ptr, live] : held) count_last_request(d, ptr, live.requested);
  // Frees still waiting on another device's stream were the program's own
  // (and traced when made): frees, not losses to the reset.
  settle_foreign_frees(d, true);
  if (trace_) {
    // The reset freed what the program still held here: traced as frees,
    // so that the trace stays a history gpupool-replay can follow.
    d.pool->for_each_allocated([&](const Block& b) {
      trace_->record(TraceWriter::Action::Free, b.addr, b.requested, b.stream, dev, false);
    });
  }
  d.upstream.forget_pages();
  streams_generation_.fetch_add(1);
  // The old pool goes (its destructor frees bookkeeping only, no upstream
  // call); the new one carries on its history for the report.
  auto fresh = std::make_unique<DevicePool>(d.upstream, config::to_pool_options(config_), d.pool->device_capacity(),
                                            &clock_);
  fresh->stream_created(kLegacyStream, StreamKind::Legacy);
  fresh->continue_history(*d.pool);
  d.pool = std::move(fresh);
}

void Runtime::forget_ended_captures(DeviceState& d) {
  std::vector<StreamId> ended;
  {
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    for (const DeviceState::Capture& c : d.captures) {
      // Another thread's per-thread stream cannot be asked about: kept.
      cudaStream_t handle = nullptr;
      if (stream_handle(c.stream, &handle)) ended.push_back(c.stream);
    }
  }
  // Asked without the lock (as free_foreign asks), each stream once.
  std::sort(ended.begin(), ended.end());
  ended.erase(std::unique(ended.begin(), ended.end()), ended.end());
  std::erase_if(ended, [&](StreamId s) { return d.upstream.capturing(s); });
  std::lock_guard<AdaptiveMutex> lock(d.mu);
  for (StreamId s : ended) forget_captures(d, s);
}

}  // namespace gpupool::shim
