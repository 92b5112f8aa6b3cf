#include "sim/memory.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <limits>

#include "sim/counters.hpp"

namespace simcuda {

namespace {

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  std::size_t n = std::strtoull(v, &end, 10);
  switch (end != nullptr ? *end : '\0') {
    case 'k': case 'K': n <<= 10; break;
    case 'm': case 'M': n <<= 20; break;
    case 'g': case 'G': n <<= 30; break;
    case 't': case 'T': n <<= 40; break;
    default: break;
  }
  return n;
}

constexpr std::size_t kPage = 4096;

}  // namespace

Memory& Memory::instance() {
  static Memory* memory = new Memory();
  return *memory;
}

Memory::Memory()
    : capacity_(env_size("SIMCUDA_MEMORY", std::size_t{16} << 30)),
      devices_(static_cast<int>(env_size("SIMCUDA_DEVICES", 1))),
      fail_rate_(std::getenv("SIMCUDA_FAIL_RATE") ? std::atof(std::getenv("SIMCUDA_FAIL_RATE")) : 0.0),
      fail_after_(env_size("SIMCUDA_FAIL_AFTER", std::numeric_limits<std::size_t>::max())),
      rng_(env_size("SIMCUDA_FAIL_SEED", 1)) {
  if (devices_ < 1) devices_ = 1;
  used_.assign(static_cast<std::size_t>(devices_), 0);
}

cudaError_t Memory::allocate(int device, std::size_t size, void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  counters().malloc_calls++;
  const std::size_t rounded = (size + 511) / 512 * 512;
  std::size_t& used = used_[static_cast<std::size_t>(device)];
  bool inject = successes_ >= fail_after_;
  if (fail_rate_ > 0.0) inject |= std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < fail_rate_;
  if (inject || rounded > capacity_ || used > capacity_ - rounded) {
    counters().malloc_failures++;
    return cudaErrorMemoryAllocation;
  }
  const std::size_t mapped = (rounded + kPage - 1) / kPage * kPage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    counters().malloc_failures++;
    return cudaErrorMemoryAllocation;
  }
  ++successes_;
  used += rounded;
  live_.emplace(reinterpret_cast<std::uintptr_t>(p), Allocation{rounded, mapped, device});
  const std::uint64_t in_use = counters().bytes_in_use += rounded;
  if (in_use > counters().peak_bytes_in_use) counters().peak_bytes_in_use = in_use;
  *out = p;
  return cudaSuccess;
}

cudaError_t Memory::release(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end()) return cudaErrorInvalidValue;
  // Unmapped at once: a use after free faults instead of passing silently.
  munmap(ptr, it->second.mapped);
  used_[static_cast<std::size_t>(it->second.device)] -= it->second.size;
  counters().bytes_in_use -= it->second.size;
  live_.erase(it);
  return cudaSuccess;
}

bool Memory::contains(const void* ptr, std::size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second.size;
}

void Memory::info(int device, std::size_t* free_bytes, std::size_t* total_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  *total_bytes = capacity_;
  *free_bytes = capacity_ - used_[static_cast<std::size_t>(device)];
}

}  // namespace simcuda
