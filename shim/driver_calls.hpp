// What the two files that serve the driver's calls share:
// driver_entry_points.cpp (the calls of a static runtime gpupool takes over)
// and driver_watch.cpp (the calls it watches wherever else it sees them).
// The conversions between the driver's types and the runtime's, and the
// runtime's calls' work both reuse (entry_points.cpp and serve_*.cpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>

namespace gpupool::shim {

// The driver's numbers for every code these return (see driver_runtime.cpp).
inline CUresult cu(cudaError_t err) { return static_cast<CUresult>(err); }
inline void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
inline cudaStream_t rt(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }
inline cudaStreamCaptureMode rt(CUstreamCaptureMode m) { return static_cast<cudaStreamCaptureMode>(m); }

template <typename F>
void* fn(F* f) {
  return reinterpret_cast<void*>(f);
}

// The driver's function kept in `slot`, with F's signature.
template <typename F>
F* real_of(const std::atomic<void*>& slot, F*) {
  return reinterpret_cast<F*>(slot.load());
}

// entry_points.cpp, serve_devices.cpp and serve_streams.cpp: the runtime's
// calls' work, which the driver's reuse.
// cudaMallocPitch's and cudaMalloc3D's (see there).
bool allocate_pitched(void** ptr, size_t* pitch, size_t width, size_t rows, cudaError_t* result);
// cudaFree's work, the driver's cuMemFree's too (`call` names it in lines).
cudaError_t free_plain(void* ptr, const char* call);
// cudaFreeAsync's work (its per-thread version's), the driver's
// cuMemFreeAsync's too.
cudaError_t free_stream_ordered(void* ptr, cudaStream_t stream, bool per_thread, const char* call);
// A reset of `device` made by `reset` (the runtime's, the driver's), `call`
// naming it, with the pool's books kept around it.
cudaError_t reset_in_books(int device, const char* call, const std::function<cudaError_t()>& reset);
// A capture's begin made by `begin` (the driver's), with the pool's books kept
// around it as at cudaStreamBeginCapture, `call` naming it; and a capture's
// end, which the driver answered `err`, as at cudaStreamEndCapture.
cudaError_t begin_capture_in_books(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode, const char* call,
                                   const std::function<cudaError_t()>& begin);
void end_capture_in_books(cudaStream_t stream, bool per_thread, cudaError_t err, const char* call);

// A device reset through the driver (`reset`, the driver's own), with the
// pool's books kept around it as at cudaDeviceReset.
template <typename Reset>
CUresult driver_reset_in_books(CUdevice device, Reset&& reset) {
  return cu(reset_in_books(device, "cuDevicePrimaryCtxReset",
                           [&] { return static_cast<cudaError_t>(reset(device)); }));
}

// driver_watch.cpp: true for any name of a call gpupool watches (a library's
// lookup of one is handed gpupool's).
bool watched_driver_call(const char* symbol);
// gpupool's function for the watched call `symbol` fetched at `version` with
// `flags` (the driver's, real_function, which it calls), or null for any
// other call.
void* watching_driver_call(const char* symbol, int version, unsigned long long flags, void* real_function);
// The driver's function `symbol` the runtime's cudaGetDriverEntryPoint (or
// its versions) fetched into `*fn`, at `version`, with the runtime's `flags`
// (whose default, in the _ptsz twins, is the per-thread one): replaced with
// gpupool's where it is a watched call. The runtime asks the driver past
// gpupool's lookups, so this is the only place such a fetch is seen.
void watch_runtime_fetch(const char* symbol, void** fn, int version, unsigned long long flags,
                         bool per_thread_default);

}  // namespace gpupool::shim
