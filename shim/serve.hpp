// The runtime calls gpupool intercepts, as the core serves them: one function
// in namespace serve for each entry of entry_points.def, which the guarded
// export of that name in entry_points.cpp calls. They are spread by concern:
// memory in entry_points.cpp (where the allocations and frees inline into
// their exports), devices and memory pools in serve_devices.cpp, streams and
// captures in serve_streams.cpp, what the caller's own runtime answers (its
// last error, its driver entry points) in serve_caller_runtime.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

// Entry for every intercepted call: starts the runtime on first use and
// serves a report a signal asked for.
inline Runtime& enter() {
  Runtime& rt = Runtime::get();
  rt.poll_report_request();
  return rt;
}

inline cudaError_t missing() { return fail(cudaErrorNotSupported); }

// A call passed on to the runtime: cudaErrorNotSupported where it has no such
// function (an older runtime), or where no runtime was found at all.
template <auto function, typename... Args>
cudaError_t pass_on(Args... args) {
  const auto call = real().*function;
  return call != nullptr ? call(args...) : missing();
}

}  // namespace gpupool::shim

namespace serve {

#define GPUPOOL_ENTRY(name, params, args) cudaError_t name params;
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY

// What their bodies use.
using gpupool::StreamId;
using gpupool::shim::enter;
using gpupool::shim::fail;
using gpupool::shim::keep_books;
using gpupool::shim::missing;
using gpupool::shim::pass_on;
using gpupool::shim::real;
using gpupool::shim::RealCuda;
using gpupool::shim::Runtime;
using gpupool::shim::stream_id;

}  // namespace serve
