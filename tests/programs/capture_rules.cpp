// What the runtime does with captures, run without gpupool: the simulated
// runtime must answer as CUDA 13 did on an H200 (gpu-check.sh runs the same
// modes on a GPU to see that CUDA still does). The first argument names the
// rule:
//   rules              an unsafe call (cudaMalloc) during a capture is refused,
//                      and invalidates it, as CUDA's capture modes say
//   wrong-thread-rules a thread-local capture's end on another thread: its
//                      answer, the capture's status after it, and the
//                      beginning thread's end then (JSON); exits 1 unless
//                      they are CUDA 13's, the simulated runtime's by
//                      default (refused, none, cudaErrorIllegalState)
//   gone-rules         a capture ends with its stream, with the thread whose
//                      per-thread stream it captures, and with its device's
//                      reset (unless the runtime refuses the destroy or the
//                      reset): a cudaMalloc then, which a global-mode capture
//                      forbids, is not refused. Prints each way's results as
//                      JSON; exits 1 if a capture outlived its end
//   reset-elsewhere-rules  a thread-local capture begun on this thread, whose
//                      device another thread resets; then this thread's host
//                      waits (an event on the legacy stream, the device), in
//                      its own capture mode and relaxed, and a cudaMalloc
//                      (JSON); exits 1 unless they are CUDA 13's (the capture
//                      stays counted on this thread: all refused but a
//                      relaxed event wait)
#include <string>

#include "capture_common.hpp"
#include "common.hpp"

namespace {

using namespace capture_test;

int wrong_thread_rules() {
  cudaStream_t t = capturing_stream(cudaStreamCaptureModeThreadLocal);
  const cudaError_t refused = end_elsewhere(t);
  const char* status = capture_status_name(t);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(t, &graph);
  if (end == cudaSuccess && graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
  (void)cudaGetLastError();
  CHECK_CUDA(cudaStreamDestroy(t));
  std::printf("{\"end elsewhere\": \"%s\", \"status after\": \"%s\", \"end\": \"%s\"}\n",
              cudaGetErrorName(refused), status, cudaGetErrorName(end));
  // What CUDA 13 did on an H200, and the simulated runtime does by default.
  return refused == cudaErrorStreamCaptureWrongThread && std::strcmp(status, "none") == 0 &&
                 end == cudaErrorIllegalState
             ? 0
             : 1;
}

// A capture begun in `capture_mode`, and one cudaMalloc during it from a
// thread in `caller_mode`: this thread or another. Whether the capture survives.
bool survives(cudaStreamCaptureMode capture_mode, bool same_thread, cudaStreamCaptureMode caller_mode) {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(s, capture_mode));
  CHECK_CUDA(cudaLaunchHostFunc(s, noop, nullptr));
  auto call = [caller_mode] {
    cudaStreamCaptureMode mode = caller_mode;
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    void* p = nullptr;
    if (cudaMalloc(&p, 1 << 20) == cudaSuccess) {
      CHECK_CUDA(cudaFree(p));
    } else {
      cudaGetLastError();
    }
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  };
  if (same_thread) {
    call();
  } else {
    std::thread(call).join();
  }
  cudaGraph_t graph = nullptr;
  const bool valid = cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr;
  if (valid) CHECK_CUDA(cudaGraphDestroy(graph));
  cudaGetLastError();
  CHECK_CUDA(cudaStreamDestroy(s));
  return valid;
}

int rules() {
  const cudaStreamCaptureMode global = cudaStreamCaptureModeGlobal, local = cudaStreamCaptureModeThreadLocal,
                              relaxed = cudaStreamCaptureModeRelaxed;
  EXPECT(!survives(global, false, global));  // a global capture forbids every thread...
  EXPECT(survives(global, false, relaxed));   // ...but one in the relaxed mode
  EXPECT(survives(global, true, relaxed));
  EXPECT(!survives(global, true, global));
  EXPECT(survives(local, false, global));  // a thread-local capture forbids its own thread only
  EXPECT(!survives(local, true, global));
  EXPECT(survives(relaxed, true, global));  // a relaxed capture forbids nothing
  std::printf("capture: the simulated runtime follows CUDA's capture modes\n");
  return 0;
}

int gone_rules() {
  // A cudaMalloc, which a global-mode capture still under way would refuse.
  auto unsafe_call = [] {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, 1 << 20);
    if (err == cudaSuccess) CHECK_CUDA(cudaFree(p));
    (void)cudaGetLastError();
    return err;
  };
  bool outlived = false;
  std::printf("{");
  for (const char* how : {"stream", "thread", "reset"}) {
    cudaError_t end = cudaSuccess;  // the destroy's or the reset's answer
    cudaStream_t s = nullptr;
    if (std::strcmp(how, "thread") == 0) {
      thread_ending_in_capture();
    } else {
      s = capturing_stream();
      end = std::strcmp(how, "stream") == 0 ? cudaStreamDestroy(s) : cudaDeviceReset();
      (void)cudaGetLastError();
    }
    const cudaError_t after = unsafe_call();
    if (end == cudaSuccess && after != cudaSuccess) outlived = true;
    if (end != cudaSuccess) {  // refused: the capture goes on, and is ended here
      cudaGraph_t graph = nullptr;
      if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
      (void)cudaGetLastError();
    }
    std::printf("%s\"%s\": {\"end\": \"%s\", \"cudaMalloc after\": \"%s\"}", how[0] == 's' ? "" : ", ", how,
                cudaGetErrorName(end), cudaGetErrorName(after));
  }
  std::printf("}\n");
  if (outlived) std::fprintf(stderr, "capture: a capture outlived its stream, thread or device reset\n");
  return outlived ? 1 : 0;
}

std::string host_waits_answer(const std::string& event, const std::string& device) {
  return "{\"cudaEventSynchronize\": \"" + event + "\", \"cudaDeviceSynchronize\": \"" + device + "\"}";
}

// A host wait's answer on this thread: an event recorded on the legacy
// stream and waited for, and the whole device.
std::string host_waits() {
  cudaEvent_t e = nullptr;
  cudaError_t event = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (event == cudaSuccess) event = cudaEventRecord(e, nullptr);
  if (event == cudaSuccess) event = cudaEventSynchronize(e);
  if (e != nullptr) (void)cudaEventDestroy(e);
  (void)cudaGetLastError();
  const cudaError_t device = cudaDeviceSynchronize();
  (void)cudaGetLastError();
  return host_waits_answer(cudaGetErrorName(event), cudaGetErrorName(device));
}

// A thread-local capture begun here, whose device another thread resets:
// the host waits on this thread afterwards, in its own capture mode and
// relaxed (gpupool's waits need them), and a cudaMalloc.
int reset_elsewhere_rules() {
  cudaStream_t s = capturing_stream(cudaStreamCaptureModeThreadLocal);
  cudaError_t reset = cudaSuccess;
  std::thread([&] { reset = cudaDeviceReset(); }).join();
  const std::string own = host_waits();
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  const std::string relaxed = host_waits();
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  const cudaError_t malloc_after = cudaMalloc(&p, 1 << 20);
  if (malloc_after == cudaSuccess) CHECK_CUDA(cudaFree(p));
  (void)cudaGetLastError();
  (void)s;  // destroyed by the reset
  std::printf("{\"reset\": \"%s\", \"own mode\": %s, \"relaxed\": %s, \"cudaMalloc\": \"%s\"}\n",
              cudaGetErrorName(reset), own.c_str(), relaxed.c_str(), cudaGetErrorName(malloc_after));
  // What CUDA 13 did on an H200, and the simulated runtime does: the capture
  // stays counted on this thread. Its own waits and cudaMalloc are refused;
  // relaxed, an event's wait goes through, the device's not.
  const std::string refused = "cudaErrorStreamCaptureUnsupported";
  const bool cuda13 = reset == cudaSuccess && own == host_waits_answer(refused, refused) &&
                      relaxed == host_waits_answer("cudaSuccess", refused) &&
                      malloc_after == cudaErrorStreamCaptureUnsupported;
  return cuda13 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "rules") == 0) return rules();
  if (argc > 1 && std::strcmp(argv[1], "wrong-thread-rules") == 0) return wrong_thread_rules();
  if (argc > 1 && std::strcmp(argv[1], "gone-rules") == 0) return gone_rules();
  if (argc > 1 && std::strcmp(argv[1], "reset-elsewhere-rules") == 0) return reset_elsewhere_rules();
  std::fprintf(stderr, "usage: capture_rules rules|wrong-thread-rules|gone-rules|reset-elsewhere-rules\n");
  return 2;
}
