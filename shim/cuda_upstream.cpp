#include "shim/cuda_upstream.hpp"

#include <cuda.h>
#include <time.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "shim/messages.hpp"
#include "shim/real_cuda.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {

// Runs `call` with `device` current, restoring the caller's device after.
// `alone`: the only device the process sees, which is always current.
template <typename Call>
cudaError_t on_device(int device, bool alone, Call&& call) {
  if (alone) return call();
  const RealCuda& r = real();
  int current = device;
  if (r.cudaGetDevice != nullptr) r.cudaGetDevice(&current);
  if (current == device || r.cudaSetDevice == nullptr) return call();
  r.cudaSetDevice(device);
  const cudaError_t err = call();
  r.cudaSetDevice(current);
  return err;
}

cudaEvent_t as_event(EventHandle e) { return reinterpret_cast<cudaEvent_t>(e); }

// Runs an allocation the pool makes for itself (a segment, address space,
// pages) with this thread's capture mode relaxed. CUDA counts allocations as
// unsafe while a global-mode capture runs, from any thread, and invalidates
// the capture; yet new memory changes nothing a graph records (PyTorch's
// allocator allocates so during its captures). A capture may begin on
// another thread at any moment: done always, two calls beside an allocation.
template <typename Call>
auto relaxed(Call&& call) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = real().cudaThreadExchangeStreamCaptureMode != nullptr &&
                         internal([&](const RealCuda& r) { return r.cudaThreadExchangeStreamCaptureMode(&mode); }) ==
                             cudaSuccess;
  auto result = call();
  if (exchanged) internal([&](const RealCuda& r) { return r.cudaThreadExchangeStreamCaptureMode(&mode); });
  return result;
}

// The driver's virtual memory calls, or nulls where the runtime cannot give them.
struct DriverVmm {
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  bool complete() const { return reserve && create && release && map && unmap && set_access && granularity; }
};

void* driver_function(const char* name) {
  const RealCuda& r = real();
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  if (r.cudaGetDriverEntryPointByVersion != nullptr) {
    if (r.cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) != cudaSuccess) {
      r.cudaGetLastError();
    }
  } else if (r.cudaGetDriverEntryPoint != nullptr) {
    if (r.cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &status) != cudaSuccess) r.cudaGetLastError();
  }
  return status == cudaDriverEntryPointSuccess ? fn : nullptr;
}

const DriverVmm& driver_vmm() {
  static DriverVmm vmm;
  static std::once_flag once;
  std::call_once(once, [] {
    vmm.reserve = reinterpret_cast<decltype(vmm.reserve)>(driver_function("cuMemAddressReserve"));
    vmm.create = reinterpret_cast<decltype(vmm.create)>(driver_function("cuMemCreate"));
    vmm.release = reinterpret_cast<decltype(vmm.release)>(driver_function("cuMemRelease"));
    vmm.map = reinterpret_cast<decltype(vmm.map)>(driver_function("cuMemMap"));
    vmm.unmap = reinterpret_cast<decltype(vmm.unmap)>(driver_function("cuMemUnmap"));
    vmm.set_access = reinterpret_cast<decltype(vmm.set_access)>(driver_function("cuMemSetAccess"));
    vmm.granularity =
        reinterpret_cast<decltype(vmm.granularity)>(driver_function("cuMemGetAllocationGranularity"));
  });
  return vmm;
}

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

DevicePtr CudaUpstream::allocate_segment(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = relaxed([&] {
    return on_device(device_, alone_, [&] { return internal([&](const RealCuda& r) { return r.cudaMalloc(&p, bytes); }); });
  });
  last_error_ = err;
  return err == cudaSuccess ? reinterpret_cast<DevicePtr>(p) : 0;
}

bool CudaUpstream::release_segment(DevicePtr base, std::size_t) {
  // Relaxed as the allocation was: the pool gives memory back only where its
  // books know no capture that forbids it (see synchronize_event).
  const cudaError_t err = relaxed([&] {
    return on_device(device_, alone_, [&] {
      return internal([&](const RealCuda& r) { return r.cudaFree(reinterpret_cast<void*>(base)); });
    });
  });
  return err == cudaSuccess;  // refused, the memory is still on the device: the pool keeps it
}

EventHandle CudaUpstream::create_event() {
  cudaEvent_t e = nullptr;
  const cudaError_t err = on_device(device_, alone_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaEventCreateWithFlags(&e, cudaEventDisableTiming); });
  });
  return err == cudaSuccess ? reinterpret_cast<EventHandle>(e) : 0;
}

void CudaUpstream::destroy_event(EventHandle event) {
  internal([&](const RealCuda& r) { return r.cudaEventDestroy(as_event(event)); });
}

namespace {
// What the calling thread's last call naming a stream returned, for
// failed_for_gone_stream right after it. Per thread, not per upstream: a
// free on another device's stream records on that device's upstream
// without its pool's lock.
thread_local cudaError_t t_last_stream_error = cudaSuccess;

// A per-thread stream named from another thread: no call can be made on it.
bool no_stream_handle() {
  t_last_stream_error = cudaErrorInvalidValue;
  return false;
}
}  // namespace

bool CudaUpstream::failed_for_gone_stream() const { return t_last_stream_error == cudaErrorInvalidResourceHandle; }

// Stream calls run with this upstream's device current: the legacy and
// per-thread handles name that device's stream only then, and an event is
// recorded only on a stream of the device it was created on. A program may
// free on one device while another is current, or order on another device's
// stream with cudaMallocAsync.
bool CudaUpstream::record_event(EventHandle event, StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return no_stream_handle();
  t_last_stream_error = on_device(device_, alone_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaEventRecord(as_event(event), s); });
  });
  return t_last_stream_error == cudaSuccess;
}

bool CudaUpstream::wait_event(StreamId stream, EventHandle event) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return no_stream_handle();
  t_last_stream_error = on_device(device_, alone_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaStreamWaitEvent(s, as_event(event), 0); });
  });
  return t_last_stream_error == cudaSuccess;
}

EventStatus CudaUpstream::query_event(EventHandle event) {
  const cudaError_t err = internal([&](const RealCuda& r) { return r.cudaEventQuery(as_event(event)); });
  if (err == cudaSuccess) return EventStatus::Complete;
  return err == cudaErrorNotReady ? EventStatus::Pending : EventStatus::Error;
}

EventStatus CudaUpstream::query_stream(StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) {
    no_stream_handle();
    return EventStatus::Error;
  }
  t_last_stream_error =
      on_device(device_, alone_, [&] { return internal([&](const RealCuda& r) { return r.cudaStreamQuery(s); }); });
  if (t_last_stream_error == cudaSuccess) return EventStatus::Complete;
  return t_last_stream_error == cudaErrorNotReady ? EventStatus::Pending : EventStatus::Error;
}

// The pool waits on the host only where its books know no capture that the
// wait could break. Yet CUDA may still count one on this thread: a
// thread-local capture begun here whose device another thread reset keeps
// refusing this thread's waits. Relaxed, the waits go through, as the pool's
// allocations do.
bool CudaUpstream::synchronize_event(EventHandle event) {
  return relaxed([&] {
           return internal([&](const RealCuda& r) { return r.cudaEventSynchronize(as_event(event)); });
         }) == cudaSuccess;
}

bool CudaUpstream::synchronize_stream(StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s)) return no_stream_handle();
  t_last_stream_error = on_device(device_, alone_, [&] {
    return relaxed([&] { return internal([&](const RealCuda& r) { return r.cudaStreamSynchronize(s); }); });
  });
  return t_last_stream_error == cudaSuccess;
}

bool CudaUpstream::synchronize_device() {
  return on_device(device_, alone_, [] {
           return relaxed([] { return internal([](const RealCuda& r) { return r.cudaDeviceSynchronize(); }); });
         }) == cudaSuccess;
}

cudaError_t CudaUpstream::synchronize_for_free() {
  return on_device(device_, alone_, [] { return real().cudaDeviceSynchronize(); });
}

bool CudaUpstream::capturing(StreamId stream) {
  cudaStream_t s = nullptr;
  if (!stream_handle(stream, &s) || real().cudaStreamIsCapturing == nullptr) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = on_device(device_, alone_, [&] {
    return internal([&](const RealCuda& r) { return r.cudaStreamIsCapturing(s, &status); });
  });
  return err == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

std::optional<bool> CudaUpstream::device_memory_at(DevicePtr addr) {
  if (real().cudaPointerGetAttributes == nullptr) return std::nullopt;
  cudaPointerAttributes attributes{};
  const cudaError_t err = internal([&](const RealCuda& r) {
    return r.cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(addr));
  });
  // Runtimes before CUDA 11 refuse an address they do not know.
  if (err == cudaErrorInvalidValue) return false;
  if (err != cudaSuccess) return std::nullopt;
  return attributes.type == cudaMemoryTypeDevice && attributes.device == device_;
}

StreamId CudaUpstream::legacy_stream() const { return kLegacyStream; }

bool CudaUpstream::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  return on_device(device_, alone_, [&] {
           return internal([&](const RealCuda& r) { return r.cudaMemGetInfo(free_bytes, total_bytes); });
         }) == cudaSuccess;
}

std::size_t CudaUpstream::page_size() const {
  if (page_ == 1) {
    page_ = 0;
    const DriverVmm& vmm = driver_vmm();
    std::size_t granularity = 0;
    const CUmemAllocationProp prop = device_memory(device_);
    if (vmm.complete() &&
        vmm.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS &&
        granularity != 0) {
      // Pages of at least 2 MiB, as the device's own large pages.
      page_ = (2 * kMiB + granularity - 1) / granularity * granularity;
    }
  }
  return page_;
}

DevicePtr CudaUpstream::reserve_address_space(std::size_t bytes) {
  if (page_size() == 0) return 0;
  CUdeviceptr base = 0;
  const CUresult err = relaxed([&] { return driver_vmm().reserve(&base, bytes, page_, 0, 0); });
  return err == CUDA_SUCCESS ? static_cast<DevicePtr>(base) : 0;
}

CUresult CudaUpstream::set_access(DevicePtr addr, std::size_t bytes, const std::vector<Access>& access) {
  std::vector<CUmemAccessDesc> descs;
  for (const Access& a : access) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = a.device;
    desc.flags = a.flags;
    descs.push_back(desc);
  }
  return driver_vmm().set_access(static_cast<CUdeviceptr>(addr), bytes, descs.data(), descs.size());
}

bool CudaUpstream::map_pages(DevicePtr addr, std::size_t bytes) {
  const DriverVmm& vmm = driver_vmm();
  const CUmemAllocationProp prop = device_memory(device_);
  auto map_all = [&] {
    std::size_t done = 0;
    CUresult err = CUDA_SUCCESS;
    for (; done < bytes; done += page_) {
      // Still mapped: an undo below whose unmap the driver refused.
      if (pages_.count(addr + done) != 0) continue;
      CUmemGenericAllocationHandle handle = 0;
      err = vmm.create(&handle, page_, &prop, 0);
      if (err != CUDA_SUCCESS) break;
      err = vmm.map(static_cast<CUdeviceptr>(addr + done), page_, 0, handle, 0);
      if (err != CUDA_SUCCESS) {
        vmm.release(handle);
        break;
      }
      pages_.emplace(addr + done, Page{handle});
    }
    std::vector<Access> access{{device_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
    access.insert(access.end(), accessors_.begin(), accessors_.end());
    if (err == CUDA_SUCCESS) err = set_access(addr, bytes, access);
    if (err == CUDA_SUCCESS) {
      for (const Access& a : accessors_) opened(addr, bytes, a);
    }
    if (err != CUDA_SUCCESS && done == bytes && !accessors_.empty() && open_to_accessors_alone(addr, bytes)) {
      err = CUDA_SUCCESS;
    }
    // Undo what was mapped: new pages, no work on them. Pages the driver
    // refuses stay mapped here, out of the pool's count, until it maps them.
    if (err != CUDA_SUCCESS) unmap_pages(addr, done);
    return err;
  };
  const CUresult err = relaxed(map_all);
  // The driver's error numbers and the runtime's agree for what these calls
  // return (out of memory 2, invalid value 1, illegal address 700, ...).
  last_error_ = static_cast<cudaError_t>(err);
  return err == CUDA_SUCCESS;
}

std::size_t CudaUpstream::unmap_pages(DevicePtr addr, std::size_t bytes) {
  const DriverVmm& vmm = driver_vmm();
  return relaxed([&] {
    for (DevicePtr page = addr; page < addr + bytes; page += page_) {
      auto it = pages_.find(page);
      if (it == pages_.end()) continue;
      if (vmm.unmap(static_cast<CUdeviceptr>(page), page_) != CUDA_SUCCESS) return static_cast<std::size_t>(page - addr);
      // A refused release leaves the memory behind its handle with the
      // driver, out of gpupool's sight; the address is free to map again.
      vmm.release(it->second.handle);
      pages_.erase(it);
    }
    return bytes;
  });
}

bool CudaUpstream::open_to_accessors_alone(DevicePtr addr, std::size_t bytes) {
  if (set_access(addr, bytes, {{device_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}}) != CUDA_SUCCESS) return false;
  std::vector<int> refused;
  for (Access& a : accessors_) {
    if (const CUresult err = set_access(addr, bytes, {a}); err != CUDA_SUCCESS) {
      tell_refused(a.device, err, a.flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
      // Read and write where reading alone was refused, as set_accessor does.
      const Access wider{a.device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      const CUresult wider_err =
          a.flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? set_access(addr, bytes, {wider}) : CUDA_ERROR_NOT_SUPPORTED;
      if (wider_err == CUDA_SUCCESS) {
        a = wider;
      } else {
        if (a.flags == CU_MEM_ACCESS_FLAGS_PROT_READ) {
          tell_refused(a.device, wider_err, wider.flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);  // the new pages: none
        }
        refused.push_back(a.device);
        continue;
      }
    }
    opened(addr, bytes, a);
  }
  std::erase_if(accessors_, [&](const Access& a) {
    return std::find(refused.begin(), refused.end(), a.device) != refused.end();
  });
  return true;
}

void CudaUpstream::opened(DevicePtr addr, std::size_t bytes, const Access& access) {
  for (DevicePtr page = addr; page < addr + bytes; page += page_) {
    if (const auto it = pages_.find(page); it != pages_.end()) it->second.set(access.device, access.flags);
  }
}

CUresult CudaUpstream::set_page(Pages::iterator page, int accessor, CUmemAccess_flags flags) {
  const CUresult err = relaxed([&] { return set_access(page->first, page_, {{accessor, flags}}); });
  if (err == CUDA_SUCCESS) page->second.set(accessor, flags);
  return err;
}

void CudaUpstream::set_accessor(int accessor, CUmemAccess_flags flags) {
  if (accessor == device_ || accessor < 0 || accessor >= Page::kDevices) return;
  const auto known =
      std::find_if(accessors_.begin(), accessors_.end(), [&](const Access& a) { return a.device == accessor; });
  const CUmemAccess_flags before = known != accessors_.end() ? known->flags : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  if (flags == before) return;
  if (page_size() != 0) {
    std::vector<std::pair<Pages::iterator, CUmemAccess_flags>> changed;  // and how each was
    for (auto it = pages_.begin(); it != pages_.end(); ++it) {
      const CUmemAccess_flags was = it->second.access_of(accessor);
      if (was == flags) continue;
      if (const CUresult err = set_page(it, accessor, flags); err != CUDA_SUCCESS) {
        tell_refused(accessor, err, flags, was);
        // The device keeps what it had, in the list and on every page: the
        // pages changed so far go back as each was.
        for (const auto& [page, old] : changed) {
          if (const CUresult undo = set_page(page, accessor, old); undo != CUDA_SUCCESS) {
            tell_refused(accessor, undo, old, flags);
            break;
          }
        }
        // A driver without read-only mappings: read and write, more than
        // asked, where less would fault the program's reads.
        if (flags == CU_MEM_ACCESS_FLAGS_PROT_READ) set_accessor(accessor, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        return;
      }
      changed.emplace_back(it, was);
    }
  }
  if (known != accessors_.end()) {
    known->flags = flags;
  } else {
    accessors_.push_back({accessor, flags});
  }
}

void CudaUpstream::remove_accessor(int accessor) {
  std::erase_if(accessors_, [&](const Access& a) { return a.device == accessor; });
  if (accessor < 0 || accessor >= Page::kDevices) return;
  for (auto it = pages_.begin(); it != pages_.end(); ++it) {
    const CUmemAccess_flags was = it->second.access_of(accessor);
    if (was == CU_MEM_ACCESS_FLAGS_PROT_NONE) continue;
    if (const CUresult err = set_page(it, accessor, CU_MEM_ACCESS_FLAGS_PROT_NONE); err != CUDA_SUCCESS) {
      tell_refused(accessor, err, CU_MEM_ACCESS_FLAGS_PROT_NONE, was);
      return;
    }
  }
}

CUmemAccess_flags CudaUpstream::Page::access_of(int device) const {
  if ((writers >> device & 1u) != 0) return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return (readers >> device & 1u) != 0 ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

void CudaUpstream::Page::set(int device, CUmemAccess_flags flags) {
  const std::uint64_t bit = std::uint64_t{1} << device;
  readers = flags != CU_MEM_ACCESS_FLAGS_PROT_NONE ? readers | bit : readers & ~bit;
  writers = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? writers | bit : writers & ~bit;
}

void CudaUpstream::tell_refused(int accessor, CUresult err, CUmemAccess_flags wanted, CUmemAccess_flags kept) const {
  const std::string owner = std::to_string(device_);
  const std::string other = std::to_string(accessor);
  const std::string call = " (cuMemSetAccess: error " + std::to_string(err) + ")";
  std::string line;
  if (wanted == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
    line = "gpupool: the driver refused to close device " + owner + "'s pooled pages to device " + other + call +
           ": they stay open to it";
  } else if (wanted == CU_MEM_ACCESS_FLAGS_PROT_READ && kept == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    line = "gpupool: the driver refused to make device " + owner + "'s pooled pages read-only to device " + other +
           call + ": device " + other + " may still write them";
  } else if (wanted == CU_MEM_ACCESS_FLAGS_PROT_READ) {
    line = "gpupool: the driver refused to open device " + owner + "'s pooled pages to device " + other +
           " for reading alone" + call + ": gpupool opens them for writing too";
  } else {
    line = "gpupool: the driver refused to open device " + owner + "'s pooled pages to device " + other + call +
           ": device " + other + " cannot " + (kept == CU_MEM_ACCESS_FLAGS_PROT_NONE ? "reach" : "write") +
           " all the memory gpupool serves on device " + owner +
           ". GPUPOOL_EXPANDABLE_SEGMENTS=0 serves cudaMalloc memory, which the runtime opens";
  }
  message(config::LogLevel::Warn, line);
}

namespace {
std::uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}
}  // namespace

SteadyClock::SteadyClock() : origin_(monotonic_ns()) {}

std::uint64_t SteadyClock::now_ns() { return monotonic_ns() - origin_; }

void SteadyClock::restart() { origin_ = monotonic_ns(); }

}  // namespace gpupool::shim
