// The pool's upstream on a real (or simulated) CUDA device: segments from the
// runtime's cudaMalloc/cudaFree, fences from its events. Errors of these
// internal calls are cleared from the runtime's last-error state, and an error
// the program had left there is kept for it (see thread_state.hpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "pool/upstream.hpp"
#include "shim/thread_state.hpp"
#include "shim/unsafe_call_rules.hpp"

namespace gpupool::shim {

class CudaUpstream final : public Upstream {
 public:
  // `rules`: the process's, which captures on every device feed. `alone`:
  // the process sees no other device, so `device` is always the current one.
  CudaUpstream(int device, const UnsafeCallRules& rules, bool alone)
      : device_(device), alone_(alone), unsafe_call_rules_(rules) {}

  DevicePtr allocate_segment(std::size_t bytes) override;
  bool release_segment(DevicePtr base, std::size_t bytes) override;
  bool failed_for_memory() const override {
    return last_error_ == cudaSuccess || last_error_ == cudaErrorMemoryAllocation;
  }
  // What the last allocate_segment or map_pages returned: the error to give
  // the program when the pool reports a device error.
  cudaError_t last_error() const { return last_error_; }
  EventHandle create_event() override;
  void destroy_event(EventHandle event) override;
  bool record_event(EventHandle event, StreamId stream) override;
  bool wait_event(StreamId stream, EventHandle event) override;
  EventStatus query_event(EventHandle event) override;
  EventStatus query_stream(StreamId stream) override;
  // The runtime said the handle names no stream. (CUDA's documentation
  // leaves a destroyed stream's use undefined; the runtime answers so while
  // the handle is not another stream's, and gpupool then names it no more.)
  bool failed_for_gone_stream() const override;
  bool synchronize_event(EventHandle event) override;
  bool synchronize_stream(StreamId stream) override;
  bool synchronize_device() override;
  // The program's cudaFree with free_synchronizes:1: waits for all work on
  // this device (the runtime's cudaFree waits for the memory's own device).
  // The error is the program's to see (an earlier kernel's), not internal.
  cudaError_t synchronize_for_free();
  // Whether the runtime says the stream is capturing now (false if it cannot say).
  bool capturing(StreamId stream);
  // Whether the runtime says `addr` is this device's memory now (nothing if
  // it cannot say).
  std::optional<bool> device_memory_at(DevicePtr addr);
  StreamId legacy_stream() const override;
  bool capture_forbids_unsafe_calls() const override { return unsafe_call_rules_.forbid_this_thread(); }
  bool memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  // Virtual memory through the driver's cuMem* calls (found with
  // cudaGetDriverEntryPointByVersion): one physical allocation per page, so
  // any page can be given back alone. page_size() is 0 where unsupported.
  std::size_t page_size() const override;
  DevicePtr reserve_address_space(std::size_t bytes) override;
  bool map_pages(DevicePtr addr, std::size_t bytes) override;
  std::size_t unmap_pages(DevicePtr addr, std::size_t bytes) override;
  // Device `accessor` (below Page::kDevices) may now reach this device's
  // memory as `flags` says: read, or read and write (peer access, or the
  // default pool opened to it); called again, the flags change. Mapped pages,
  // now and later, open to it so (cudaMalloc memory does). Where the driver
  // refuses a page, a line says so, the pages changed before it go back as
  // they were, and the device keeps what it had, so that later pages still
  // map.
  void set_accessor(int accessor, CUmemAccess_flags flags);
  // That access was taken away: every page open to it closes, later ones
  // stay closed (a line if the driver refuses: those pages stay open).
  void remove_accessor(int accessor);
  // cudaDeviceReset released every page: forget them.
  void forget_pages() { pages_.clear(); }

 private:
  struct Access {
    int device;
    CUmemAccess_flags flags;
  };
  CUresult set_access(DevicePtr addr, std::size_t bytes, const std::vector<Access>& access);
  // New pages the driver would not open to every accessor: opened to the
  // device alone, then to each accessor it accepts (one it refuses leaves
  // the list; the pages open to it before stay so until it is removed).
  // False if not even that.
  bool open_to_accessors_alone(DevicePtr addr, std::size_t bytes);
  // A line: the driver refused to give `accessor` `wanted`; it keeps `kept`.
  void tell_refused(int accessor, CUresult err, CUmemAccess_flags wanted, CUmemAccess_flags kept) const;
  // A mapped page, and how it is open to the other devices: what the driver
  // accepted, so that taking access away closes exactly what is open.
  struct Page {
    static constexpr int kDevices = 64;  // a bit each in readers and writers
    unsigned long long handle;  // the physical memory
    std::uint64_t readers = 0;  // a bit per other device that may read it
    std::uint64_t writers = 0;  // those that may also write it
    CUmemAccess_flags access_of(int device) const;
    void set(int device, CUmemAccess_flags flags);
  };
  using Pages = std::unordered_map<DevicePtr, Page>;
  // One device's access to one page, the page's books following where the
  // driver accepts.
  CUresult set_page(Pages::iterator page, int accessor, CUmemAccess_flags flags);
  // The books of the pages [addr, addr + bytes), which the driver opened to
  // `access`.
  void opened(DevicePtr addr, std::size_t bytes, const Access& access);

  int device_;
  bool alone_;
  const UnsafeCallRules& unsafe_call_rules_;
  cudaError_t last_error_ = cudaSuccess;
  mutable std::size_t page_ = 1;  // 1: not asked yet
  Pages pages_;
  std::vector<Access> accessors_;  // peers that may access this device's memory, and how
};

// A monotonic clock for the pool's timings, counting from when it was made
// (gpupool's start): the report's times (out-of-memory events, the timeline)
// are seconds into the run, not since the machine booted.
class SteadyClock final : public Clock {
 public:
  SteadyClock();
  std::uint64_t now_ns() override;
  void restart();  // now reads 0 again (a forked child's clock starts at the fork)

 private:
  std::uint64_t origin_;
};

}  // namespace gpupool::shim
