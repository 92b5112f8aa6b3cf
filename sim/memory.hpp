// Device memory of the simulated device: host memory from mmap, so tests can
// write patterns into blocks and check them. A capacity per device makes
// out-of-memory real; failures can be injected, seeded: SIMCUDA_FAIL_AFTER
// (successful allocations before every later one fails), SIMCUDA_FAIL_RATE
// (the chance that any one fails) and SIMCUDA_FAIL_ERROR (the error number
// they fail with: 2, out of memory, by default; 700, an illegal address, plays
// a device with a sticky error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <vector>

namespace simcuda {

class Memory {
 public:
  static constexpr int kMostDevices = 64;  // SIMCUDA_DEVICES above this is taken as this
  static Memory& instance();

  cudaError_t allocate(int device, std::size_t size, void** out);
  cudaError_t release(void* ptr);
  // True when [ptr, ptr+bytes) lies inside one live allocation.
  bool contains(const void* ptr, std::size_t bytes) const;
  // The device whose memory holds ptr (from cudaMalloc or mapped pages), or -1.
  int device_of(const void* ptr) const;
  void info(int device, std::size_t* free_bytes, std::size_t* total_bytes) const;
  int devices() const { return devices_; }

  // Virtual memory (the driver's cuMem* calls): address space from mmap with
  // no access, physical memory counted against the capacity, mapping grants
  // access and unmapping drops the contents.
  static constexpr std::size_t kGranularity = 2 << 20;
  void* reserve_address_space(std::size_t size);
  cudaError_t create_physical(int device, std::size_t size, std::uint64_t* handle);
  bool release_physical(std::uint64_t handle);
  bool map(void* ptr, std::size_t size, std::uint64_t handle);
  // Sets the access of the devices in `changed` (a bit each) to the mapped
  // range: read for those in `readers`, write too for those in `writers`,
  // none for the rest of them; the others keep what they had.
  bool set_access(void* ptr, std::size_t size, std::uint64_t changed, std::uint64_t readers, std::uint64_t writers);
  // Peer access (cudaDeviceEnablePeerAccess): `accessor` may use `owner`'s
  // cudaMalloc memory. Mapped pages need set_access for it, as on a GPU.
  cudaError_t enable_peer_access(int accessor, int owner);
  cudaError_t disable_peer_access(int accessor, int owner);
  // How `device` may access the device memory at ptr, as a
  // cudaMemAccessFlags value: 0 not at all, 1 read, 3 read and write.
  int access_from(const void* ptr, int device) const;
  bool unmap(void* ptr, std::size_t size);
  // cudaDeviceReset: every allocation and every physical page of the device
  // goes, mapped or not (later access faults), and so does peer access to
  // and from it. Address reservations stay.
  void reset(int device);

 private:
  Memory();
  bool inject_failure();  // seeded failures (SIMCUDA_FAIL_RATE, SIMCUDA_FAIL_AFTER)
  cudaError_t failure(bool injected) const { return injected ? fail_error_ : cudaErrorMemoryAllocation; }
  struct Allocation {
    std::size_t size;
    std::size_t mapped;
    int device;
  };
  mutable std::mutex mu_;
  std::map<std::uintptr_t, Allocation> live_;
  struct Physical {
    std::size_t size;
    int device;
    bool mapped;
  };
  struct Mapping {
    std::size_t size;
    std::uint64_t handle;
    bool accessible;
    std::uint64_t readers;  // a bit per device granted access
    std::uint64_t writers;  // those of them that may also write
  };
  std::map<std::uint64_t, Physical> physical_;
  std::map<std::uintptr_t, Mapping> mappings_;  // by start address
  std::uint64_t next_handle_ = 1;
  std::vector<std::size_t> used_;
  std::vector<std::uint64_t> peers_;  // by accessor: a bit per owner it may access
  std::size_t capacity_;
  int devices_;
  double fail_rate_;
  std::uint64_t fail_after_;
  cudaError_t fail_error_;
  std::uint64_t successes_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace simcuda
