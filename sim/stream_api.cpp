// The simulated runtime's streams, stream capture and events.
#include <cuda_runtime_api.h>

#include <mutex>

#include "sim/counters.hpp"
#include "sim/engine.hpp"
#include "sim/ptsz.h"
#include "sim/runtime_state.hpp"

// The runtime's own names, and what its entry points share (runtime_state.hpp).
using namespace simcuda;
using namespace simcuda::rt;

namespace {

// The graph handle EndCapture returns; only ever destroyed.
struct Graph {
  unsigned long long nodes;
};

}  // namespace

extern "C" {

// ---------------------------------------------------------------- streams

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr) return result(cudaErrorInvalidValue);
  *s = Engine::instance().create_stream(flags, t_device);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return result(cudaErrorInvalidResourceHandle);
  return result(Engine::instance().destroy_stream(stream_of(s, false)));
}

// A destroyed stream's handle: refused, as by cudaStreamGetDevice.
cudaError_t stream_get_flags(cudaStream_t s, unsigned int* flags, bool per_thread) {
  if (flags == nullptr) return result(cudaErrorInvalidValue);
  const Stream* st = stream_of(s, per_thread);
  if (st->destroyed) return result(cudaErrorInvalidResourceHandle);
  *flags = st->kind == simcuda::StreamKind::NonBlocking ? cudaStreamNonBlocking : 0;
  return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int* flags) { return stream_get_flags(s, flags, false); }
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t s, unsigned int* flags) { return stream_get_flags(s, flags, true); }

// CUDA 12.8 and later: the device a stream belongs to (a stream made
// through the driver on another device too).
cudaError_t stream_get_device(cudaStream_t s, int* device, bool per_thread) {
  if (device == nullptr) return result(cudaErrorInvalidValue);
  const Stream* st = stream_of(s, per_thread);
  if (st->destroyed) return result(cudaErrorInvalidResourceHandle);
  *device = st->device;
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) { return stream_get_device(s, device, false); }
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int* device) { return stream_get_device(s, device, true); }

cudaError_t stream_synchronize(cudaStream_t s, bool per_thread) {
  Stream* st = stream_of(s, per_thread);
  return checked(st->device, Engine::instance().synchronize(st));
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  return stream_synchronize(s, false);
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  return stream_synchronize(s, true);
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return Engine::instance().query(stream_of(s, false)); }
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) { return Engine::instance().query(stream_of(s, true)); }

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().wait(stream_of(s, false), ev));
}
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().wait(stream_of(s, true), ev));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return result(cudaErrorInvalidValue);
  return result(Engine::instance().enqueue(stream_of(s, false), [fn, data] { fn(data); }));
}
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return result(cudaErrorInvalidValue);
  return result(Engine::instance().enqueue(stream_of(s, true), [fn, data] { fn(data); }));
}

// ---------------------------------------------------------------- capture

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return result(Engine::instance().begin_capture(stream_of(s, false), mode));
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, cudaStreamCaptureMode mode) {
  return result(Engine::instance().begin_capture(stream_of(s, true), mode));
}

// Into an existing graph (CUDA 12.3): its nodes grow, and the end returns it.
static cudaError_t begin_capture_to_graph(Stream* s, cudaGraph_t graph, size_t dependencies,
                                          cudaStreamCaptureMode mode) {
  if (graph == nullptr || dependencies != 0) return result(cudaErrorInvalidValue);  // no nodes to depend on here
  const cudaError_t err = Engine::instance().begin_capture(s, mode);
  if (err == cudaSuccess) s->capture_graph = graph;
  return result(err);
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t*,
                                          const cudaGraphEdgeData*, size_t count, cudaStreamCaptureMode mode) {
  return begin_capture_to_graph(stream_of(s, false), graph, count, mode);
}
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t*,
                                               const cudaGraphEdgeData*, size_t count, cudaStreamCaptureMode mode) {
  return begin_capture_to_graph(stream_of(s, true), graph, count, mode);
}

static cudaError_t end_capture(Stream* s, cudaGraph_t* graph) {
  if (graph == nullptr) return result(cudaErrorInvalidValue);
  bool valid = false;
  auto* target = static_cast<Graph*>(s->capture_graph);
  const cudaError_t err = Engine::instance().end_capture(s, &valid);
  if (!valid) {
    *graph = nullptr;
  } else if (target != nullptr) {
    target->nodes += s->captured_nodes;
    *graph = reinterpret_cast<cudaGraph_t>(target);
  } else {
    *graph = reinterpret_cast<cudaGraph_t>(new Graph{s->captured_nodes});
  }
  return result(err);
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) { return end_capture(stream_of(s, false), g); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t* g) { return end_capture(stream_of(s, true), g); }

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return result(Engine::instance().exchange_capture_mode(mode));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return result(cudaErrorInvalidValue);
  *status = Engine::instance().capture_status(stream_of(s, false));
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return result(cudaErrorInvalidValue);
  *status = Engine::instance().capture_status(stream_of(s, true));
  return cudaSuccess;
}

cudaError_t cudaGraphCreate(cudaGraph_t* g, unsigned int flags) {
  if (g == nullptr || flags != 0) return result(cudaErrorInvalidValue);
  *g = reinterpret_cast<cudaGraph_t>(new Graph{0});
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete reinterpret_cast<Graph*>(g);
  return cudaSuccess;
}

// ---------------------------------------------------------------- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr) return result(cudaErrorInvalidValue);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorMemoryAllocation);
  auto* ev = new simcuda::Event();
  ev->flags = flags;
  ev->device = t_device;
  {
    std::lock_guard<std::mutex> lock(events_mu());
    events().insert(ev);
  }
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return result(cudaErrorInvalidResourceHandle);
  auto* ev = reinterpret_cast<simcuda::Event*>(e);
  {
    std::lock_guard<std::mutex> lock(events_mu());
    if (events().erase(ev) == 0) {
      // Destroyed already: by a reset (kept, so counted), or by the caller.
      if (reset_events().count(ev) != 0) counters().stale_event_uses++;
      return result(cudaErrorInvalidResourceHandle);
    }
  }
  // Waits already queued copied the event's stream position, so it can go.
  delete ev;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  if (const cudaError_t fault = fault_of(ev->device); fault != cudaSuccess) return result(fault);
  return result(Engine::instance().record(ev, stream_of(s, false)));
}
cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_failure(__builtin_return_address(0))) return result(cudaErrorLaunchOutOfResources);
  return result(Engine::instance().record(ev, stream_of(s, true)));
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (injected_event_query_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  if (const cudaError_t fault = fault_of(ev->device); fault != cudaSuccess) return result(fault);
  const cudaError_t err = Engine::instance().query(ev);
  return err == cudaErrorNotReady ? err : result(err);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (injected_host_wait_failure(__builtin_return_address(0))) return result(cudaErrorUnknown);
  simcuda::Event* ev = usable_event(e);
  if (ev == nullptr) return result(cudaErrorInvalidResourceHandle);
  if (Engine::instance().stale_capture_refuses(false)) return result(cudaErrorStreamCaptureUnsupported);
  return checked(ev->device, Engine::instance().synchronize(ev));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  if (ms == nullptr) return result(cudaErrorInvalidValue);
  *ms = 0.0f;
  return cudaSuccess;
}

}  // extern "C"
