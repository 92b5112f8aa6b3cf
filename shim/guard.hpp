// The guard every entry point runs under (see step_aside.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include "shim/step_aside.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

// Runs an entry point's work. Should it throw, gpupool steps aside and the
// work runs again, now passing the call to the runtime. That second run is
// safe because the entry points throw only before the runtime has done the
// call, or while they serve an allocation or free, which the second run
// serves without the pool; their bookkeeping after a runtime call goes
// through keep_books. A second exception fails the call.
template <typename Work>
cudaError_t guarded(const char* call, Work&& work) noexcept {
  try {
    return work();
  } catch (...) {
    step_aside(call);
  }
  try {
    return work();
  } catch (...) {
    return fail(cudaErrorMemoryAllocation);
  }
}

}  // namespace gpupool::shim
