// The driver's virtual memory calls (cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, ...) on the simulated
// device, handed out through cudaGetDriverEntryPoint(ByVersion) as the real
// runtime hands out the driver's. SIMCUDA_NO_VMM=1 plays a driver without
// them (some virtualized GPUs): none is found.
#include "sim/vmm.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "sim/engine.hpp"
#include "sim/memory.hpp"

namespace simcuda {

namespace {

CUresult reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long) {
  if (ptr == nullptr || size == 0 || size % Memory::kGranularity != 0 || addr != 0 ||
      (alignment != 0 && alignment > Memory::kGranularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* p = Memory::instance().reserve_address_space(size);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult address_free(CUdeviceptr, size_t) { return CUDA_SUCCESS; }  // address space is kept

// Memory made or given back outside any stream, as cudaMalloc and cudaFree:
// the simulated device counts these as unsafe during a capture too.
CUresult create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                unsigned long long) {
  if (Engine::instance().check_unsafe_call() != cudaSuccess) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  // The runtime's error numbers and the driver's agree for a fault (700).
  if (const cudaError_t fault = current_device_fault(); fault != cudaSuccess) return static_cast<CUresult>(fault);
  if (handle == nullptr || prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
      prop->location.id >= Memory::instance().devices()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::uint64_t h = 0;
  // The runtime's error numbers and the driver's agree for these (1, 2, 700).
  const cudaError_t err = Memory::instance().create_physical(prop->location.id, size, &h);
  if (err != cudaSuccess) return static_cast<CUresult>(err);
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult release(CUmemGenericAllocationHandle handle) {
  return Memory::instance().release_physical(handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long) {
  if (offset != 0) return CUDA_ERROR_INVALID_VALUE;
  return Memory::instance().map(reinterpret_cast<void*>(ptr), size, handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// SIMCUDA_REFUSE_ACCESS=N[:close|:read|:open-after=K]: the device whose
// access cuMemSetAccess refuses to change (all changes; with ":close" only
// taking it away; with ":read" only giving read access alone, as a driver
// without read-only mappings; with ":open-after=K" opening, once K calls
// have opened it).
struct RefusedAccess {
  int device = -1;  // none
  bool closing_only = false;
  bool read_only = false;
  long opens_allowed = -1;  // -1: no count
};

const RefusedAccess& refused_access() {
  static const RefusedAccess refused = [] {
    RefusedAccess r;
    if (const char* v = std::getenv("SIMCUDA_REFUSE_ACCESS")) {
      r.device = std::atoi(v);
      r.closing_only = std::strstr(v, ":close") != nullptr;
      r.read_only = std::strstr(v, ":read") != nullptr;
      if (const char* after = std::strstr(v, ":open-after=")) r.opens_allowed = std::atol(after + 12);
    }
    return r;
  }();
  return refused;
}

bool refuses(const RefusedAccess& refused, const CUmemAccessDesc& desc) {
  static std::atomic<long> opens{0};
  if (desc.location.id != refused.device) return false;
  const bool opening = desc.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
  if (refused.closing_only) return !opening;
  if (refused.read_only) return desc.flags == CU_MEM_ACCESS_FLAGS_PROT_READ;
  if (refused.opens_allowed >= 0) return opening && opens.fetch_add(1) >= refused.opens_allowed;
  return true;
}

CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  const RefusedAccess& refused = refused_access();
  for (size_t i = 0; i < count; ++i) {
    if (refuses(refused, desc[i])) return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::uint64_t changed = 0;
  std::uint64_t readers = 0;
  std::uint64_t writers = 0;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= Memory::instance().devices()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    const CUmemAccess_flags flags = desc[i].flags;
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t bit = std::uint64_t{1} << desc[i].location.id;
    changed |= bit;
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) readers |= bit;
    if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) writers |= bit;
  }
  return Memory::instance().set_access(reinterpret_cast<void*>(ptr), size, changed, readers, writers)
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

CUresult unmap(CUdeviceptr ptr, size_t size) {
  if (Engine::instance().check_unsafe_call() != cudaSuccess) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (const cudaError_t fault = current_device_fault(); fault != cudaSuccess) return static_cast<CUresult>(fault);
  if (injected_unmap_failure(__builtin_return_address(0))) return CUDA_ERROR_UNKNOWN;
  return Memory::instance().unmap(reinterpret_cast<void*>(ptr), size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult granularity(size_t* out, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags) {
  if (out == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = Memory::kGranularity;
  return CUDA_SUCCESS;
}

}  // namespace

void* driver_entry_point(const char* symbol) {
  struct Entry {
    const char* name;
    void* function;
  };
  static const Entry kEntries[] = {
      {"cuMemAddressReserve", reinterpret_cast<void*>(&reserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&address_free)},
      {"cuMemCreate", reinterpret_cast<void*>(&create)},
      {"cuMemRelease", reinterpret_cast<void*>(&release)},
      {"cuMemMap", reinterpret_cast<void*>(&map)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&set_access)},
      {"cuMemUnmap", reinterpret_cast<void*>(&unmap)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&granularity)},
  };
  static const bool absent = [] {
    const char* v = std::getenv("SIMCUDA_NO_VMM");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (absent) return nullptr;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) == 0) return e.function;
  }
  return nullptr;
}

}  // namespace simcuda
