// What the capture programs share: captures begun and ended, and the ways a
// capture goes without its thread's end.
#pragma once

#include <thread>

#include "common.hpp"

namespace capture_test {

inline void noop(void*) {}

// Ends the capture on `stream`; false (said on stderr) when it was invalidated.
// A capture into a graph the program made ends with that graph.
inline bool ended_valid(cudaStream_t stream, cudaGraph_t into = nullptr) {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess || graph == nullptr) {
    std::fprintf(stderr, "capture: the capture was invalidated (%s)\n", cudaGetErrorName(end));
    return false;
  }
  if (into != nullptr) EXPECT(graph == into);
  CHECK_CUDA(cudaGraphDestroy(graph));
  return true;
}

// A capture in `mode` (global: CUDA's default) on a new non-blocking stream,
// with one node in it.
inline cudaStream_t capturing_stream(cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal) {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(s, mode));
  CHECK_CUDA(cudaLaunchHostFunc(s, noop, nullptr));
  return s;
}

// A thread-local capture this thread began, ended by another thread, which
// CUDA refuses. Returns the refused end's error.
inline cudaError_t end_elsewhere(cudaStream_t capturing) {
  cudaError_t refused = cudaSuccess;
  std::thread([&] {
    cudaGraph_t graph = nullptr;
    refused = cudaStreamEndCapture(capturing, &graph);
    if (refused == cudaSuccess && graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
  }).join();
  return refused;
}

inline const char* capture_status_name(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &status) != cudaSuccess) return "unknown";
  return status == cudaStreamCaptureStatusNone ? "none" : status == cudaStreamCaptureStatusActive ? "active" : "invalidated";
}

// A thread that begins a global-mode capture of its per-thread stream, and ends.
inline void thread_ending_in_capture() {
  std::thread([] {
    CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal));
    CHECK_CUDA(cudaLaunchHostFunc(cudaStreamPerThread, noop, nullptr));
  }).join();
}

}  // namespace capture_test
