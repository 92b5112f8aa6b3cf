#include "shim/cuda_upstream.hpp"

#include <time.h>

#include "shim/real_cuda.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {

// Runs one internal runtime call. On failure the runtime's last error is ours,
// not the program's: clear it, and keep whatever the program had pending.
template <typename Call>
cudaError_t internal(Call&& call) {
  const RealCuda& r = real();
  const cudaError_t pending = r.cudaPeekAtLastError != nullptr ? r.cudaPeekAtLastError() : cudaSuccess;
  const cudaError_t err = call(r);
  if (err != cudaSuccess && err != cudaErrorNotReady) {
    if (r.cudaGetLastError != nullptr) r.cudaGetLastError();
    if (pending != cudaSuccess) thread_error() = pending;
  }
  return err;
}

// Runs `call` with `device` current, restoring the caller's device after.
template <typename Call>
cudaError_t on_device(int device, Call&& call) {
  const RealCuda& r = real();
  int current = device;
  if (r.cudaGetDevice != nullptr) r.cudaGetDevice(&current);
  if (current == device || r.cudaSetDevice == nullptr) return call();
  r.cudaSetDevice(device);
  const cudaError_t err = call();
  r.cudaSetDevice(current);
  return err;
}

cudaEvent_t as_event(EventHandle e) { return reinterpret_cast<cudaEvent_t>(e); }

}  // namespace

DevicePtr CudaUpstream::allocate_segment(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = on_device(device_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaMalloc(&p, bytes); });
  });
  return err == cudaSuccess ? reinterpret_cast<DevicePtr>(p) : 0;
}

void CudaUpstream::release_segment(DevicePtr base, std::size_t) {
  on_device(device_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaFree(reinterpret_cast<void*>(base)); });
  });
}

EventHandle CudaUpstream::create_event() {
  cudaEvent_t e = nullptr;
  const cudaError_t err = on_device(device_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaEventCreateWithFlags(&e, cudaEventDisableTiming); });
  });
  return err == cudaSuccess ? reinterpret_cast<EventHandle>(e) : 0;
}

void CudaUpstream::destroy_event(EventHandle event) {
  internal([&](const RealCuda& r) { return r.cudaEventDestroy(as_event(event)); });
}

bool CudaUpstream::record_event(EventHandle event, StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return false;
  return internal([&](const RealCuda& r) { return r.cudaEventRecord(as_event(event), s); }) == cudaSuccess;
}

bool CudaUpstream::wait_event(StreamId stream, EventHandle event) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return false;
  return internal([&](const RealCuda& r) { return r.cudaStreamWaitEvent(s, as_event(event), 0); }) ==
         cudaSuccess;
}

EventStatus CudaUpstream::query_event(EventHandle event) {
  const cudaError_t err = internal([&](const RealCuda& r) { return r.cudaEventQuery(as_event(event)); });
  if (err == cudaSuccess) return EventStatus::Complete;
  return err == cudaErrorNotReady ? EventStatus::Pending : EventStatus::Error;
}

EventStatus CudaUpstream::query_stream(StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return EventStatus::Error;
  const cudaError_t err = internal([&](const RealCuda& r) { return r.cudaStreamQuery(s); });
  if (err == cudaSuccess) return EventStatus::Complete;
  return err == cudaErrorNotReady ? EventStatus::Pending : EventStatus::Error;
}

bool CudaUpstream::synchronize_event(EventHandle event) {
  return internal([&](const RealCuda& r) { return r.cudaEventSynchronize(as_event(event)); }) == cudaSuccess;
}

bool CudaUpstream::synchronize_stream(StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return false;
  return internal([&](const RealCuda& r) { return r.cudaStreamSynchronize(s); }) == cudaSuccess;
}

StreamId CudaUpstream::legacy_stream() const { return kLegacyStream; }

bool CudaUpstream::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  return on_device(device_, [&] {
           return internal([&](const RealCuda& r) { return r.cudaMemGetInfo(free_bytes, total_bytes); });
         }) == cudaSuccess;
}

std::uint64_t SteadyClock::now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace gpupool::shim
