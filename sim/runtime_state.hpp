// What the simulated runtime's entry points share (runtime_api.cpp,
// memory_api.cpp, stream_api.cpp): the calling thread's device and last
// error, the devices' sticky faults, the live events, the failures injected
// into gpupool's calls, and the stream behind a handle.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_set>

#include "sim/engine.hpp"

namespace simcuda::rt {

extern thread_local cudaError_t t_last_error;
extern thread_local int t_device;

// Every live event, so that a device reset can destroy the device's own.
std::mutex& events_mu();
std::unordered_set<Event*>& events();
// Events a device reset destroyed (kept: see Event::reset). Under events_mu.
std::unordered_set<Event*>& reset_events();
// The event behind a handle, or null (the call fails) when there is none or a
// device reset destroyed it; such a use is counted, for tests to catch.
Event* usable_event(cudaEvent_t e);

// Every entry point reports through here, as the runtime does: a failure is
// remembered for cudaGetLastError.
cudaError_t result(cudaError_t err);

// Sticky faults (simcuda_fault_stream): once a queued fault has run, the
// device's later calls fail with its error, as a real context does after a
// kernel's illegal address.
cudaError_t fault_of(int device);
void set_fault(int device, int error);
// A call's own result, unless its device has faulted.
cudaError_t checked(int device, cudaError_t err);

// SIMCUDA_EVENT_FAIL_RATE: the chance that an event creation, record or
// stream wait made by gpupool's core fails, as with a runtime short of
// resources.
bool injected_event_failure(const void* caller);
// SIMCUDA_EVENT_QUERY_FAIL_RATE: the chance that an event query made by
// gpupool's core fails with an error instead of saying whether the event has
// completed, as on a device in trouble; the event itself is unharmed.
bool injected_event_query_failure(const void* caller);
// SIMCUDA_HOST_WAIT_FAIL_RATE: the chance that a host wait made by gpupool's
// core (cudaEventSynchronize, cudaStreamSynchronize, cudaDeviceSynchronize)
// fails, waiting for nothing.
bool injected_host_wait_failure(const void* caller);

Stream* stream_of(cudaStream_t s, bool per_thread);

}  // namespace simcuda::rt
