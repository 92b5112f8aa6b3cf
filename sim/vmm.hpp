#pragma once

#include <cuda.h>

namespace simcuda {

// The simulated driver function called `symbol`, or null when there is none.
void* driver_entry_point(const char* symbol);

}  // namespace simcuda
