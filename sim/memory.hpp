// Device memory of the simulated device: host memory from mmap, so tests can
// write patterns into blocks and check them. A capacity per device makes
// out-of-memory real; failures can be injected, seeded.
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
  static Memory& instance();

  cudaError_t allocate(int device, std::size_t size, void** out);
  cudaError_t release(void* ptr);
  // True when [ptr, ptr+bytes) lies inside one live allocation.
  bool contains(const void* ptr, std::size_t bytes) const;
  void info(int device, std::size_t* free_bytes, std::size_t* total_bytes) const;
  int devices() const { return devices_; }

 private:
  Memory();
  struct Allocation {
    std::size_t size;
    std::size_t mapped;
    int device;
  };
  mutable std::mutex mu_;
  std::map<std::uintptr_t, Allocation> live_;
  std::vector<std::size_t> used_;
  std::size_t capacity_;
  int devices_;
  double fail_rate_;
  std::uint64_t fail_after_;
  std::uint64_t successes_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace simcuda
