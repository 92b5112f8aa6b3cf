/* The interface between libgpupool.so, the small library LD_PRELOAD names
   (preload.c), and libgpupool-core.so, the allocator it loads at the first
   intercepted call (entry_points.cpp). Plain C: the preload library carries
   no C++ runtime. */
#ifndef GPUPOOL_SHIM_CORE_INTERFACE_H
#define GPUPOOL_SHIM_CORE_INTERFACE_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA 12's cudaThreadExit, the old name of cudaDeviceReset: CUDA 13's
   headers no longer declare it, but programs built for CUDA 12 call it. */
cudaError_t cudaThreadExit(void);

/* Raised whenever this struct changes: a core of another version is refused. */
#define GPUPOOL_CORE_ABI 20

/* Finds a real CUDA runtime function: dlsym(RTLD_NEXT) in the preload
   library, the object that stands before the runtime in the search order. */
typedef void* (*gpupool_lookup_fn)(const char* name);

/* The return address of the intercepted call this thread is in (NULL before
   the first): whose library made it (shim/caller_runtime.hpp). */
typedef const void* (*gpupool_caller_fn)(void);

/* 1 where a line may go to descriptor 2 (the file the program started with,
   or a pipe put there since), 0 where it names another file or none: the
   core's lines then go nowhere (preload.c, messages.hpp). */
typedef int (*gpupool_stderr_fn)(void);

/* Finds a real CUDA driver entry point as cuGetProcAddress does (name without
   version suffix, CUDA version, flags); returns the driver's CUresult. */
typedef int (*gpupool_driver_lookup_fn)(const char* symbol, void** pfn, int version, unsigned long long flags);

/* The driver's cuStreamBeginCaptureToGraph, as the preload passes it on. */
typedef int (*gpupool_begin_capture_to_graph_fn)(void* stream, void* graph, const void* deps, const void* data,
                                                 size_t count, int mode);

struct gpupool_core {
  int abi;
#define GPUPOOL_ENTRY(name, params, args) cudaError_t (*name) params;
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
  void (*at_exit)(void); /* at process exit, after the program's static destructors */
  void (*prepare_fork)(void);
  void (*parent_after_fork)(void);
  void (*child_after_fork)(void);
  /* For a driver entry point the program's static runtime fetched (real, at
     `version` with `flags`): the function to give it instead, or real. */
  void* (*driver_entry)(const char* symbol, int version, unsigned long long flags, void* real,
                        gpupool_driver_lookup_fn lookup);
  /* 1 when the library at `path` (not the program), asking dlsym for the
     driver's `symbol` (cuGetProcAddress, or an entry point by name), is to
     have its driver calls taken over (or, for a watched call's name,
     watched); 2 when, asking for cuGetProcAddress, only the watched calls
     it fetches through it are to be gpupool's; 0 to be left alone. */
  int (*driver_library_accepted)(const char* path, const char* symbol);
  /* For a driver function fetched with dlsym under its exported name
     (cuMemAlloc_v2): the function to give instead, or real. */
  void* (*driver_symbol)(const char* exported, void* real, gpupool_driver_lookup_fn lookup);
  /* For a driver entry point a library fetched through its own
     cuGetProcAddress (real, at `version` with `flags`): gpupool's where it is
     a watched call, else real; never one that takes a call over. */
  void* (*watched_driver_entry)(const char* symbol, int version, unsigned long long flags, void* real);
  /* The driver's cuStreamDestroy (`real`, its CUresult) that a program linked
     with the driver called directly: called with gpupool's books kept around it. */
  int (*driver_stream_destroy)(void* stream, int (*real)(void* stream));
  /* The same for the driver's cuDevicePrimaryCtxReset (`real`) of a device. */
  int (*driver_device_reset)(int device, int (*real)(int device));
  /* The driver's cuMemFree (`real`): the pool's if gpupool lent the memory. */
  int (*driver_mem_free)(unsigned long long ptr, int (*real)(unsigned long long ptr));
  /* The same for the driver's cuMemFreeAsync, and its per-thread version (a
     null stream names the per-thread default stream). */
  int (*driver_mem_free_async)(unsigned long long ptr, void* stream, int (*real)(unsigned long long ptr, void* stream));
  int (*driver_mem_free_async_ptsz)(unsigned long long ptr, void* stream,
                                    int (*real)(unsigned long long ptr, void* stream));
  /* The driver's cuIpcGetMemHandle (`real`): refused for a block gpupool
     lent whose handle would name other memory (as cudaIpcGetMemHandle). */
  int (*driver_ipc_get_mem_handle)(void* handle, unsigned long long ptr,
                                   int (*real)(void* handle, unsigned long long ptr));
  /* The driver's capture calls (`real`), with gpupool's books kept as for
     the runtime's: the begin's first version (no mode), its second, the
     begin into a graph, and the end; each with its per-thread version (a
     null stream names the calling thread's default stream). */
  int (*driver_begin_capture_v1)(void* stream, int (*real)(void* stream));
  int (*driver_begin_capture_v1_ptsz)(void* stream, int (*real)(void* stream));
  int (*driver_begin_capture)(void* stream, int mode, int (*real)(void* stream, int mode));
  int (*driver_begin_capture_ptsz)(void* stream, int mode, int (*real)(void* stream, int mode));
  int (*driver_begin_capture_to_graph)(void* stream, void* graph, const void* deps, const void* data, size_t count,
                                       int mode, gpupool_begin_capture_to_graph_fn real);
  int (*driver_begin_capture_to_graph_ptsz)(void* stream, void* graph, const void* deps, const void* data,
                                            size_t count, int mode, gpupool_begin_capture_to_graph_fn real);
  int (*driver_end_capture)(void* stream, void** graph, int (*real)(void* stream, void** graph));
  int (*driver_end_capture_ptsz)(void* stream, void** graph, int (*real)(void* stream, void** graph));
  /* The runtime's own function `name` (an intercepted call), the one gpupool
     passes such calls on to, or NULL where it has none (no runtime loaded,
     or one older than the call): what a lookup of `name` stands for. */
  const void* (*real_function)(const char* name);
};

/* The core's one exported function: its table, or NULL for another abi. */
typedef const struct gpupool_core* (*gpupool_core_open_fn)(int abi, gpupool_lookup_fn lookup,
                                                          gpupool_caller_fn caller,
                                                          gpupool_stderr_fn stderr_takes_lines);
#define GPUPOOL_CORE_OPEN "gpupool_core_open"

#ifdef __cplusplus
}
#endif

#endif
