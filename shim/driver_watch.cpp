// The driver's calls gpupool watches where it does not take the driver's
// calls over: a program's or library's stream destroy, device reset, frees,
// IPC handle and capture calls, reached through the driver directly (exported
// by the preload, preload.c), looked up by name, fetched through
// cuGetProcAddress (driver_hook.c, then driver_entry_points.cpp) or through
// the runtime's cudaGetDriverEntryPoint (serve_caller_runtime.cpp). Each calls
// the driver's own function with gpupool's books kept around it as for the
// runtime's call, so that a block, stream or capture the program handles
// through the driver is still one the pool knows.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <string_view>

#include "shim/caller_runtime.hpp"
#include "shim/core_interface.h"
#include "shim/driver_calls.hpp"
#include "shim/guard.hpp"
#include "shim/real_cuda.hpp"
#include "shim/runtime.hpp"

namespace gpupool::shim {

namespace {

// A driver call leaves the runtime's last error as it was: gpupool's work
// around it, which may fail as a runtime call does, gives the caller's
// runtime no error.
template <typename Work>
decltype(auto) keeping_last_error(Work&& work) {
  cudaError_t& error = thread_error(caller_runtime().number);
  struct Restore {
    cudaError_t& error;
    const cudaError_t before;
    ~Restore() { error = before; }
  } restore{error, error};
  return work();
}

bool destroys_stream(const char* symbol) {
  return symbol != nullptr &&
         (std::strcmp(symbol, "cuStreamDestroy") == 0 || std::strcmp(symbol, "cuStreamDestroy_v2") == 0);
}

// A stream destroy fetched from the driver where gpupool does not take the
// driver's calls over: the driver's own, with gpupool's books kept around it
// as at cudaStreamDestroy. Without it, a stream the program made or named
// through the runtime and destroyed through the driver stayed in the books,
// and the next barrier named a dead handle (on CUDA 13 the program crashed).
// The two versions take the same parameter and do the same.
std::atomic<void*> driver_stream_destroy{nullptr};

template <typename Destroy>
CUresult destroy_in_books(CUstream s, Destroy&& destroy) {
  Runtime* runtime = Runtime::if_started();  // none yet: it knows no stream
  const bool tell = runtime != nullptr && !runtime->bypass() && s != nullptr;
  int device = -1;
  try {
    if (tell) device = runtime->stream_destroying(rt(s));
  } catch (...) {  // as guarded(): gpupool steps aside, the destroy goes on
    step_aside("cuStreamDestroy");
  }
  const CUresult err = destroy(s);
  if (device >= 0) {
    const StreamId id = reinterpret_cast<StreamId>(s);
    keep_books("cuStreamDestroy", [&] { runtime->stream_destroy_answered(id, device, err == CUDA_SUCCESS); });
  }
  return err;
}

CUresult observed_stream_destroy(CUstream s) {
  return destroy_in_books(s, real_of(driver_stream_destroy, &observed_stream_destroy));
}

bool resets_device(const char* symbol) {
  return symbol != nullptr && (std::strcmp(symbol, "cuDevicePrimaryCtxReset") == 0 ||
                               std::strcmp(symbol, "cuDevicePrimaryCtxReset_v2") == 0);
}

// A device reset fetched from the driver where gpupool does not take the
// driver's calls over (Numba's cuda.close(), CUDA.jl's unsafe_reset!): the
// driver's own, with the books kept as at cudaDeviceReset. Unseen, the pool
// went on lending memory the reset had freed. Both versions do the same.
std::atomic<void*> driver_primary_ctx_reset{nullptr};

CUresult observed_primary_ctx_reset(CUdevice device) {
  return driver_reset_in_books(device, real_of(driver_primary_ctx_reset, &observed_primary_ctx_reset));
}

// The driver's exported frees (cuMemFree's first version took 32-bit pointers).
bool frees_memory(const char* symbol) {
  for (const char* name : {"cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"}) {
    if (symbol != nullptr && std::strcmp(symbol, name) == 0) return true;
  }
  return false;
}

// The driver's cuMemFree and cuMemFreeAsync where gpupool does not take the
// driver's calls over. CUDA lets either API free what the other allocated: a
// block gpupool lent goes back to the pool as at cudaFree or cudaFreeAsync
// (`pooled`, with the call's name), anything else to the driver (`driver`,
// its own). The driver's own free of a block took the whole segment from
// under the pool (fixed segments: lent again while the driver reused the
// memory) or refused a mapped page (expandable ones: the block leaked). A
// driver call leaves the runtime's last error as it was.
template <typename Pooled, typename Driver>
CUresult free_in_books(CUdeviceptr p, const char* call, Pooled&& pooled, Driver&& driver) {
  Runtime* runtime = Runtime::if_started();  // none yet: it lent nothing
  if (runtime == nullptr || p == 0 || runtime->device_holding(ptr(p)) < 0) return driver();
  return cu(keeping_last_error([&] { return guarded(call, pooled); }));
}

template <typename Free>
CUresult mem_free_in_books(CUdeviceptr p, Free&& free) {
  return free_in_books(
      p, "cuMemFree", [p] { return free_plain(ptr(p), "cuMemFree"); }, [&] { return free(p); });
}

// A null stream is the legacy default stream's, or with `per_thread` the
// calling thread's default stream, as for cudaFreeAsync.
template <typename Free>
CUresult mem_free_async_in_books(CUdeviceptr p, CUstream s, bool per_thread, Free&& free) {
  return free_in_books(
      p, "cuMemFreeAsync", [=] { return free_stream_ordered(ptr(p), rt(s), per_thread, "cuMemFreeAsync"); },
      [&] { return free(p, s); });
}

std::atomic<void*> driver_mem_free{nullptr};
std::atomic<void*> driver_mem_free_async{nullptr};
std::atomic<void*> driver_mem_free_async_ptsz{nullptr};

CUresult observed_mem_free(CUdeviceptr p) { return mem_free_in_books(p, real_of(driver_mem_free, &observed_mem_free)); }
CUresult observed_mem_free_async(CUdeviceptr p, CUstream s) {
  return mem_free_async_in_books(p, s, false, real_of(driver_mem_free_async, &observed_mem_free_async));
}
CUresult observed_mem_free_async_ptsz(CUdeviceptr p, CUstream s) {
  return mem_free_async_in_books(p, s, true, real_of(driver_mem_free_async_ptsz, &observed_mem_free_async_ptsz));
}

bool shares_memory(const char* symbol) { return symbol != nullptr && std::strcmp(symbol, "cuIpcGetMemHandle") == 0; }

// The driver's cuIpcGetMemHandle where gpupool does not take the driver's
// calls over. A handle names a whole allocation: for a block gpupool lent, its
// segment, so the other process would map other bytes than the block's (or,
// in an expandable segment, memory CUDA IPC cannot share). Refused as
// cudaIpcGetMemHandle refuses it, with a line naming the call and the fix;
// any other address, and every one under GPUPOOL_DISABLE, is the driver's to
// judge. A driver call leaves the runtime's last error as it was.
template <typename Get>
CUresult ipc_handle_in_books(CUipcMemHandle* handle, CUdeviceptr p, Get&& get) {
  Runtime* runtime = Runtime::if_started();  // none yet: it lent nothing
  if (runtime == nullptr || runtime->disabled() || p == 0) return get(handle, p);
  const cudaError_t judged = keeping_last_error([&] {
    return guarded("cuIpcGetMemHandle", [&] {
      return runtime->ipc_exportable(ptr(p), "cuIpcGetMemHandle", "CUDA_ERROR_INVALID_VALUE") ? cudaSuccess
                                                                                              : cudaErrorInvalidValue;
    });
  });
  return judged == cudaSuccess ? get(handle, p) : cu(judged);
}

std::atomic<void*> driver_ipc_get_mem_handle{nullptr};

CUresult observed_ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  return ipc_handle_in_books(handle, p, real_of(driver_ipc_get_mem_handle, &observed_ipc_get_mem_handle));
}

// The capture's begins and ends, under any of their names (a library's dlsym
// asks for cuStreamBeginCapture_v2_ptsz).
bool captures(const char* symbol) {
  if (symbol == nullptr) return false;
  const std::string_view name(symbol);
  return name.starts_with("cuStreamBeginCapture") || name.starts_with("cuStreamEndCapture");
}

// The driver's captures where gpupool does not take the driver's calls over.
// Unseen, a capture had its stream's stream-ordered requests served from the
// cache, so the graph's work wrote memory the pool lent again once the
// capture was over (at every launch of the graph), and the pool's fences on
// the stream joined the capture. Seen, the pool keeps its books as for
// cudaStreamBeginCapture: requests on the stream go to the runtime (graph
// nodes) and nothing of the pool's touches the capture. The driver's own call
// makes the capture, and its answer is the caller's; a driver call leaves the
// runtime's last error as it was. No runtime loaded in the process: gpupool
// can serve nothing there, and the driver alone answers.
template <typename Begin>
CUresult capture_begin_in_books(CUstream s, bool per_thread, CUstreamCaptureMode mode, Begin&& begin) {
  if (Runtime::if_started() == nullptr && real().cudaStreamBeginCapture == nullptr) return begin();
  CUresult r = CUDA_SUCCESS;
  bool made = false;
  keeping_last_error([&] {
    return begin_capture_in_books(rt(s), per_thread, rt(mode), "cuStreamBeginCapture", [&] {
      r = begin();
      made = true;
      return static_cast<cudaError_t>(r);
    });
  });
  // gpupool failed twice on the way (host memory): the driver begins all the
  // same, as it destroys and frees all the same.
  return made ? r : begin();
}

template <typename End>
CUresult capture_end_in_books(CUstream s, bool per_thread, End&& end) {
  const CUresult r = end();
  if (Runtime::if_started() == nullptr) return r;  // no capture of gpupool's books
  // The capture's codes are the same numbers in both APIs.
  keeping_last_error(
      [&] { end_capture_in_books(rt(s), per_thread, static_cast<cudaError_t>(r), "cuStreamEndCapture"); });
  return r;
}

// Each version's and per-thread version's function as fetched: the driver's
// own, which gpupool's (below) calls.
std::atomic<void*> driver_begin_capture_v1{nullptr};
std::atomic<void*> driver_begin_capture_v1_ptsz{nullptr};
std::atomic<void*> driver_begin_capture{nullptr};
std::atomic<void*> driver_begin_capture_ptsz{nullptr};
std::atomic<void*> driver_begin_capture_to_graph{nullptr};
std::atomic<void*> driver_begin_capture_to_graph_ptsz{nullptr};
std::atomic<void*> driver_end_capture{nullptr};
std::atomic<void*> driver_end_capture_ptsz{nullptr};

// gpupool's, each with the driver's function's own parameters; the
// per-thread ones name the calling thread's default stream with a null
// stream. The first version of the begin took no mode: it captured as the
// global mode does.
template <std::atomic<void*>& real, bool per_thread>
CUresult observed_begin_capture_v1(CUstream s) {
  return capture_begin_in_books(s, per_thread, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                [s] { return real_of(real, &observed_begin_capture_v1<real, per_thread>)(s); });
}
template <std::atomic<void*>& real, bool per_thread>
CUresult observed_begin_capture(CUstream s, CUstreamCaptureMode mode) {
  return capture_begin_in_books(s, per_thread, mode,
                                [=] { return real_of(real, &observed_begin_capture<real, per_thread>)(s, mode); });
}
template <std::atomic<void*>& real, bool per_thread>
CUresult observed_begin_capture_to_graph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                         size_t count, CUstreamCaptureMode mode) {
  return capture_begin_in_books(s, per_thread, mode, [=] {
    return real_of(real, &observed_begin_capture_to_graph<real, per_thread>)(s, g, deps, data, count, mode);
  });
}
template <std::atomic<void*>& real, bool per_thread>
CUresult observed_end_capture(CUstream s, CUgraph* g) {
  return capture_end_in_books(s, per_thread,
                              [=] { return real_of(real, &observed_end_capture<real, per_thread>)(s, g); });
}

// Every watched call as cuGetProcAddress names it, at the versions whose
// signature gpupool's function for it has: where the driver's function goes
// (per-thread: fetched with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
// and gpupool's. A call that names no stream has one of each. The stream
// destroy and the reset have one signature at every version (also at 0, a
// version not known); cuMemFree took 32-bit pointers before 3.2.
struct WatchedCall {
  const char* name;
  int since;  // the version from which the call has this signature
  int until;  // the version from which it has another (0: none yet)
  std::atomic<void*>* real;
  std::atomic<void*>* real_per_thread;
  void* legacy;
  void* per_thread;
};

const WatchedCall kWatchedCalls[] = {
    {"cuStreamDestroy", 0, 0, &driver_stream_destroy, &driver_stream_destroy, fn(observed_stream_destroy),
     fn(observed_stream_destroy)},
    {"cuStreamDestroy_v2", 0, 0, &driver_stream_destroy, &driver_stream_destroy, fn(observed_stream_destroy),
     fn(observed_stream_destroy)},
    {"cuDevicePrimaryCtxReset", 0, 0, &driver_primary_ctx_reset, &driver_primary_ctx_reset,
     fn(observed_primary_ctx_reset), fn(observed_primary_ctx_reset)},
    {"cuDevicePrimaryCtxReset_v2", 0, 0, &driver_primary_ctx_reset, &driver_primary_ctx_reset,
     fn(observed_primary_ctx_reset), fn(observed_primary_ctx_reset)},
    {"cuMemFree", 3020, 0, &driver_mem_free, &driver_mem_free, fn(observed_mem_free), fn(observed_mem_free)},
    {"cuMemFreeAsync", 11020, 0, &driver_mem_free_async, &driver_mem_free_async_ptsz, fn(observed_mem_free_async),
     fn(observed_mem_free_async_ptsz)},
    {"cuIpcGetMemHandle", 4010, 0, &driver_ipc_get_mem_handle, &driver_ipc_get_mem_handle,
     fn(observed_ipc_get_mem_handle), fn(observed_ipc_get_mem_handle)},
    {"cuStreamBeginCapture", 10000, 10010, &driver_begin_capture_v1, &driver_begin_capture_v1_ptsz,
     fn(observed_begin_capture_v1<driver_begin_capture_v1, false>),
     fn(observed_begin_capture_v1<driver_begin_capture_v1_ptsz, true>)},
    {"cuStreamBeginCapture", 10010, 0, &driver_begin_capture, &driver_begin_capture_ptsz,
     fn(observed_begin_capture<driver_begin_capture, false>),
     fn(observed_begin_capture<driver_begin_capture_ptsz, true>)},
    {"cuStreamBeginCaptureToGraph", 12030, 0, &driver_begin_capture_to_graph, &driver_begin_capture_to_graph_ptsz,
     fn(observed_begin_capture_to_graph<driver_begin_capture_to_graph, false>),
     fn(observed_begin_capture_to_graph<driver_begin_capture_to_graph_ptsz, true>)},
    {"cuStreamEndCapture", 10000, 0, &driver_end_capture, &driver_end_capture_ptsz,
     fn(observed_end_capture<driver_end_capture, false>), fn(observed_end_capture<driver_end_capture_ptsz, true>)},
};

}  // namespace

bool watched_driver_call(const char* symbol) {
  return destroys_stream(symbol) || resets_device(symbol) || frees_memory(symbol) || shares_memory(symbol) ||
         captures(symbol);
}

void* watching_driver_call(const char* symbol, int version, unsigned long long flags, void* real_function) {
  if (symbol == nullptr) return nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (const WatchedCall& w : kWatchedCalls) {
    if (std::strcmp(w.name, symbol) != 0 || version < w.since || (w.until != 0 && version >= w.until)) continue;
    (per_thread ? w.real_per_thread : w.real)->store(real_function, std::memory_order_release);
    return per_thread ? w.per_thread : w.legacy;
  }
  return nullptr;
}

void watch_runtime_fetch(const char* symbol, void** fn, int version, unsigned long long flags,
                         bool per_thread_default) {
  if (fn == nullptr || *fn == nullptr) return;
  // The runtime's flags have the driver's numbers; its default is the
  // per-thread one in the _ptsz twins (a program built with per-thread
  // default streams calls those).
  const bool per_thread =
      (flags & cudaEnablePerThreadDefaultStream) != 0 || (flags == cudaEnableDefault && per_thread_default);
  void* watching =
      watching_driver_call(symbol, version, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, *fn);
  if (watching != nullptr) *fn = watching;
}

int direct_stream_destroy(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(destroy_in_books(static_cast<CUstream>(stream),
                                           [real](CUstream s) { return static_cast<CUresult>(real(s)); }));
}

int direct_device_reset(int device, int (*real)(int device)) {
  return static_cast<int>(driver_reset_in_books(device, [real](CUdevice d) { return static_cast<CUresult>(real(d)); }));
}

int direct_mem_free(unsigned long long p, int (*real)(unsigned long long p)) {
  return static_cast<int>(mem_free_in_books(p, [real](CUdeviceptr q) { return static_cast<CUresult>(real(q)); }));
}

int direct_mem_free_async(unsigned long long p, void* stream, int (*real)(unsigned long long p, void* stream)) {
  const auto driver = [real](CUdeviceptr q, CUstream s) { return static_cast<CUresult>(real(q, s)); };
  return static_cast<int>(mem_free_async_in_books(p, static_cast<CUstream>(stream), false, driver));
}

int direct_mem_free_async_ptsz(unsigned long long p, void* stream, int (*real)(unsigned long long p, void* stream)) {
  const auto driver = [real](CUdeviceptr q, CUstream s) { return static_cast<CUresult>(real(q, s)); };
  return static_cast<int>(mem_free_async_in_books(p, static_cast<CUstream>(stream), true, driver));
}

int direct_ipc_get_mem_handle(void* handle, unsigned long long p, int (*real)(void* handle, unsigned long long p)) {
  const auto driver = [real](CUipcMemHandle* h, CUdeviceptr q) { return static_cast<CUresult>(real(h, q)); };
  return static_cast<int>(ipc_handle_in_books(static_cast<CUipcMemHandle*>(handle), p, driver));
}

int direct_begin_capture_v1(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), false, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                                 [=] { return static_cast<CUresult>(real(stream)); }));
}
int direct_begin_capture_v1_ptsz(void* stream, int (*real)(void* stream)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), true, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                                 [=] { return static_cast<CUresult>(real(stream)); }));
}
int direct_begin_capture(void* stream, int mode, int (*real)(void* stream, int mode)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), false,
                                                 static_cast<CUstreamCaptureMode>(mode),
                                                 [=] { return static_cast<CUresult>(real(stream, mode)); }));
}
int direct_begin_capture_ptsz(void* stream, int mode, int (*real)(void* stream, int mode)) {
  return static_cast<int>(capture_begin_in_books(static_cast<CUstream>(stream), true,
                                                 static_cast<CUstreamCaptureMode>(mode),
                                                 [=] { return static_cast<CUresult>(real(stream, mode)); }));
}
int direct_begin_capture_to_graph(void* stream, void* graph, const void* deps, const void* data, size_t count, int mode,
                                  gpupool_begin_capture_to_graph_fn real) {
  return static_cast<int>(
      capture_begin_in_books(static_cast<CUstream>(stream), false, static_cast<CUstreamCaptureMode>(mode),
                             [=] { return static_cast<CUresult>(real(stream, graph, deps, data, count, mode)); }));
}
int direct_begin_capture_to_graph_ptsz(void* stream, void* graph, const void* deps, const void* data, size_t count,
                                       int mode, gpupool_begin_capture_to_graph_fn real) {
  return static_cast<int>(
      capture_begin_in_books(static_cast<CUstream>(stream), true, static_cast<CUstreamCaptureMode>(mode),
                             [=] { return static_cast<CUresult>(real(stream, graph, deps, data, count, mode)); }));
}
int direct_end_capture(void* stream, void** graph, int (*real)(void* stream, void** graph)) {
  return static_cast<int>(capture_end_in_books(static_cast<CUstream>(stream), false,
                                               [=] { return static_cast<CUresult>(real(stream, graph)); }));
}
int direct_end_capture_ptsz(void* stream, void** graph, int (*real)(void* stream, void** graph)) {
  return static_cast<int>(capture_end_in_books(static_cast<CUstream>(stream), true,
                                               [=] { return static_cast<CUresult>(real(stream, graph)); }));
}

}  // namespace gpupool::shim
