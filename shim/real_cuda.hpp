// The real CUDA runtime functions, found lazily at first use: dlsym(RTLD_NEXT)
// from the preload library first; when the runtime was loaded RTLD_LOCAL (Python extension modules),
// the loaded libcudart is found with dl_iterate_phdr and opened RTLD_NOLOAD,
// by its file name, or else as the first loaded library that defines the
// runtime's calls itself (a renamed copy). Nothing here links against libcudart.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "shim/thread_state.hpp"

namespace gpupool::shim {

#define GPUPOOL_REAL_FUNCTIONS(X)                                                         \
  X(cudaMalloc, cudaError_t(void**, size_t))                                          \
  X(cudaFree, cudaError_t(void*))                                                     \
  X(cudaMallocPitch, cudaError_t(void**, size_t*, size_t, size_t))                    \
  X(cudaMalloc3D, cudaError_t(cudaPitchedPtr*, cudaExtent))                           \
  X(cudaMallocAsync, cudaError_t(void**, size_t, cudaStream_t))                       \
  X(cudaMallocAsync_ptsz, cudaError_t(void**, size_t, cudaStream_t))                  \
  X(cudaMallocFromPoolAsync, cudaError_t(void**, size_t, cudaMemPool_t, cudaStream_t)) \
  X(cudaMallocFromPoolAsync_ptsz, cudaError_t(void**, size_t, cudaMemPool_t, cudaStream_t)) \
  X(cudaFreeAsync, cudaError_t(void*, cudaStream_t))                                  \
  X(cudaFreeAsync_ptsz, cudaError_t(void*, cudaStream_t))                             \
  X(cudaMemGetInfo, cudaError_t(size_t*, size_t*))                                    \
  X(cudaGetDevice, cudaError_t(int*))                                                 \
  X(cudaGetDeviceCount, cudaError_t(int*))                                            \
  X(cudaSetDevice, cudaError_t(int))                                                  \
  X(cudaGetLastError, cudaError_t(void))                                              \
  X(cudaPeekAtLastError, cudaError_t(void))                                           \
  X(cudaDeviceReset, cudaError_t(void))                                               \
  X(cudaThreadExit, cudaError_t(void))                                                \
  X(cudaDeviceSynchronize, cudaError_t(void))                                         \
  X(cudaDeviceGetDefaultMemPool, cudaError_t(cudaMemPool_t*, int))                    \
  X(cudaDeviceGetMemPool, cudaError_t(cudaMemPool_t*, int))                           \
  X(cudaDeviceSetMemPool, cudaError_t(int, cudaMemPool_t))                            \
  X(cudaMemSetMemPool, cudaError_t(cudaMemLocation*, cudaMemAllocationType, cudaMemPool_t)) \
  X(cudaMemPoolSetAccess, cudaError_t(cudaMemPool_t, const cudaMemAccessDesc*, size_t)) \
  X(cudaMemPoolDestroy, cudaError_t(cudaMemPool_t))                                   \
  X(cudaMemPoolTrimTo, cudaError_t(cudaMemPool_t, size_t))                            \
  X(cudaMemPoolGetAttribute, cudaError_t(cudaMemPool_t, cudaMemPoolAttr, void*))      \
  X(cudaMemPoolSetAttribute, cudaError_t(cudaMemPool_t, cudaMemPoolAttr, void*))      \
  X(cudaEventCreateWithFlags, cudaError_t(cudaEvent_t*, unsigned int))                \
  X(cudaEventDestroy, cudaError_t(cudaEvent_t))                                       \
  X(cudaEventRecord, cudaError_t(cudaEvent_t, cudaStream_t))                          \
  X(cudaEventQuery, cudaError_t(cudaEvent_t))                                         \
  X(cudaEventSynchronize, cudaError_t(cudaEvent_t))                                   \
  X(cudaStreamWaitEvent, cudaError_t(cudaStream_t, cudaEvent_t, unsigned int))        \
  X(cudaStreamSynchronize, cudaError_t(cudaStream_t))                                 \
  X(cudaStreamQuery, cudaError_t(cudaStream_t))                                       \
  X(cudaStreamIsCapturing, cudaError_t(cudaStream_t, cudaStreamCaptureStatus*))       \
  X(cudaPointerGetAttributes, cudaError_t(cudaPointerAttributes*, const void*))       \
  X(cudaStreamGetFlags, cudaError_t(cudaStream_t, unsigned int*))                     \
  X(cudaStreamGetDevice, cudaError_t(cudaStream_t, int*))                             \
  X(cudaStreamCreate, cudaError_t(cudaStream_t*))                                     \
  X(cudaStreamCreateWithFlags, cudaError_t(cudaStream_t*, unsigned int))              \
  X(cudaStreamCreateWithPriority, cudaError_t(cudaStream_t*, unsigned int, int))      \
  X(cudaStreamDestroy, cudaError_t(cudaStream_t))                                     \
  X(cudaStreamBeginCapture, cudaError_t(cudaStream_t, cudaStreamCaptureMode))         \
  X(cudaStreamBeginCapture_ptsz, cudaError_t(cudaStream_t, cudaStreamCaptureMode))    \
  X(cudaStreamBeginCaptureToGraph,                                                        \
    cudaError_t(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,                    \
                    const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode))             \
  X(cudaStreamBeginCaptureToGraph_ptsz,                                                   \
    cudaError_t(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,                    \
                    const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode))             \
  X(cudaStreamEndCapture, cudaError_t(cudaStream_t, cudaGraph_t*))                    \
  X(cudaStreamEndCapture_ptsz, cudaError_t(cudaStream_t, cudaGraph_t*))               \
  X(cudaThreadExchangeStreamCaptureMode, cudaError_t(cudaStreamCaptureMode*))          \
  X(cudaIpcGetMemHandle, cudaError_t(cudaIpcMemHandle_t*, void*))                    \
  X(cudaDeviceEnablePeerAccess, cudaError_t(int, unsigned int))                        \
  X(cudaDeviceDisablePeerAccess, cudaError_t(int))                                     \
  X(cudaGetDriverEntryPointByVersion,                                                   \
    cudaError_t(const char*, void**, unsigned int, unsigned long long,                  \
                cudaDriverEntryPointQueryResult*))                                       \
  X(cudaGetDriverEntryPointByVersion_ptsz,                                              \
    cudaError_t(const char*, void**, unsigned int, unsigned long long,                  \
                cudaDriverEntryPointQueryResult*))                                       \
  X(cudaGetDriverEntryPoint,                                                            \
    cudaError_t(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*)) \
  X(cudaGetDriverEntryPoint_ptsz,                                                       \
    cudaError_t(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*)) \
  X(cudaRuntimeGetVersion, cudaError_t(int*))

struct RealCuda {
#define GPUPOOL_DECLARE(name, signature) std::add_pointer_t<signature> name = nullptr;
  GPUPOOL_REAL_FUNCTIONS(GPUPOOL_DECLARE)
#undef GPUPOOL_DECLARE
};

// Resolved on first call, from whichever thread gets there first: the
// shared runtime's functions; in a program without one whose static runtime's
// driver calls gpupool took over (set_driver_lookup), functions that call the
// driver (driver_runtime.hpp). Where no runtime is found (a program calling
// gpupool's entry points with none loaded), every function is null, and
// found again at a later call once a library was loaded since.
const RealCuda& real();

// real()'s `name`, one of the calls gpupool intercepts (entry_points.def):
// the function it passes such calls on to; null where there is none.
const void* real_function(const char* name);

// Runs one runtime call the shim makes for itself. On failure the runtime's
// last error is the shim's, not the program's: it is cleared, and whatever
// error the program had pending is kept for its next cudaGetLastError (the
// error of real()'s callers: runtime 0's).
template <typename Call>
cudaError_t internal(Call&& call) {
  const RealCuda& r = real();
  const cudaError_t pending = r.cudaPeekAtLastError != nullptr ? r.cudaPeekAtLastError() : cudaSuccess;
  const cudaError_t err = call(r);
  if (err != cudaSuccess && err != cudaErrorNotReady) {
    if (r.cudaGetLastError != nullptr) r.cudaGetLastError();
    if (pending != cudaSuccess) thread_error(0) = pending;
  }
  return err;
}

// How real driver functions are found, for a program with the static runtime.
// Set before the first call of real() to count.
void set_driver_lookup(int (*lookup)(const char* symbol, void** pfn, int version, unsigned long long flags));

// How real functions are found: the preload library's dlsym(RTLD_NEXT) (from
// this library, loaded RTLD_LOCAL, RTLD_NEXT would not see the program's
// runtime). Set before the first call; without it, dlsym(RTLD_NEXT) here.
void set_symbol_lookup(void* (*lookup)(const char* name));

// Resolves real() now if a shared runtime is loaded (the result is the same
// as at the first call then). Called as the core opens, inside the preload
// library's load of it, and again by the core's exit handler just before it
// closes the opening of libraries (library_opening.hpp): real()'s look into
// the runtime's own scope then never comes after that close, when it would
// fail, and a runtime reachable only from a library's local scope would leave
// real()'s functions null.
void resolve_real_where_runtime_loaded();

// Where the preload library is loaded (its dli_fbase), found from the lookup
// function it passed: call stacks skip its frames as they skip this library's.
// Null before set_symbol_lookup.
void* preload_library_base();

}  // namespace gpupool::shim
