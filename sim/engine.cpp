#include "sim/engine.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "sim/counters.hpp"
#include "sim/memory.hpp"

namespace simcuda {

namespace {
// This thread's per-thread default streams, by device. Retired when the
// thread ends, so that threads that come and go leave no worker behind (each
// would be woken by every operation of every stream). Not the main thread's:
// that is the process ending, and its exit handlers may still use the stream.
// The slots are cleared, so a use after that (a thread-local destroyed
// later) makes a new stream.
struct PerThreadStreams {
  static constexpr std::size_t kMostDevices = Memory::kMostDevices;
  Stream* by_device[kMostDevices] = {};
  ~PerThreadStreams() {
    if (getpid() == static_cast<pid_t>(syscall(SYS_gettid))) return;
    Engine::instance().retire_per_thread_streams(by_device, kMostDevices);
    for (Stream*& s : by_device) s = nullptr;
  }
};
thread_local PerThreadStreams t_per_thread;
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

// A call naming a destroyed stream whose handle no stream has again. CUDA
// leaves it undefined; here it is refused as an unknown handle, and counted.
cudaError_t destroyed_stream_named() {
  counters().destroyed_stream_calls++;
  return cudaErrorInvalidResourceHandle;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace

Engine& Engine::instance() {
  static Engine* engine = new Engine();
  return *engine;
}

Engine::Engine() : delay_us_(env_u64("SIMCUDA_OP_DELAY_US", 0)) {
  for (int device = 0; device < Memory::instance().devices(); ++device) {
    auto* legacy = new Stream();
    legacy->kind = StreamKind::Legacy;
    legacy->device = device;
    legacy_.push_back(legacy);
    track(legacy);
  }
}

Stream* Engine::resolve(cudaStream_t handle, bool per_thread, int device) {
  const auto raw = reinterpret_cast<std::uintptr_t>(handle);
  const bool wants_per_thread = raw == 0x2 || (raw == 0 && per_thread);
  if (wants_per_thread) {
    Stream*& mine = t_per_thread.by_device[static_cast<std::size_t>(device)];
    if (mine == nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      mine = new Stream();
      mine->kind = StreamKind::PerThread;
      mine->device = device;
      track(mine);
    }
    return mine;
  }
  if (raw == 0 || raw == 0x1) return legacy_[static_cast<std::size_t>(device)];
  return reinterpret_cast<StreamHandle*>(handle)->stream.load(std::memory_order_acquire);
}

cudaStream_t Engine::create_stream(unsigned flags, int device) {
  auto* s = new Stream();
  s->kind = (flags & cudaStreamNonBlocking) != 0 ? StreamKind::NonBlocking : StreamKind::Blocking;
  s->device = device;
  std::lock_guard<std::mutex> lock(mu_);
  if (free_handles_.empty()) {
    s->handle = new StreamHandle();
  } else {
    s->handle = free_handles_.back();
    free_handles_.pop_back();
  }
  s->handle->stream.store(s, std::memory_order_release);
  track(s);
  return reinterpret_cast<cudaStream_t>(s->handle);
}

cudaError_t Engine::destroy_stream(Stream* s) {
  if (s->kind == StreamKind::Legacy || s->kind == StreamKind::PerThread) return cudaErrorInvalidResourceHandle;
  static const bool refuse_capturing = env_flag("SIMCUDA_REFUSE_CAPTURING_DESTROY");
  static const bool reuse_handles = env_flag("SIMCUDA_REUSE_STREAM_HANDLES");
  std::lock_guard<std::mutex> lock(mu_);
  if (s->destroyed) return destroyed_stream_named();
  if (s->capturing && refuse_capturing) return cudaErrorStreamCaptureUnsupported;
  // As CUDA: returns at once; queued work still runs, then the worker ends.
  // A capture ends with its stream (the driver takes cuStreamEndCapture's
  // path), its graph lost.
  end_stream(s, reuse_handles);
  cv_.notify_all();
  return cudaSuccess;
}

void Engine::end_stream(Stream* s, bool give_handle_again) {
  s->destroyed = true;
  s->capturing = false;
  if (give_handle_again) free_handles_.push_back(s->handle);
  if (!s->worker_started) forget_drained(s);  // (a worker leaves by itself, drained)
  s->work.notify_all();
}

void Engine::retire_per_thread_streams(Stream* const* streams, std::size_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < count; ++i) {
    if (streams[i] != nullptr) end_stream(streams[i], false);
  }
  cv_.notify_all();
}

void Engine::track(Stream* s) {
  streams_.push_back(s);
  counters().streams_tracked = streams_.size();
}

void Engine::forget_drained(Stream* s) {
  const auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return;
  streams_.erase(it);
  drained_.push_back(s);
  counters().streams_tracked = streams_.size();
}

void Engine::invalidate_captures_blocked_by_legacy(int device) {
  for (Stream* other : streams_) {
    if (other->capturing && other->blocking() && other->device == device) other->invalidated = true;
  }
}

cudaError_t Engine::enqueue(Stream* s, std::function<void()> run, std::vector<Dependency> extra,
                            bool delayed, std::uint64_t* seq) {
  std::unique_lock<std::mutex> lock(mu_);
  if (s->destroyed) return destroyed_stream_named();
  if (s->capturing) {
    // Recorded into the graph, not run.
    ++s->captured_nodes;
    if (seq != nullptr) *seq = 0;
    return cudaSuccess;
  }
  std::vector<Dependency> deps = std::move(extra);
  if (s->kind == StreamKind::Legacy) {
    for (Stream* other : streams_) {
      if (other->capturing && other->blocking() && other->device == s->device) {
        invalidate_captures_blocked_by_legacy(s->device);
        return cudaErrorStreamCaptureImplicit;
      }
    }
    for (Stream* other : streams_) {
      if (other != s && other->blocking() && other->device == s->device && other->enqueued > other->completed) {
        deps.push_back(Dependency{other, other->enqueued});
      }
    }
    counters().legacy_ops++;
  } else if (s->blocking()) {
    Stream* legacy = legacy_[static_cast<std::size_t>(s->device)];
    if (legacy->enqueued > legacy->completed) deps.push_back(Dependency{legacy, legacy->enqueued});
  }
  Op op;
  op.seq = ++s->enqueued;
  op.deps = std::move(deps);
  op.run = std::move(run);
  op.delayed = delayed;
  if (seq != nullptr) *seq = op.seq;
  s->queue.push_back(std::move(op));
  if (!s->worker_started) start_worker(s);
  s->work.notify_all();
  return cudaSuccess;
}

void Engine::start_worker(Stream* s) {
  s->worker_started = true;
  std::thread([this, s] { work(s); }).detach();
}

void Engine::work(Stream* s) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    s->work.wait(lock, [&] {
      counters().worker_wakeups++;
      return !s->queue.empty() || s->destroyed;
    });
    if (s->queue.empty()) {  // destroyed and drained
      forget_drained(s);
      return;
    }
    Op& op = s->queue.front();
    // One dependency at a time: a done one stays done.
    for (const Dependency& d : op.deps) {
      d.stream->done.wait(lock, [&] {
        counters().worker_wakeups++;
        return done(d);
      });
    }
    std::function<void()> run = std::move(op.run);
    const std::uint64_t seq = op.seq;
    const bool delayed = op.delayed;
    lock.unlock();
    if (delayed && delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    if (run) run();
    lock.lock();
    s->queue.pop_front();
    s->completed = seq;
    s->done.notify_all();
    cv_.notify_all();
  }
}

cudaError_t Engine::record(Event* e, Stream* s) {
  counters().event_records++;
  if (e->device != s->device) return cudaErrorInvalidResourceHandle;  // as CUDA: one device for both
  if (s->capturing) {
    std::lock_guard<std::mutex> lock(mu_);
    e->captured = true;
    e->stream = nullptr;
    ++s->captured_nodes;
    return cudaSuccess;
  }
  std::uint64_t seq = 0;
  const cudaError_t err = enqueue(s, nullptr, {}, false, &seq);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu_);
  e->stream = s;
  e->seq = seq;
  e->captured = false;
  return cudaSuccess;
}

cudaError_t Engine::wait(Stream* s, Event* e) {
  counters().stream_waits++;
  std::vector<Dependency> deps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s->capturing && !e->captured) {
      // Waiting on work outside the capture is not allowed.
      s->invalidated = true;
      return cudaErrorStreamCaptureIsolation;
    }
    if (e->stream != nullptr) deps.push_back(Dependency{e->stream, e->seq});
  }
  return enqueue(s, nullptr, std::move(deps), false);
}

cudaError_t Engine::query(Event* e) {
  counters().event_queries++;
  std::lock_guard<std::mutex> lock(mu_);
  if (e->captured) return cudaErrorCapturedEvent;
  if (e->stream == nullptr) return cudaSuccess;
  return e->stream->completed >= e->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t Engine::synchronize(Event* e) {
  counters().event_syncs++;
  std::unique_lock<std::mutex> lock(mu_);
  if (e->captured) return cudaErrorCapturedEvent;
  if (e->stream == nullptr) return cudaSuccess;
  Stream* s = e->stream;
  const std::uint64_t seq = e->seq;
  cv_.wait(lock, [&] { return s->completed >= seq; });
  return cudaSuccess;
}

cudaError_t Engine::synchronize(Stream* s) {
  counters().stream_syncs++;
  std::unique_lock<std::mutex> lock(mu_);
  if (s->destroyed) return destroyed_stream_named();
  if (s->capturing) {
    s->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  std::vector<Dependency> targets{Dependency{s, s->enqueued}};
  if (s->kind == StreamKind::Legacy) {
    for (Stream* other : streams_) {
      if (other->blocking()) targets.push_back(Dependency{other, other->enqueued});
    }
  }
  cv_.wait(lock, [&] {
    for (const Dependency& d : targets) {
      if (!done(d)) return false;
    }
    return true;
  });
  return cudaSuccess;
}

cudaError_t Engine::query(Stream* s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s->destroyed) return destroyed_stream_named();
  if (s->capturing) {
    s->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

void Engine::synchronize_streams(int device) {
  counters().device_syncs++;
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<Dependency> targets;
  for (Stream* s : streams_) {
    if (device < 0 || s->device == device) targets.push_back(Dependency{s, s->enqueued});
  }
  cv_.wait(lock, [&] {
    for (const Dependency& d : targets) {
      if (!done(d)) return false;
    }
    return true;
  });
}

cudaError_t Engine::begin_capture(Stream* s, cudaStreamCaptureMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s->kind == StreamKind::Legacy) return cudaErrorStreamCaptureUnsupported;
  if (s->capturing) return cudaErrorIllegalState;
  s->capturing = true;
  s->invalidated = false;
  s->capture_mode = mode;
  s->capture_thread = std::this_thread::get_id();
  s->capture_graph = nullptr;
  s->captured_nodes = 0;
  counters().captures_begun++;
  return cudaSuccess;
}

cudaError_t Engine::end_capture(Stream* s, bool* valid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!s->capturing) return cudaErrorIllegalState;
  // CUDA's rule: only the beginning thread may end a capture that is not
  // relaxed. CUDA 13 on an H200 refuses the end and ends the capture, its
  // graph lost (the beginning thread's end is then cudaErrorIllegalState);
  // SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE=1 keeps it going instead.
  static const bool keeps_capture = env_flag("SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE");
  if (s->capture_mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id()) {
    if (!keeps_capture) s->capturing = false;
    return cudaErrorStreamCaptureWrongThread;
  }
  s->capturing = false;
  *valid = !s->invalidated;
  if (s->invalidated) counters().captures_invalidated++;
  return s->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}

void Engine::reset_streams(int device) {
  static const bool reuse_handles = env_flag("SIMCUDA_REUSE_STREAM_HANDLES");
  std::lock_guard<std::mutex> lock(mu_);
  const std::thread::id self = std::this_thread::get_id();
  std::vector<Stream*> made;
  for (Stream* s : streams_) {
    if (s->device != device) continue;
    if (s->capturing && s->capture_mode == cudaStreamCaptureModeThreadLocal && s->capture_thread != self) {
      stale_capture_threads_.push_back(s->capture_thread);
    }
    s->capturing = false;
    if (s->kind != StreamKind::Legacy && s->kind != StreamKind::PerThread && !s->destroyed) made.push_back(s);
  }
  for (Stream* s : made) end_stream(s, reuse_handles);  // (not while walking streams_: it may leave it)
  cv_.notify_all();
}

bool Engine::stale_capture_refuses(bool device_wide) {
  if (!device_wide && t_capture_mode == cudaStreamCaptureModeRelaxed) return false;
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  return std::find(stale_capture_threads_.begin(), stale_capture_threads_.end(), self) !=
         stale_capture_threads_.end();
}

cudaStreamCaptureStatus Engine::capture_status(Stream* s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!s->capturing) return cudaStreamCaptureStatusNone;
  return s->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
}

cudaError_t Engine::check_unsafe_call() {
  if (t_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  if (stale_capture_refuses(false)) return cudaErrorStreamCaptureUnsupported;
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  bool any = false;
  for (Stream* s : streams_) {
    if (!s->capturing || s->capture_mode == cudaStreamCaptureModeRelaxed) continue;
    if (s->capture_thread == self ||
        (t_capture_mode == cudaStreamCaptureModeGlobal && s->capture_mode == cudaStreamCaptureModeGlobal)) {
      s->invalidated = true;
      any = true;
    }
  }
  return any ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t Engine::exchange_capture_mode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                          *mode != cudaStreamCaptureModeRelaxed)) {
    return cudaErrorInvalidValue;
  }
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

}  // namespace simcuda
