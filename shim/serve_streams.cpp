// The streams' calls gpupool intercepts (see serve.hpp): their creation and
// destruction, and their captures (also the driver's, through the two
// *_in_books functions of driver_calls.hpp).
#include <cuda_runtime_api.h>

#include <functional>

#include "shim/driver_calls.hpp"
#include "shim/guard.hpp"
#include "shim/serve.hpp"

namespace serve {
namespace {

// The pool stops ordering on the stream before the runtime starts capturing
// it: a fence recorded there in between would join the capture, and a wait
// there would break it. If the runtime refuses, the pool takes it back.
template <typename Begin>
cudaError_t begin_capture(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, Begin&& begin) {
  Runtime& rt = Runtime::get();
  const bool tell = !rt.bypass();
  const StreamId id = stream_id(stream, per_thread);
  if (tell) rt.capture_began(id, mode);
  const cudaError_t err = begin();
  if (err != cudaSuccess && tell) keep_books("cudaStreamBeginCapture", [&] { rt.capture_ended(id); });
  return err;
}

cudaError_t end_capture(cudaStream_t stream, bool per_thread, cudaError_t err) {
  // The capture is over whatever the result (an invalidated one ends too),
  // unless the runtime refused an end on another thread than the one that
  // began it and says the capture goes on.
  Runtime& rt = Runtime::get();
  if (!rt.bypass()) {
    keep_books("cudaStreamEndCapture", [&] {
      const StreamId id = stream_id(stream, per_thread);
      if (err == cudaErrorStreamCaptureWrongThread && rt.still_capturing(id)) return;
      rt.capture_ended(id);
    });
  }
  return err;
}

}  // namespace
}  // namespace serve

namespace gpupool::shim {

cudaError_t begin_capture_in_books(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, const char* call,
                                   const std::function<cudaError_t()>& begin) {
  return guarded(call, [&] {
    enter();
    return serve::begin_capture(stream, per_thread, mode, begin);
  });
}

void end_capture_in_books(cudaStream_t stream, bool per_thread, cudaError_t err, const char* call) {
  guarded(call, [&] {
    enter();
    return serve::end_capture(stream, per_thread, err);
  });
}

}  // namespace gpupool::shim

namespace serve {

// ---------------------------------------------------------------- streams

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreate>(stream);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreate", [&] { rt.stream_created(*stream, cudaStreamDefault); });
  }
  return err;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreateWithFlags>(stream, flags);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreateWithFlags", [&] { rt.stream_created(*stream, flags); });
  }
  return err;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  Runtime& rt = enter();
  const cudaError_t err = pass_on<&RealCuda::cudaStreamCreateWithPriority>(stream, flags, priority);
  if (err == cudaSuccess && !rt.bypass()) {
    keep_books("cudaStreamCreateWithPriority", [&] { rt.stream_created(*stream, flags); });
  }
  return err;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& rt = enter();
  const int device = !rt.bypass() && stream != nullptr ? rt.stream_destroying(stream) : -1;
  const cudaError_t err = pass_on<&RealCuda::cudaStreamDestroy>(stream);
  if (device >= 0) {
    const StreamId id = reinterpret_cast<StreamId>(stream);
    keep_books("cudaStreamDestroy", [&] { rt.stream_destroy_answered(id, device, err == cudaSuccess); });
  }
  return err;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCapture == nullptr) return missing();
  return begin_capture(stream, false, mode, [&] { return real().cudaStreamBeginCapture(stream, mode); });
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCapture_ptsz == nullptr) return missing();
  return begin_capture(stream, true, mode, [&] { return real().cudaStreamBeginCapture_ptsz(stream, mode); });
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                         const cudaGraphNode_t* deps, const cudaGraphEdgeData* data,
                                                         size_t count, cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCaptureToGraph == nullptr) return missing();
  return begin_capture(stream, false, mode,
                       [&] { return real().cudaStreamBeginCaptureToGraph(stream, graph, deps, data, count, mode); });
}
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                              const cudaGraphNode_t* deps,
                                                              const cudaGraphEdgeData* data, size_t count,
                                                              cudaStreamCaptureMode mode) {
  enter();
  if (real().cudaStreamBeginCaptureToGraph_ptsz == nullptr) return missing();
  return begin_capture(stream, true, mode, [&] {
    return real().cudaStreamBeginCaptureToGraph_ptsz(stream, graph, deps, data, count, mode);
  });
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  enter();
  if (real().cudaStreamEndCapture == nullptr) return missing();
  return end_capture(stream, false, real().cudaStreamEndCapture(stream, graph));
}
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  enter();
  if (real().cudaStreamEndCapture_ptsz == nullptr) return missing();
  return end_capture(stream, true, real().cudaStreamEndCapture_ptsz(stream, graph));
}

}  // namespace serve
