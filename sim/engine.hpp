// The simulated device's execution model: every stream is a queue run by its
// own worker thread, so work really is asynchronous and ordering bugs show up
// as wrong bytes. CUDA's rules are modelled: the legacy default stream waits for
// all blocking streams and they wait for it; non-blocking streams order with
// nothing; events complete when their stream reaches them; cudaStreamWaitEvent
// holds a queue; stream capture records instead of running, and the calls that
// would invalidate a real capture invalidate this one. Each device has its own
// legacy stream and per-thread streams; the legacy rule holds within a device,
// and an event is recorded only on a stream of the device it was created on.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace simcuda {

struct Stream;

// What cudaStreamCreate gives the program: its own object, not the Stream, so
// that a handle can name a new stream while the old one's work still runs
// (SIMCUDA_REUSE_STREAM_HANDLES). Never freed.
struct StreamHandle {
  std::atomic<Stream*> stream{nullptr};
};

struct Dependency {
  Stream* stream;
  std::uint64_t seq;
};

struct Op {
  std::uint64_t seq = 0;
  std::vector<Dependency> deps;
  std::function<void()> run;
  bool delayed = true;  // sleeps the configured per-operation delay first
};

enum class StreamKind { Legacy, Blocking, NonBlocking, PerThread };

struct Stream {
  StreamKind kind = StreamKind::Blocking;
  int device = 0;
  std::deque<Op> queue;
  std::uint64_t enqueued = 0;   // seq of the last op queued
  std::uint64_t completed = 0;  // seq of the last op finished
  bool worker_started = false;
  bool destroyed = false;
  // Capture state.
  bool capturing = false;
  bool invalidated = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;  // the thread that began it
  void* capture_graph = nullptr;   // cudaStreamBeginCaptureToGraph's graph, which the end returns
  std::uint64_t captured_nodes = 0;
  StreamHandle* handle = nullptr;  // null: the legacy and per-thread streams
  // Used with the engine's lock. Its worker waits on `work` for an operation
  // (or the destroy), and on each dependency's `done` for that stream's
  // progress: an operation wakes only the workers it can concern, not every
  // stream's (a program that makes a stream per task, its tasks' work
  // chained by waits, would otherwise wake every waiting worker at each
  // operation: quadratic).
  std::condition_variable work;
  std::condition_variable done;
  bool blocking() const { return kind == StreamKind::Blocking || kind == StreamKind::PerThread; }
};

struct Event {
  unsigned flags = 0;
  int device = 0;            // current when it was created
  Stream* stream = nullptr;  // of the last record; null: never recorded
  std::uint64_t seq = 0;
  bool captured = false;     // last recorded inside a capture
  // Destroyed by cudaDeviceReset. Such an event is kept (a bounded leak) so
  // that a later use is caught and counted, not a use after free.
  bool reset = false;
};

class Engine {
 public:
  static Engine& instance();  // created once, never destroyed (workers outlive exit)

  // Stream handles: 0 and cudaStreamLegacy are the legacy stream of `device`
  // (the caller's current one); with `per_thread` (a _ptsz entry point) 0
  // means the caller's per-thread stream there, as does cudaStreamPerThread.
  Stream* resolve(cudaStream_t handle, bool per_thread, int device);
  cudaStream_t create_stream(unsigned flags, int device);
  // With SIMCUDA_REUSE_STREAM_HANDLES=1 a destroyed stream's handle goes to
  // the next stream made (the most recently destroyed first), as CUDA's
  // handles, addresses the driver frees, can be.
  cudaError_t destroy_stream(Stream* s);
  // A thread's per-thread streams, as it ends: each is retired as a
  // destroyed stream is (its queued work still runs, and still orders the
  // legacy stream until done; then its worker ends).
  void retire_per_thread_streams(Stream* const* streams, std::size_t count);

  // Queues `run` on `s` behind CUDA's implicit dependencies (plus `extra`).
  // Returns an error instead when the call would break a capture.
  cudaError_t enqueue(Stream* s, std::function<void()> run, std::vector<Dependency> extra = {},
                      bool delayed = true, std::uint64_t* seq = nullptr);

  cudaError_t record(Event* e, Stream* s);
  cudaError_t wait(Stream* s, Event* e);
  cudaError_t query(Event* e);
  cudaError_t synchronize(Event* e);
  cudaError_t synchronize(Stream* s);
  cudaError_t query(Stream* s);
  // Waits for the work queued so far on every stream (of one device).
  void synchronize_all() { synchronize_streams(-1); }
  void synchronize_device(int device) { synchronize_streams(device); }

  cudaError_t begin_capture(Stream* s, cudaStreamCaptureMode mode);
  cudaError_t end_capture(Stream* s, bool* valid);
  cudaStreamCaptureStatus capture_status(Stream* s);
  // cudaDeviceReset: the streams the program made on the device are
  // destroyed (their queued work has run), the captures on its streams end.
  // A thread-local capture another thread began stays counted on that
  // thread, as CUDA 13 keeps it (seen on an H200): see stale_capture_refuses.
  void reset_streams(int device);
  // Whether this thread's host call is refused for such a capture: in its
  // own capture mode a potentially unsafe call, a cudaEventSynchronize too;
  // a cudaDeviceSynchronize even relaxed.
  bool stale_capture_refuses(bool device_wide);
  // Calls CUDA calls "potentially unsafe" (cudaMalloc, cudaFree, ...) are
  // refused, and invalidate the capture that forbids them, by CUDA's rule:
  // none is forbidden to a thread in the relaxed mode; otherwise the
  // thread's own capture forbids them (unless begun relaxed), and in the
  // global mode (the default) so does another thread's global-mode capture.
  cudaError_t check_unsafe_call();
  // cudaThreadExchangeStreamCaptureMode: this thread's mode.
  cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode);

 private:
  Engine();
  void start_worker(Stream* s);
  void work(Stream* s);
  bool done(const Dependency& d) const { return d.stream->completed >= d.seq; }
  void invalidate_captures_blocked_by_legacy(int device);
  void synchronize_streams(int device);  // -1: all devices

  std::mutex mu_;
  std::condition_variable cv_;  // host waits: any operation completed
  // Every stream that may still matter to another: alive, or destroyed with
  // work queued. A destroyed stream leaves once drained, for drained_ (its
  // object stays, never freed: events and dependencies may still name it),
  // so that a program whose threads or tasks each make a stream does not
  // make every legacy-stream operation walk all the streams it ever made.
  // Counted in counters().streams_tracked. Changed with mu_ held:
  std::vector<Stream*> streams_;
  std::vector<Stream*> drained_;
  void track(Stream* s);
  void forget_drained(Stream* s);
  // Marks s destroyed (a destroy, a reset, a thread's end): its queued work
  // still runs, then its worker leaves; its handle goes to the next stream
  // made where give_handle_again. The caller wakes cv_ after.
  void end_stream(Stream* s, bool give_handle_again);
  std::vector<Stream*> legacy_;  // per device
  std::vector<StreamHandle*> free_handles_;  // destroyed streams', to give again
  std::vector<std::thread::id> stale_capture_threads_;  // see reset_streams
  std::uint64_t delay_us_;
};

}  // namespace simcuda
