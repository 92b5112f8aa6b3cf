// The driver as nvcc's static runtime reaches it, for static_runtime.cpp's
// modes: cuGetProcAddress found with dlsym, every other entry point fetched
// through it (per thread), and what the modes share.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace static_runtime {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);  // CUDA 11.3 to 11.8
// Per thread: each thread of the threads mode opens the driver itself.
extern thread_local GetProcAddress get_proc_address;
extern thread_local GetProcAddressV1 get_proc_address_v1;
// --cuda11: as a CUDA 11 static runtime, through cuGetProcAddress's first form.
extern bool g_cuda11;

template <typename F>
F fetch(const char* name, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  const CUresult r = g_cuda11 ? get_proc_address_v1(name, &fn, version < 11080 ? version : 11080, flags)
                              : get_proc_address(name, &fn, version, flags, &status);
  if (r != CUDA_SUCCESS || fn == nullptr) {
    std::fprintf(stderr, "static_runtime: no %s at %d\n", name, version);
    std::exit(1);
  }
  return reinterpret_cast<F>(fn);
}

struct Driver {
  decltype(&cuInit) init;
  decltype(&cuMemAlloc_v2) mem_alloc;
  decltype(&cuMemFree_v2) mem_free;
  decltype(&cuMemAllocPitch_v2) mem_alloc_pitch;
  decltype(&cuMemPoolTrimTo) mem_pool_trim_to;
  decltype(&cuMemGetInfo_v2) mem_get_info;
  decltype(&cuMemPoolCreate) mem_pool_create;
  decltype(&cuMemPoolDestroy) mem_pool_destroy;
  decltype(&cuDeviceSetMemPool) device_set_mem_pool;
  decltype(&cuMemSetMemPool) mem_set_mem_pool;  // CUDA 13's; not fetched as CUDA 11
  decltype(&cuMemPoolSetAccess) mem_pool_set_access;
  decltype(&cuMemPoolGetAttribute) mem_pool_get_attribute;
  decltype(&cuMemPoolSetAttribute) mem_pool_set_attribute;
  decltype(&cuDeviceGetDefaultMemPool) device_get_default_mem_pool;
  decltype(&cuMemAllocAsync) mem_alloc_async;
  decltype(&cuMemAllocFromPoolAsync) mem_alloc_from_pool_async;
  decltype(&cuMemAllocFromPoolAsync) mem_alloc_from_pool_async_ptsz;
  decltype(&cuMemFreeAsync) mem_free_async;
  decltype(&cuMemAllocAsync) mem_alloc_async_ptsz;
  decltype(&cuMemFreeAsync) mem_free_async_ptsz;
  decltype(&cuMemcpyHtoD_v2) memcpy_htod;
  decltype(&cuMemcpyDtoH_v2) memcpy_dtoh;
  decltype(&cuMemcpyHtoDAsync_v2) memcpy_htod_async;
  decltype(&cuStreamCreate) stream_create;
  decltype(&cuStreamCreateWithPriority) stream_create_with_priority;
  decltype(&cuStreamDestroy_v2) stream_destroy;
  decltype(&cuStreamSynchronize) stream_synchronize;
  decltype(&cuStreamBeginCapture_v2) begin_capture;
  decltype(&cuStreamEndCapture) end_capture;
  decltype(&cuStreamBeginCapture_v2) begin_capture_ptsz;
  decltype(&cuStreamEndCapture) end_capture_ptsz;
  decltype(&cuGraphDestroy) graph_destroy;
  decltype(&cuLaunchHostFunc) launch_host_func;
  decltype(&cuCtxSynchronize) ctx_synchronize;
  decltype(&cuIpcGetMemHandle) ipc_get_mem_handle;
  decltype(&cuDevicePrimaryCtxReset_v2) primary_ctx_reset;
  decltype(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
  decltype(&cuCtxSetCurrent) ctx_set_current;
  decltype(&cuCtxEnablePeerAccess) ctx_enable_peer_access;
  decltype(&cuCtxDisablePeerAccess) ctx_disable_peer_access;
};
extern thread_local Driver d;
extern thread_local void* driver_library;

// Opens libcuda.so.1 as the static runtime does and fetches every entry point.
void open_driver();
// Exits 1, saying what failed, unless r is CUDA_SUCCESS.
void check(CUresult r, const char* what);
// A stream with the flags, at STATIC_RUNTIME_PRIORITY's priority where set.
CUstream new_stream(unsigned flags);
// Fills the block with a pattern of its own and reads it back.
void write_and_check(CUdeviceptr p, size_t size, unsigned seed);
extern const size_t kSizes[6];
// N cuMemAlloc/cuMemFree pairs of kSizes in turn, each block checked.
void make_pairs(int n, unsigned seed);
// As cudaSetDevice of the static runtime: the device's primary context.
CUcontext use_device(int device);
// Whether `device` may use p, as the simulated driver says (its own check:
// exits where the driver cannot say).
bool reachable(CUdeviceptr p, int device);

// The modes of two devices (static_runtime_devices.cpp).
int unseen_stream();
int peer();
int pool_access();
int foreign_capture_reset();

}  // namespace static_runtime
