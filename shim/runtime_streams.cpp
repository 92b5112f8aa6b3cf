// The runtime's books of streams: which device each belongs to, introducing
// them to the pools (those created where gpupool could not see them too),
// their destruction, the end of a thread's per-thread stream, and captures.
#include <pthread.h>

#include <iterator>
#include <utility>

#include "shim/messages.hpp"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {
// The devices this thread's per-thread stream was introduced to, a bit each.
// Trivially destructible, so the hot path's check is one thread-local load.
thread_local std::uint64_t t_stream_devices = 0;
// The devices where its per-thread stream ended once already (used again
// since, from a pthread key's destructor that ran after gpupool's).
thread_local std::uint64_t t_stream_ended_devices = 0;

// Ends the thread's per-thread stream in the pools when the thread ends (see
// Runtime::thread_ending): the destructor of a pthread key, not of a
// thread_local, because glibc runs key destructors after every thread_local
// destructor. A program's thread_local made before the thread's first CUDA
// call is destroyed after any thread_local of gpupool's made at that call,
// and may free on the per-thread stream then: the stream would come back,
// for good. A later use still (another key's destructor) sets the key again,
// and the destructor runs once more.
void end_thread_stream(void*) {
  if (Runtime* rt = Runtime::if_started()) rt->thread_ending();
}

void arm_thread_stream_end() {
  static pthread_key_t key;
  static const bool made = pthread_key_create(&key, end_thread_stream) == 0;
  if (made) pthread_setspecific(key, &key);  // any value but null; failing, the stream stays in the books
}
}  // namespace

int Runtime::device_of(StreamId stream) {
  if (stream == kLegacyStream || is_per_thread_id(stream)) return current_device();
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    const auto& streams = streams_locked();
    auto it = streams.find(stream);
    if (it != streams.end()) return it->second;
  }
  // A stream made where gpupool could not see it (through the driver, by a
  // library with a runtime of its own) may belong to a device other than the
  // current one, whose memory the runtime would give it: its own device where
  // the runtime can tell (CUDA 12.8 and later; the static runtime's table asks
  // the stream's context). An error the program had pending stays pending.
  int dev = -1;
  if (!one_device_.load(std::memory_order_relaxed) && real().cudaStreamGetDevice != nullptr &&
      internal([&](const RealCuda& r) {
        return r.cudaStreamGetDevice(reinterpret_cast<cudaStream_t>(stream), &dev);
      }) == cudaSuccess &&
      dev >= 0 && dev < kMaxDevices) {
    return dev;
  }
  return current_device();
}

constinit thread_local LastStream t_last_stream{0, 0, 0};

int Runtime::prepare_new_stream(StreamId stream) {
  if (stream == kLegacyStream) return current_device();  // always known
  if (is_per_thread_id(stream)) {
    const int dev = current_device();
    ensure_known(stream, dev);
    return dev;
  }
  const std::uint64_t generation = streams_generation_.load(std::memory_order_acquire);
  const int dev = device_of(stream);
  if (!ensure_known(stream, dev)) return kNoSuchStream;
  t_last_stream = LastStream{stream, dev, generation};
  return dev;
}

std::unordered_map<StreamId, int>& Runtime::streams_locked() {
  if (parents_streams_) {
    stream_devices_.clear();
    parents_streams_ = false;
  }
  return stream_devices_;
}

void Runtime::stream_created(cudaStream_t stream, unsigned flags) {
  const StreamId id = reinterpret_cast<StreamId>(stream);
  const int dev = current_device();
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    known = !streams_locked().insert_or_assign(id, dev).second;
  }
  streams_generation_.fetch_add(1, std::memory_order_acq_rel);
  // A handle known already: its stream was destroyed where gpupool could not
  // see it. Blocks threads keep for that stream go back first, as at a
  // destroy, for the pool to take from the new stream (see
  // DevicePool::stream_created).
  if (known && caches_.enabled()) caches_.flush_stream(id);
  introduce_stream(dev, id, flags);
}

void Runtime::introduce_stream(int dev, StreamId id, unsigned flags) {
  DeviceState& d = device(dev);
  bool ordered = true;
  {
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    ordered = d.pool->stream_created(id, (flags & cudaStreamNonBlocking) != 0 ? StreamKind::NonBlocking
                                                                               : StreamKind::Blocking);
  }
  if (!ordered) {
    message(config::LogLevel::Warn, "gpupool: device " + std::to_string(dev) +
                                        ": the runtime refused both cudaStreamWaitEvent and cudaEventSynchronize "
                                        "for a new stream: memory that cudaFree released before may still be in "
                                        "use by earlier work when used on it");
  }
}

void Runtime::move_forgotten_streams(DeviceState& d, std::vector<StreamId>* into) {
  const std::vector<StreamId> more = d.pool->take_forgotten_streams();
  into->insert(into->end(), more.begin(), more.end());
}

void Runtime::forget_device_streams(int dev) {
  // A reset destroys the streams made on the device: their handles are met
  // anew, and the runtime says whether they name a stream (one made in a
  // context of the program's own lives on) as for any handle met first.
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::erase_if(streams_locked(), [dev](const auto& entry) { return entry.second == dev; });
  }
  streams_generation_.fetch_add(1, std::memory_order_acq_rel);  // after: no thread keeps one as its last
}

void Runtime::forget_stream_handles(int dev, const std::vector<StreamId>& ids) {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    auto& streams = streams_locked();
    for (StreamId id : ids) {
      auto it = streams.find(id);
      if (it != streams.end() && it->second == dev) streams.erase(it);
    }
  }
  streams_generation_.fetch_add(1, std::memory_order_acq_rel);
  if (caches_.enabled()) {
    for (StreamId id : ids) caches_.flush_stream(id, true);
  }
}

bool Runtime::ensure_known(StreamId stream, int dev) {
  if (stream == kLegacyStream) return true;
  if (is_per_thread_id(stream)) {
    std::uint64_t& known = t_stream_devices;
    if ((known >> dev & 1u) != 0) return true;
    known |= std::uint64_t{1} << dev;
    arm_thread_stream_end();
    DeviceState& d = device(dev);
    std::lock_guard<AdaptiveMutex> lock(d.mu);
    d.pool->stream_created(stream, StreamKind::PerThread);
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (streams_locked().count(stream) != 0) return true;
  }
  // A handle gpupool has not seen made: ask its kind (taken as non-blocking,
  // which needs the most ordering, when it cannot be read; an error the
  // program had pending stays pending). Where the runtime says it names no
  // stream, it is most likely one the program destroyed: serving the call
  // from the cache would hide the program's error and keep the block under a
  // dead handle, so the runtime answers it instead.
  unsigned flags = cudaStreamNonBlocking;
  if (real().cudaStreamGetFlags != nullptr) {
    const cudaError_t err = internal([&](const RealCuda& r) {
      return r.cudaStreamGetFlags(reinterpret_cast<cudaStream_t>(stream), &flags);
    });
    if (err == cudaErrorInvalidResourceHandle) return false;
    if (err != cudaSuccess) flags = cudaStreamNonBlocking;
  }
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (!streams_locked().emplace(stream, dev).second) return true;  // another thread introduced it meanwhile
  }
  introduce_stream(dev, stream, flags);
  return true;
}

int Runtime::stream_destroying(cudaStream_t stream) {
  const StreamId id = reinterpret_cast<StreamId>(stream);
  int dev = -1;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    auto& streams = streams_locked();
    auto it = streams.find(id);
    if (it == streams.end()) return -1;
    dev = it->second;
    streams.erase(it);
  }
  streams_generation_.fetch_add(1, std::memory_order_acq_rel);
  // Blocks threads keep for this stream go back first: once it is gone, its
  // handle may name a new stream.
  if (caches_.enabled()) caches_.flush_stream(id);
  if (DeviceState* d = existing(dev)) {
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    d->pool->stream_destroy_begin(id);
  }
  return dev;
}

void Runtime::stream_destroy_answered(StreamId stream, int dev, bool destroyed) {
  DeviceState* d = existing(dev);
  if (d == nullptr) return;
  if (destroyed) {
    // Its capture ended with it (the driver ends it as cuStreamEndCapture
    // would), and no later call can name it: kept, it would forbid the pool
    // cudaFree, and keep the threads' caches aside, for good.
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    d->pool->stream_destroy_end(stream, true);
    forget_captures(*d, stream);
    return;
  }
  // Refused: the stream lives on, with its kind, counters and captures, which
  // the pool takes back; its handle is gpupool's to know again.
  std::lock_guard<std::mutex> streams_lock(streams_mu_);  // before a device's, as everywhere
  std::lock_guard<AdaptiveMutex> lock(d->mu);
  d->pool->stream_destroy_end(stream, false);
  streams_locked().emplace(stream, dev);
}

void Runtime::forget_captures(DeviceState& d, StreamId stream) {
  std::size_t kept = 0;
  for (const DeviceState::Capture& c : d.captures) {
    if (stream != kAnyStream && c.stream != stream) {
      d.captures[kept++] = c;
      continue;
    }
    uncount_capture(c);
    if (d.pool->is_capturing(c.stream)) d.pool->capture_ended(c.stream);
  }
  d.captures.resize(kept);
}

void Runtime::thread_ending() {
  unsafe_call_rules_.thread_ending();  // nothing can be owed to it any more
  const std::uint64_t devices = std::exchange(t_stream_devices, 0);
  // (Key destructors run at a thread's end, not at the process's exit: the
  // main thread's stream stays in the report unless it calls pthread_exit,
  // and then it has ended like any other.)
  if (devices == 0 || bypass()) return;
  caches_.end_this_thread();  // its blocks kept for the stream go back first
  const StreamId id = this_thread_stream();
  const std::uint64_t ended_before = std::exchange(t_stream_ended_devices, t_stream_ended_devices | devices);
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    DeviceState* d = (devices >> dev & 1u) != 0 ? existing(dev) : nullptr;
    if (d == nullptr) continue;
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    // A capture left open on its stream can no longer be ended (another
    // thread names its own stream with the same handle).
    forget_captures(*d, id);
    d->pool->thread_stream_ended(id, (ended_before >> dev & 1u) != 0);
  }
}

void Runtime::capture_began(StreamId stream, cudaStreamCaptureMode mode) {
  // The stream is introduced to the pool first: one it met only later (a
  // thread's per-thread stream, a stream made where gpupool could not see
  // it) would start afresh there and forget its capture.
  // A handle the runtime says names no stream is its to refuse; were the
  // begin taken all the same, the pool keeps its capture on the current
  // device, as for any stream it meets first in a capture.
  int dev = prepare_stream(stream);
  if (dev == kNoSuchStream) dev = current_device();
  captures_active_.fetch_add(1, std::memory_order_relaxed);
  unsafe_call_rules_.capture_began(mode);
  // Its thread's end unlists it from the rules (it may never end the capture).
  if (mode == cudaStreamCaptureModeThreadLocal) arm_thread_stream_end();
  DeviceState& d = device(dev);
  std::lock_guard<AdaptiveMutex> lock(d.mu);
  d.pool->capture_began(stream);
  d.captures.push_back(DeviceState::Capture{stream, mode, this_thread_stream()});
}

void Runtime::uncount_capture(const DeviceState::Capture& c) {
  captures_active_.fetch_sub(1, std::memory_order_relaxed);
  unsafe_call_rules_.capture_ended(c.mode, c.thread);
}

bool Runtime::still_capturing(StreamId stream) { return device(device_of(stream)).upstream.capturing(stream); }

void Runtime::capture_ended(StreamId stream) {
  DeviceState& d = device(device_of(stream));
  std::lock_guard<AdaptiveMutex> lock(d.mu);
  d.pool->capture_ended(stream);
  // The latest record for the stream: a begin the runtime refused is undone
  // right after it was made.
  for (auto it = d.captures.rbegin(); it != d.captures.rend(); ++it) {
    if (it->stream != stream) continue;
    uncount_capture(*it);
    d.captures.erase(std::next(it).base());
    break;
  }
}

}  // namespace gpupool::shim
