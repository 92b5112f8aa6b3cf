/* Control and observation of the simulated CUDA runtime (tests only). A program
 * linked against the real runtime does not have these: look them up with
 * dlsym(RTLD_DEFAULT, "simcuda_counters") when they are optional.
 *
 * The environment sets the rest, read once (each where it is used):
 *   SIMCUDA_DEVICES=N           devices (1; at most 64)
 *   SIMCUDA_MEMORY=SIZE         each device's capacity, bytes or with K, M, G (16G)
 *   SIMCUDA_OP_DELAY_US=N       each queued operation first sleeps this long (0)
 *   SIMCUDA_FAIL_AFTER=N        allocations that succeed before every later one fails
 *   SIMCUDA_FAIL_RATE=P         the chance that an allocation fails
 *   SIMCUDA_FAIL_ERROR=E        the error those fail with (2, out of memory)
 *   SIMCUDA_EVENT_FAIL_RATE=P   the chance that gpupool's core has an event
 *                               creation, record or stream wait fail
 *   SIMCUDA_EVENT_QUERY_FAIL_RATE=P  the same for its cudaEventQuery (an
 *                               error, whether or not the event is done)
 *   SIMCUDA_HOST_WAIT_FAIL_RATE=P  the same for its cudaEventSynchronize,
 *                               cudaStreamSynchronize, cudaDeviceSynchronize
 *                               (all three: the runtime's calls, or the
 *                               driver's twins when gpupool serves a static
 *                               runtime)
 *   SIMCUDA_UNMAP_FAIL_RATE=P   the same for its cuMemUnmap (refused: the
 *                               page stays mapped), as a driver whose context
 *                               a fault broke
 *   SIMCUDA_FAIL_SEED=N         seeds the five kinds of injected failure (1)
 *   SIMCUDA_NO_VMM=1            no virtual memory calls (a driver without them)
 *   SIMCUDA_POOLLESS_DEVICE=N   device N has no stream-ordered allocator
 *   SIMCUDA_REFUSE_ACCESS=N[:close|:read|:open-after=K]  cuMemSetAccess
 *                               refuses to change device N's access to mapped
 *                               pages (CUDA_ERROR_NOT_SUPPORTED); with ":close"
 *                               only to take it away; with ":read" only to
 *                               give read access alone (a driver without
 *                               read-only mappings; pools still take it);
 *                               with ":open-after=K" to open it, once K calls
 *                               have opened it
 *   SIMCUDA_REFUSE_CAPTURING_DESTROY=1  cudaStreamDestroy refuses a stream
 *                               that captures (cudaErrorStreamCaptureUnsupported);
 *                               by default the capture ends with the stream
 *   SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE=1  a capture end refused on another
 *                               thread than the beginning one leaves the capture
 *                               going; by default it ends it, as CUDA 13 does
 *   SIMCUDA_REUSE_STREAM_HANDLES=1  a destroyed stream's handle names the next
 *                               stream made, while the old one's work may still run
 *   SIMCUDA_RESET_ERROR=refused|late  cudaDeviceReset answers with an error:
 *                               refused, it resets nothing
 *                               (cudaErrorNotPermitted); late, it resets and
 *                               returns an earlier launch's error
 *                               (cudaErrorLaunchFailure)
 *   SIMCUDA_POINTER_ATTRIBUTES=legacy  cudaPointerGetAttributes refuses an
 *                               address it does not know (cudaErrorInvalidValue),
 *                               as runtimes before CUDA 11 did
 *   SIMCUDA_COUNTERS_FILE=PATH  the counters below, as JSON, written at exit */
#ifndef SIMCUDA_H
#define SIMCUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct simcuda_counters {
  uint64_t malloc_calls;        /* cudaMalloc */
  uint64_t malloc_failures;     /* cudaMalloc or cuMemCreate that failed (capacity or injected) */
  uint64_t free_calls;          /* cudaFree of a non-null pointer */
  uint64_t malloc_async_calls;  /* cudaMallocAsync and cudaMallocFromPoolAsync */
  uint64_t free_async_calls;    /* cudaFreeAsync */
  uint64_t bytes_in_use;        /* cudaMalloc'd plus physical memory of cuMemCreate */
  uint64_t peak_bytes_in_use;
  uint64_t event_records;
  uint64_t stream_waits;
  uint64_t event_queries;
  uint64_t event_syncs;
  uint64_t stream_syncs;
  uint64_t device_syncs;
  uint64_t legacy_ops;          /* operations queued on the legacy stream */
  uint64_t captures_begun;
  uint64_t captures_invalidated;
  uint64_t kernel_launches;
  uint64_t vmm_maps;            /* cuMemMap */
  uint64_t vmm_unmaps;          /* cuMemUnmap */
  uint64_t stale_event_uses;    /* an event used after cudaDeviceReset destroyed it */
  uint64_t null_free_calls;     /* cudaFree(NULL): what programs call to create the CUDA context */
  uint64_t event_failures;      /* event calls failed on purpose (SIMCUDA_EVENT_FAIL_RATE) */
  uint64_t host_wait_failures;  /* host waits failed on purpose (SIMCUDA_HOST_WAIT_FAIL_RATE) */
  uint64_t event_query_failures; /* event queries failed on purpose (SIMCUDA_EVENT_QUERY_FAIL_RATE) */
  uint64_t get_device_calls;    /* cudaGetDevice: a call on the hot paths of a real runtime */
  uint64_t destroyed_stream_calls; /* calls naming a destroyed stream whose handle no stream has again
                                      (refused with cudaErrorInvalidResourceHandle) */
  uint64_t unmap_failures;      /* cuMemUnmap calls failed on purpose (SIMCUDA_UNMAP_FAIL_RATE) */
  uint64_t worker_wakeups;      /* times a stream's worker thread looked whether it could go on
                                   (its queue, or an operation it waits for) */
  uint64_t streams_tracked;     /* now: streams a legacy-stream operation looks at (alive, or
                                   destroyed with work queued; the legacy streams included) */
};

/* Queues a fault on `stream` (a cudaStream_t): once it runs, the stream's
 * device is broken for good, as after a kernel's illegal address. Its later
 * synchronizations, allocations, frees and event calls fail with `error` (a
 * cudaError_t), and so do the driver's cuMemCreate and cuMemUnmap made while
 * it is current. */
void simcuda_fault_stream(void* stream, int error);

/* The counters so far. */
void simcuda_get_counters(struct simcuda_counters* out);

/* 1 when `device` may access the device memory at ptr: its own, a peer's
 * cudaMalloc memory after cudaDeviceEnablePeerAccess, mapped pages that
 * cuMemSetAccess opened to it, a stream-ordered allocation whose pool
 * cudaMemPoolSetAccess opened to it; else 0. */
int simcuda_accessible(const void* ptr, int device);

/* How: 3 (cudaMemAccessFlagsProtReadWrite) where `device` may read and write
 * the memory at ptr, 1 (cudaMemAccessFlagsProtRead) where it may only read
 * (mapped pages or a pool opened read-only), 0 where it may not access it. */
int simcuda_access(const void* ptr, int device);

#ifdef __cplusplus
}
#endif

#endif
