// The runtime calls the core makes, served by the driver: for a program built
// with nvcc's default static runtime, which has no shared runtime to call.
#pragma once

#include <cuda.h>

#include "shim/core_interface.h"
#include "shim/real_cuda.hpp"

namespace gpupool::shim {

// Fills `table` with functions that call the driver's (found with `lookup`).
// False, and `table` untouched, when the driver lacks one the pool needs.
bool fill_from_driver(RealCuda& table, gpupool_driver_lookup_fn lookup);

// The device of a context (the static runtime's peer access names the peer's
// context), or -1.
int device_of_context(CUcontext ctx);

}  // namespace gpupool::shim
