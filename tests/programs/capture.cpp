// Stream capture with gpupool underneath: stream-ordered allocations inside the
// capture go to the runtime (they become graph nodes), nothing gpupool does
// invalidates the capture, and the pool serves the stream again afterwards.
// What the runtime itself does with captures, without gpupool, is
// capture_rules.cpp's.
//   capture            allocations on the capturing stream
//   capture to-graph   the same, captured into a graph the program made
//                      (cudaStreamBeginCaptureToGraph)
//   capture threads    the same, after a second thread's stream-ordered call
//                      has turned gpupool's per-thread caches on
//   capture default-stream  the same on stream 0, for test-capture-ptds only:
//                      there it is the thread's per-thread default stream,
//                      which may capture (the legacy stream may not)
//   capture driver HOW LIBRARY [to-graph|default-stream|v1]  the same, the
//                      capture begun and ended with the driver's calls
//                      (cuStreamBeginCapture, cuStreamBeginCaptureToGraph,
//                      cuStreamEndCapture; the per-thread versions in
//                      test-capture-ptds) reached as HOW says
//                      (driver_ways.hpp, or driver-linked); v1: the begin's
//                      first version (no mode), not linked; first (for
//                      test-capture-ptds only): the thread's default stream
//                      captured with the process's first CUDA call, before
//                      gpupool has started
//   capture new-thread for test-capture-ptds only: a thread whose per-thread
//                      default stream gpupool has not met yet captures it
//                      first thing, with a stream-ordered and a plain pair
//                      inside
//   capture others     while a blocking stream captures (global mode), another
//                      stream asks for memory freed on the legacy stream, with
//                      plain cudaFree and on a third stream, its work still
//                      queued (run with SIMCUDA_OP_DELAY_US): gpupool must not
//                      touch the legacy stream, which would break the capture,
//                      and may grow only as a capture allows; the third
//                      stream's 16 MiB may serve after a device-side wait
//   capture other-device global|thread-local|relaxed same-thread|other-thread
//                      (2 devices, 64 MiB each) device 0's cache holds the
//                      only room for a stream-ordered request made while a
//                      stream of device 1 captures in that mode, begun on this
//                      thread or another: gpupool gives it back only if the
//                      capture allows this thread a cudaFree (a global one
//                      forbids it to all threads, a thread-local one to its
//                      own); prints the request's result during and after the
//                      capture as JSON
//   capture wrong-thread-end  (64 MiB) a thread-local capture begun here,
//                      whose end another thread calls, which the runtime
//                      refuses (CUDA's rule). CUDA ends the capture all the
//                      same: a stream-ordered request on its stream is the
//                      pool's, a request only the cache can serve succeeds,
//                      and this thread's end is refused. Where the capture
//                      goes on instead (SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE=1),
//                      the request on its stream is the graph's, and the
//                      other fails here until the capture is ended here
//                      (validly). Prints the refused end's error, the
//                      capture's status after it and the requests' results
//                      as JSON
//   capture plain      a plain cudaMalloc/cudaFree pair while a stream captures
//                      in global mode: gpupool serves it from memory it maps
//                      and calls nothing the capture forbids (so, with
//                      free_synchronizes:1, no device synchronization)
//   capture gone stream|thread|reset|stream-elsewhere|reset-elsewhere|refused
//                      (64 MiB) a capture that is never ended: its stream is
//                      destroyed (stream), its thread ends (thread: the
//                      thread's per-thread default stream), or its device is
//                      reset (reset); a thread-local one begun on this thread
//                      whose stream another thread destroys, or whose device
//                      it resets (stream-elsewhere, reset-elsewhere); or the runtime
//                      refuses to destroy its stream (refused: run with
//                      SIMCUDA_REFUSE_CAPTURING_DESTROY=1), which captures
//                      on: a stream-ordered request on it goes to the
//                      runtime, and the capture is then ended. Afterwards a
//                      request that only the cache can serve: gpupool may
//                      give the cache back only if it knows the capture gone.
//                      Prints that request's result as JSON
//   capture refused-destroy  (run with SIMCUDA_REFUSE_CAPTURING_DESTROY=1) a
//                      blocking stream makes two stream-ordered pairs (a reuse
//                      on it), captures, and the runtime refuses to destroy it;
//                      the capture is ended, then the stream makes another
//                      pair and plain pairs make device barriers. The stream is
//                      left alive; prints its handle as JSON
//   capture refused    captures the runtime refuses to begin, on the legacy
//                      stream and on a stream already capturing: once the one
//                      capture begun has ended, the pool serves both streams'
//                      requests from memory freed on them again
#include <string>

#include "capture_common.hpp"
#include "common.hpp"
#include "driver_ways.hpp"

// The driver's capture calls the driver-linked mode calls, weak: the
// simulated runtime is the driver too and defines them, a real runtime does
// not, and this build runs on a real one in gpu-check (its other modes),
// where a strong reference would stop it at its start ("undefined symbol").
#pragma weak cuStreamBeginCapture_v2
#pragma weak cuStreamBeginCapture_v2_ptsz
#pragma weak cuStreamBeginCaptureToGraph
#pragma weak cuStreamBeginCaptureToGraph_ptsz
#pragma weak cuStreamEndCapture
#pragma weak cuStreamEndCapture_ptsz

namespace {

using namespace capture_test;

int others() {
  cudaStream_t capturing = nullptr, asking = nullptr, freed_on = nullptr;
  CHECK_CUDA(cudaStreamCreate(&capturing));
  CHECK_CUDA(cudaStreamCreateWithFlags(&asking, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&freed_on, cudaStreamNonBlocking));
  void* on_stream = nullptr;
  CHECK_CUDA(cudaMallocAsync(&on_stream, 16 << 20, freed_on));
  CHECK_CUDA(cudaMemsetAsync(on_stream, 1, 16 << 20, freed_on));
  CHECK_CUDA(cudaFreeAsync(on_stream, freed_on));
  void* on_legacy = nullptr;
  CHECK_CUDA(cudaMallocAsync(&on_legacy, 4 << 20, nullptr));
  CHECK_CUDA(cudaMemsetAsync(on_legacy, 1, 4 << 20, nullptr));
  CHECK_CUDA(cudaFreeAsync(on_legacy, nullptr));
  void* plain = nullptr;
  CHECK_CUDA(cudaMalloc(&plain, 4 << 20));
  CHECK_CUDA(cudaMemsetAsync(plain, 2, 4 << 20, nullptr));
  CHECK_CUDA(cudaFree(plain));

  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaLaunchHostFunc(capturing, noop, nullptr));
  void* got[4] = {};
  for (void*& p : got) {
    CHECK_CUDA(cudaMallocAsync(&p, 4 << 20, asking));
    CHECK_CUDA(cudaMemsetAsync(p, 3, 4 << 20, asking));
  }
  for (void* p : got) CHECK_CUDA(cudaFreeAsync(p, asking));
  if (!ended_valid(capturing)) return 1;
  CHECK_CUDA(cudaStreamSynchronize(asking));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaStreamDestroy(asking));
  CHECK_CUDA(cudaStreamDestroy(freed_on));
  std::printf("capture: valid while other streams allocated\n");
  return 0;
}
int other_device(cudaStreamCaptureMode mode, bool other_thread) {
  cudaStream_t capturing = nullptr, asking = nullptr;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&asking, cudaStreamNonBlocking));
  void* cached = nullptr;
  void* live = nullptr;
  CHECK_CUDA(cudaMalloc(&cached, 40 << 20));
  CHECK_CUDA(cudaMalloc(&live, 12 << 20));
  CHECK_CUDA(cudaFree(cached));
  // The capture, begun and ended on this thread, or on another that holds it
  // open while this one asks.
  bool valid = false;
  auto begin = [&] {
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaStreamBeginCapture(capturing, mode));
    CHECK_CUDA(cudaLaunchHostFunc(capturing, noop, nullptr));
  };
  auto end = [&] {
    CHECK_CUDA(cudaSetDevice(1));
    valid = ended_valid(capturing);
  };
  std::atomic<int> step{0};
  std::thread holder;
  if (other_thread) {
    holder = std::thread([&] {
      begin();
      step = 1;
      while (step.load() != 2) std::this_thread::yield();
      end();
    });
    while (step.load() != 1) std::this_thread::yield();
  } else {
    begin();
  }
  CHECK_CUDA(cudaSetDevice(0));
  void* during = nullptr;
  const cudaError_t err_during = cudaMallocAsync(&during, 48 << 20, asking);
  if (err_during != cudaSuccess) EXPECT(cudaGetLastError() == err_during);
  if (other_thread) {
    step = 2;
    holder.join();
  } else {
    end();
  }
  if (!valid) return 1;
  CHECK_CUDA(cudaSetDevice(0));
  if (err_during == cudaSuccess) CHECK_CUDA(cudaFreeAsync(during, asking));
  void* after = nullptr;
  const cudaError_t err_after = cudaMallocAsync(&after, 48 << 20, asking);
  if (err_after == cudaSuccess) CHECK_CUDA(cudaFreeAsync(after, asking));
  CHECK_CUDA(cudaFree(live));
  CHECK_CUDA(cudaStreamSynchronize(asking));
  CHECK_CUDA(cudaStreamDestroy(asking));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  std::printf("{\"during\": \"%s\", \"after\": \"%s\"}\n", cudaGetErrorName(err_during), cudaGetErrorName(err_after));
  return 0;
}

// A stream-ordered pair on `s`: the runtime's (the graph's, on a capturing
// stream) or the pool's, as the simulated runtime's count shows.
void stream_ordered_pair(cudaStream_t s, bool the_graphs) {
  simcuda_counters c0{};
  const bool sim = testprog::sim_counters(&c0);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, s));
  CHECK_CUDA(cudaFreeAsync(p, s));
  if (sim) {
    simcuda_counters c1{};
    testprog::sim_counters(&c1);
    EXPECT(c1.malloc_async_calls - c0.malloc_async_calls == (the_graphs ? 1u : 0u));
  }
}

int wrong_thread_end() {
  void* cached = nullptr;
  void* live = nullptr;
  CHECK_CUDA(cudaMalloc(&cached, 40 << 20));
  CHECK_CUDA(cudaMalloc(&live, 12 << 20));
  CHECK_CUDA(cudaFree(cached));
  cudaStream_t t = capturing_stream(cudaStreamCaptureModeThreadLocal);
  const cudaError_t refused = end_elsewhere(t);
  const char* status = capture_status_name(t);
  const bool going = std::strcmp(status, "active") == 0;
  // Still capturing, a request on its stream is the graph's; ended by the
  // refusal (CUDA's answer), the pool's again...
  stream_ordered_pair(t, going);
  // ...and while it goes on it forbids this thread cudaFree: only the cache has room.
  void* during = nullptr;
  const cudaError_t err_during = cudaMalloc(&during, 48 << 20);
  if (err_during == cudaSuccess) CHECK_CUDA(cudaFree(during));
  (void)cudaGetLastError();
  if (going) {
    if (!ended_valid(t)) return 1;
  } else {
    cudaGraph_t graph = nullptr;
    EXPECT(cudaStreamEndCapture(t, &graph) == cudaErrorIllegalState);
    (void)cudaGetLastError();
  }
  void* after = nullptr;
  const cudaError_t err_after = cudaMalloc(&after, 48 << 20);
  if (err_after == cudaSuccess) CHECK_CUDA(cudaFree(after));
  CHECK_CUDA(cudaFree(live));
  CHECK_CUDA(cudaStreamDestroy(t));
  std::printf("{\"end elsewhere\": \"%s\", \"status after\": \"%s\", \"during\": \"%s\", \"after\": \"%s\"}\n",
              cudaGetErrorName(refused), status, cudaGetErrorName(err_during), cudaGetErrorName(err_after));
  return 0;
}

int plain() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaLaunchHostFunc(s, noop, nullptr));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaFree(p));
  if (!ended_valid(s)) return 1;
  CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("capture: valid across a plain pair\n");
  return 0;
}
int new_thread() {
  void* warm = nullptr;  // the pool's memory exists; this thread's stream is not known to it
  CHECK_CUDA(cudaMalloc(&warm, 1 << 20));
  CHECK_CUDA(cudaFree(warm));
  simcuda_counters c0{};
  const bool sim = testprog::sim_counters(&c0);
  bool valid = false;
  std::thread([&] {
    CHECK_CUDA(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal));
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, nullptr));
    CHECK_CUDA(cudaLaunchHostFunc(nullptr, noop, nullptr));
    CHECK_CUDA(cudaFreeAsync(p, nullptr));
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    valid = ended_valid(nullptr);
  }).join();
  if (!valid) return 1;
  if (sim) {
    simcuda_counters c1{};
    testprog::sim_counters(&c1);
    EXPECT(c1.malloc_async_calls - c0.malloc_async_calls == 1);  // the captured one is the graph's
  }
  std::printf("capture: valid on a per-thread stream met first inside it\n");
  return 0;
}

int gone(const char* how) {
  if (std::strcmp(how, "thread") == 0) {
    thread_ending_in_capture();
  } else if (std::strcmp(how, "stream-elsewhere") == 0 || std::strcmp(how, "reset-elsewhere") == 0) {
    // Begun here in the thread-local mode, which forbids this thread alone.
    cudaStream_t s = capturing_stream(cudaStreamCaptureModeThreadLocal);
    const bool reset = how[0] == 'r';
    std::thread([s, reset] { CHECK_CUDA(reset ? cudaDeviceReset() : cudaStreamDestroy(s)); }).join();
  } else if (std::strcmp(how, "reset-refused") == 0) {
    // A reset the runtime refuses (SIMCUDA_RESET_ERROR=refused) while the
    // pool holds memory, which says so: the capture goes on.
    void* warm = nullptr;
    CHECK_CUDA(cudaMalloc(&warm, 1 << 20));
    CHECK_CUDA(cudaFree(warm));
    cudaStream_t s = capturing_stream();
    EXPECT(cudaDeviceReset() == cudaErrorNotPermitted);
    (void)cudaGetLastError();
    stream_ordered_pair(s, true);
    if (!ended_valid(s)) return 1;
    CHECK_CUDA(cudaStreamDestroy(s));
  } else {
    cudaStream_t s = capturing_stream();
    if (std::strcmp(how, "stream") == 0) {
      CHECK_CUDA(cudaStreamDestroy(s));
    } else if (std::strcmp(how, "reset") == 0) {
      // The reset may return an earlier launch's error, having reset all the
      // same (the simulated runtime's SIMCUDA_RESET_ERROR=late).
      const cudaError_t reset = cudaDeviceReset();
      EXPECT(reset == cudaSuccess || reset == cudaErrorLaunchFailure);
      (void)cudaGetLastError();
    } else {
      EXPECT(cudaStreamDestroy(s) == cudaErrorStreamCaptureUnsupported);
      (void)cudaGetLastError();
      // Still capturing: the request is the graph's, not the pool's.
      stream_ordered_pair(s, true);
      if (!ended_valid(s)) return 1;
      CHECK_CUDA(cudaStreamDestroy(s));
    }
  }
  void* cached = nullptr;
  void* live = nullptr;
  CHECK_CUDA(cudaMalloc(&cached, 40 << 20));
  CHECK_CUDA(cudaMalloc(&live, 12 << 20));
  CHECK_CUDA(cudaFree(cached));
  void* after = nullptr;
  const cudaError_t err_after = cudaMalloc(&after, 48 << 20);
  if (err_after == cudaSuccess) CHECK_CUDA(cudaFree(after));
  CHECK_CUDA(cudaFree(live));
  std::printf("{\"after\": \"%s\"}\n", cudaGetErrorName(err_after));
  return err_after == cudaSuccess ? 0 : 1;
}

int refused_destroy() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreate(&s));
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, s));
    CHECK_CUDA(cudaFreeAsync(p, s));
  }
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaLaunchHostFunc(s, noop, nullptr));
  EXPECT(cudaStreamDestroy(s) == cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  if (!ended_valid(s)) return 1;
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, s));
  CHECK_CUDA(cudaFreeAsync(p, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  // Plain blocks reused: each reuse of a freed one needs a device barrier,
  // which orders non-blocking streams only.
  for (int i = 0; i < 8; ++i) {
    void* q = nullptr;
    CHECK_CUDA(cudaMalloc(&q, 6 << 20));
    CHECK_CUDA(cudaFree(q));
  }
  std::printf("{\"stream\": \"%p\"}\n", static_cast<void*>(s));
  return 0;
}

int refused() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  EXPECT(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  (void)cudaGetLastError();
  if (!ended_valid(s)) return 1;
  // No capture is left: each request is served from the block freed before it.
  simcuda_counters c0{};
  const bool sim = testprog::sim_counters(&c0);
  void* first = nullptr;
  CHECK_CUDA(cudaMallocAsync(&first, 1 << 20, s));
  CHECK_CUDA(cudaFreeAsync(first, s));
  void* plain_first = nullptr;
  CHECK_CUDA(cudaMalloc(&plain_first, 4 << 20));
  CHECK_CUDA(cudaFree(plain_first));
  for (int i = 0; i < 4; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, s));
    EXPECT(p == first);
    CHECK_CUDA(cudaFreeAsync(p, s));
    CHECK_CUDA(cudaMalloc(&p, 4 << 20));
    EXPECT(p == plain_first);
    CHECK_CUDA(cudaFree(p));
  }
  if (sim) {
    simcuda_counters c1{};
    testprog::sim_counters(&c1);
    EXPECT(c1.malloc_async_calls == c0.malloc_async_calls);
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("capture: refused captures left nothing behind\n");
  return 0;
}
// How a capture is begun and ended: with the runtime's calls, or with the
// driver's as `how` reaches them.
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
constexpr bool kPerThread = true;
#else
constexpr bool kPerThread = false;
#endif
struct Capturer {
  using Begin = CUresult (*)(CUstream, CUstreamCaptureMode);
  using BeginV1 = CUresult (*)(CUstream);
  using BeginToGraph = CUresult (*)(CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                    CUstreamCaptureMode);
  using End = CUresult (*)(CUstream, CUgraph*);
  bool driver = false;
  Begin begin = nullptr;
  BeginV1 begin_v1 = nullptr;
  BeginToGraph begin_to_graph = nullptr;
  End end = nullptr;
};

template <typename F>
F driver_capture_call(const std::string& how, const char* name, const char* base, const char* library, int version) {
  const std::string exported = std::string(name) + (kPerThread ? "_ptsz" : "");
  const cuuint64_t flags = kPerThread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
  return reinterpret_cast<F>(testprog::driver_function(how, exported.c_str(), base, library, flags, version));
}

Capturer driver_capturer(const std::string& how, const char* library) {
  Capturer c;
  c.driver = true;
  if (how == "driver-linked") {
    c.begin = &cuStreamBeginCapture;
    c.begin_to_graph = &cuStreamBeginCaptureToGraph;
    c.end = &cuStreamEndCapture;
    return c;
  }
  c.begin = driver_capture_call<Capturer::Begin>(how, "cuStreamBeginCapture_v2", "cuStreamBeginCapture", library, 12030);
  c.begin_v1 = driver_capture_call<Capturer::BeginV1>(how, "cuStreamBeginCapture", "cuStreamBeginCapture", library, 10000);
  c.begin_to_graph = driver_capture_call<Capturer::BeginToGraph>(how, "cuStreamBeginCaptureToGraph",
                                                                 "cuStreamBeginCaptureToGraph", library, 12030);
  c.end = driver_capture_call<Capturer::End>(how, "cuStreamEndCapture", "cuStreamEndCapture", library, 12030);
  return c;
}

// Begins a global-mode capture on `s` (into `into`, given one; with the
// begin's first version, given `v1`).
void begin_capture(const Capturer& c, cudaStream_t s, cudaGraph_t into, bool v1) {
  const auto cs = reinterpret_cast<CUstream>(s);
  if (!c.driver && into != nullptr) {
    CHECK_CUDA(cudaStreamBeginCaptureToGraph(s, into, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal));
  } else if (!c.driver) {
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  } else if (into != nullptr) {
    EXPECT(c.begin_to_graph(cs, reinterpret_cast<CUgraph>(into), nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
           CUDA_SUCCESS);
  } else if (v1) {
    EXPECT(c.begin_v1(cs) == CUDA_SUCCESS);
  } else {
    EXPECT(c.begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  }
}

// Ends the capture on `s` as ended_valid does, with the driver's end for a
// driver's capture; the runtime's last error stays clean.
bool end_capture(const Capturer& c, cudaStream_t s, cudaGraph_t into) {
  if (!c.driver) return ended_valid(s, into);
  CUgraph graph = nullptr;
  const CUresult end = c.end(reinterpret_cast<CUstream>(s), &graph);
  if (end != CUDA_SUCCESS || graph == nullptr) {
    std::fprintf(stderr, "capture: the capture was invalidated (CUresult %d)\n", static_cast<int>(end));
    return false;
  }
  if (into != nullptr) EXPECT(reinterpret_cast<cudaGraph_t>(graph) == into);
  CHECK_CUDA(cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(graph)));
  EXPECT(cudaGetLastError() == cudaSuccess);
  return true;
}

// See "first" above: gpupool must learn of the capture as it begins, or it
// serves the request inside from its pool.
int driver_capture_first(const Capturer& c) {
  simcuda_counters c0{};
  const bool sim = testprog::sim_counters(&c0);
  begin_capture(c, nullptr, nullptr, false);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, nullptr));
  CHECK_CUDA(cudaFreeAsync(p, nullptr));
  if (!end_capture(c, nullptr, nullptr)) return 1;
  if (sim) {
    simcuda_counters c1{};
    testprog::sim_counters(&c1);
    EXPECT(c1.malloc_async_calls - c0.malloc_async_calls == 1);
    EXPECT(c1.captures_invalidated == 0);
  }
  std::printf("capture: valid, allocations inside went to the runtime\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "others") == 0) return others();
  if (argc > 1 && std::strcmp(argv[1], "refused") == 0) return refused();
  if (argc > 1 && std::strcmp(argv[1], "refused-destroy") == 0) return refused_destroy();
  if (argc > 2 && std::strcmp(argv[1], "gone") == 0) return gone(argv[2]);
  if (argc > 1 && std::strcmp(argv[1], "new-thread") == 0) return new_thread();
  if (argc > 1 && std::strcmp(argv[1], "plain") == 0) return plain();
  if (argc > 3 && std::strcmp(argv[1], "other-device") == 0) {
    const cudaStreamCaptureMode mode = std::strcmp(argv[2], "global") == 0         ? cudaStreamCaptureModeGlobal
                                       : std::strcmp(argv[2], "thread-local") == 0 ? cudaStreamCaptureModeThreadLocal
                                                                                   : cudaStreamCaptureModeRelaxed;
    return other_device(mode, std::strcmp(argv[3], "other-thread") == 0);
  }
  if (argc > 1 && std::strcmp(argv[1], "wrong-thread-end") == 0) return wrong_thread_end();
  Capturer capturer;
  if (argc > 3 && std::strcmp(argv[1], "driver") == 0) {
    capturer = driver_capturer(argv[2], argv[3]);
    argv += 3;  // its variant, if any, in argv[1]
    argc -= 3;
    if (kPerThread && argc > 1 && std::strcmp(argv[1], "first") == 0) return driver_capture_first(capturer);
  }
  const bool v1 = argc > 1 && std::strcmp(argv[1], "v1") == 0;
  const bool to_graph = argc > 1 && std::strcmp(argv[1], "to-graph") == 0;
  if (argc > 1 && std::strcmp(argv[1], "threads") == 0) {
    std::thread([] {
      cudaStream_t own;
      void* p = nullptr;
      CHECK_CUDA(cudaStreamCreate(&own));
      CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, own));
      CHECK_CUDA(cudaFreeAsync(p, own));
      CHECK_CUDA(cudaStreamSynchronize(own));
      CHECK_CUDA(cudaStreamDestroy(own));
    }).join();
  }
  // A blocking stream: legacy-stream work would break its capture.
  const bool default_stream = argc > 1 && std::strcmp(argv[1], "default-stream") == 0;
  cudaStream_t s = nullptr;
  if (!default_stream) CHECK_CUDA(cudaStreamCreate(&s));
  // Warm the pool and leave frees that a barrier would normally cover.
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
  }
  void* before = nullptr;
  CHECK_CUDA(cudaMallocAsync(&before, 1 << 20, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaMemPool_t default_pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, 0));
  simcuda_counters c0{};
  const bool sim = testprog::sim_counters(&c0);

  cudaGraph_t into = nullptr;
  if (to_graph) CHECK_CUDA(cudaGraphCreate(&into, 0));
  begin_capture(capturer, s, into, v1);
  // Three by cudaMallocAsync, one by cudaMallocFromPoolAsync from the default
  // pool (a _ptsz twin in test-capture-ptds, where stream 0 is per-thread).
  void* inside[4] = {};
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaMallocAsync(&inside[i], 1 << 20, s));
  CHECK_CUDA(cudaMallocFromPoolAsync(&inside[3], 1 << 20, default_pool, s));
  CHECK_CUDA(cudaLaunchHostFunc(s, noop, nullptr));
  for (void* p : inside) CHECK_CUDA(cudaFreeAsync(p, s));
  CHECK_CUDA(cudaFreeAsync(before, s));  // a pooled block freed inside the capture
  if (!end_capture(capturer, s, into)) return 1;
  if (sim) {
    simcuda_counters c1{};
    testprog::sim_counters(&c1);
    EXPECT(c1.malloc_async_calls - c0.malloc_async_calls == 4);  // the four inside went to the runtime
    EXPECT(c1.captures_invalidated == 0);
  }
  // After the capture the pool serves the stream again.
  simcuda_counters c2{};
  testprog::sim_counters(&c2);
  void* after = nullptr;
  CHECK_CUDA(cudaMallocAsync(&after, 1 << 20, s));
  EXPECT(after != before);  // the graph frees `before` when it runs
  CHECK_CUDA(cudaFreeAsync(after, s));
  if (sim) {
    simcuda_counters c3{};
    testprog::sim_counters(&c3);
    EXPECT(c3.malloc_async_calls == c2.malloc_async_calls);
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (!default_stream) CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("capture: valid, allocations inside went to the runtime\n");
  return 0;
}
