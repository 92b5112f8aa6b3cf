// The only way the pool reaches the device. The shim implements it with the real
// CUDA runtime, tests with a fake, the replay tool with pure accounting.
//
// Contract (in the spirit of RMM's device_memory_resource):
// - Every call is made with the owning DevicePool's lock held, from whichever
//   thread called the pool; implementations need no locking of their own for the
//   pool's sake but must tolerate being called from many threads in turn.
// - Nothing here throws. Failures are return values.
// - Stream ordering: record_event(e, s) captures all work queued on s so far;
//   wait_event(t, e) makes work queued on t afterwards wait for it on the device,
//   without blocking the host. query_event never blocks. synchronize_* block the
//   host and are used only off the fast path.
// - release_segment may block the host (cudaFree synchronizes the device).
//   False where the runtime refused: the memory is still the pool's.
#pragma once

#include <cstddef>

#include "pool/types.hpp"

namespace gpupool {

enum class EventStatus : std::uint8_t { Complete, Pending, Error };

class Upstream {
 public:
  virtual ~Upstream() = default;

  // Device memory: a whole segment, at least 512-byte aligned. 0 when the device
  // cannot provide it (the pool then releases cache and retries once).
  virtual DevicePtr allocate_segment(std::size_t bytes) = 0;
  virtual bool release_segment(DevicePtr base, std::size_t bytes) = 0;
  // Whether the last failed allocate_segment or map_pages failed for want of
  // memory. False for a device error (no usable driver, a sticky error left by
  // a faulting kernel): freeing cache cannot cure that, and the pool passes
  // it on as what it is rather than as an out-of-memory.
  virtual bool failed_for_memory() const { return true; }

  // Events used as fences. create_event returns 0 on failure.
  virtual EventHandle create_event() = 0;
  virtual void destroy_event(EventHandle event) = 0;
  virtual bool record_event(EventHandle event, StreamId stream) = 0;
  virtual bool wait_event(StreamId stream, EventHandle event) = 0;
  virtual EventStatus query_event(EventHandle event) = 0;
  // Complete when all work queued on the stream so far has finished.
  virtual EventStatus query_stream(StreamId stream) = 0;
  // Whether the last record_event, wait_event, query_stream or
  // synchronize_stream that failed did so because the runtime does not know
  // the stream (cudaErrorInvalidResourceHandle): it was destroyed where the
  // pool could not see it, and its handle not given to a new stream yet.
  // Asked only right after such a failure. Optional.
  virtual bool failed_for_gone_stream() const { return false; }
  virtual bool synchronize_event(EventHandle event) = 0;
  virtual bool synchronize_stream(StreamId stream) = 0;
  // All work queued on the device so far, on every stream (cudaDeviceSynchronize).
  // Needs no event: the pool's wait when its events cannot be made or recorded.
  virtual bool synchronize_device() = 0;

  // The stream that is a barrier for all blocking streams.
  virtual StreamId legacy_stream() const = 0;

  // Whether a stream capture under way forbids the calling thread what CUDA
  // counts as unsafe (cudaFree, cudaDeviceSynchronize), on any device: a
  // global-mode capture of any thread does, a thread-local one of this
  // thread's does, a relaxed one does not. Such a call would invalidate the
  // capture. The pool knows its own device's captures (and makes none of
  // these calls during them, whatever their mode); this tells it of the
  // others. Optional: a single device needs none.
  virtual bool capture_forbids_unsafe_calls() const { return false; }

  // Virtual memory, for expandable segments. Optional: page_size() 0 means
  // unsupported. Address space is reserved once; pages of it are backed with
  // device memory (map) and given back (unmap) one page_size() at a time. The
  // pool unmaps only pages whose last use has completed.
  virtual std::size_t page_size() const { return 0; }
  virtual DevicePtr reserve_address_space(std::size_t bytes) {
    (void)bytes;
    return 0;
  }
  virtual bool map_pages(DevicePtr addr, std::size_t bytes) {
    (void)addr;
    (void)bytes;
    return false;
  }
  // Unmaps from addr up, page by page, and stops at the first page the driver
  // refuses (a context broken by a fault): returns the bytes unmapped, all of
  // them where none was refused. The pages from there on stay mapped.
  virtual std::size_t unmap_pages(DevicePtr addr, std::size_t bytes) {
    (void)addr;
    return bytes;
  }

  // The device's free and total bytes, for out-of-memory diagnoses. Optional.
  virtual bool memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }
};

// A monotonic clock in nanoseconds; the pool uses it only to time upstream calls
// and to stamp timeline samples. Optional: without one, times read as zero.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::uint64_t now_ns() = 0;
};

}  // namespace gpupool
