#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace simcuda {

// The simulated driver function called `symbol`, or null when there is none.
void* driver_entry_point(const char* symbol);

// The sticky fault of the calling thread's current device (simcuda_fault_stream),
// or cudaSuccess: the driver's calls of a faulted context fail with it too.
// In runtime_state.cpp.
cudaError_t current_device_fault();

// Whether to refuse this cuMemUnmap of gpupool's core (SIMCUDA_UNMAP_FAIL_RATE),
// counting it. In runtime_state.cpp.
bool injected_unmap_failure(const void* caller);

}  // namespace simcuda
