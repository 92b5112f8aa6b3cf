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
      fail_error_(static_cast<cudaError_t>(env_size("SIMCUDA_FAIL_ERROR", cudaErrorMemoryAllocation))),
      rng_(env_size("SIMCUDA_FAIL_SEED", 1)) {
  if (devices_ < 1) devices_ = 1;
  if (devices_ > kMostDevices) devices_ = kMostDevices;
  used_.assign(static_cast<std::size_t>(devices_), 0);
  peers_.assign(static_cast<std::size_t>(devices_), 0);
}

bool Memory::inject_failure() {
  bool inject = successes_ >= fail_after_;
  if (fail_rate_ > 0.0) inject |= std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < fail_rate_;
  return inject;
}

cudaError_t Memory::allocate(int device, std::size_t size, void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  counters().malloc_calls++;
  const std::size_t rounded = (size + 511) / 512 * 512;
  std::size_t& used = used_[static_cast<std::size_t>(device)];
  const bool injected = inject_failure();
  if (injected || rounded > capacity_ || used > capacity_ - rounded) {
    counters().malloc_failures++;
    return failure(injected);
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
  if (it != live_.begin()) {
    --it;
    if (p >= it->first && p + bytes <= it->first + it->second.size) return true;
  }
  // Mapped, accessible virtual memory: a run of adjacent mappings may cover it.
  std::uintptr_t at = p;
  const std::uintptr_t end = p + (bytes == 0 ? 1 : bytes);
  while (at < end) {
    auto m = mappings_.upper_bound(at);
    if (m == mappings_.begin()) return false;
    --m;
    if (at >= m->first + m->second.size || !m->second.accessible) return false;
    at = m->first + m->second.size;
  }
  return true;
}

int Memory::device_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.upper_bound(p);
  if (it != live_.begin() && p < std::prev(it)->first + std::prev(it)->second.size) return std::prev(it)->second.device;
  auto m = mappings_.upper_bound(p);
  if (m != mappings_.begin() && p < std::prev(m)->first + std::prev(m)->second.size) {
    return physical_.at(std::prev(m)->second.handle).device;
  }
  return -1;
}

void* Memory::reserve_address_space(std::size_t size) {
  // Aligned to the granularity, as the driver's: the kernel aligns a large
  // mapping only from Linux 6.7 on, and not under valgrind. Reserve one
  // granule more and give back the unaligned ends.
  void* p = mmap(nullptr, size + kGranularity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (start + kGranularity - 1) / kGranularity * kGranularity;
  if (aligned > start) munmap(p, aligned - start);
  if (const std::uintptr_t tail = start + kGranularity - aligned; tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + size), tail);
  }
  return reinterpret_cast<void*>(aligned);
}

cudaError_t Memory::create_physical(int device, std::size_t size, std::uint64_t* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t& used = used_[static_cast<std::size_t>(device)];
  if (size % kGranularity != 0) return cudaErrorInvalidValue;
  const bool injected = inject_failure();
  if (injected || size > capacity_ || used > capacity_ - size) {
    counters().malloc_failures++;
    return failure(injected);
  }
  ++successes_;
  used += size;
  const std::uint64_t in_use = counters().bytes_in_use += size;
  if (in_use > counters().peak_bytes_in_use) counters().peak_bytes_in_use = in_use;
  *handle = next_handle_++;
  physical_.emplace(*handle, Physical{size, device, false});
  return cudaSuccess;
}

bool Memory::release_physical(std::uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = physical_.find(handle);
  if (it == physical_.end()) return false;
  // As the driver: released for good once no longer mapped (unmap comes first here).
  used_[static_cast<std::size_t>(it->second.device)] -= it->second.size;
  counters().bytes_in_use -= it->second.size;
  physical_.erase(it);
  return true;
}

bool Memory::map(void* ptr, std::size_t size, std::uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = physical_.find(handle);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (it == physical_.end() || it->second.size != size || it->second.mapped || p % kGranularity != 0) return false;
  auto next = mappings_.lower_bound(p);
  if (next != mappings_.end() && next->first < p + size) return false;  // overlaps a mapping
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > p) return false;
  it->second.mapped = true;
  mappings_.emplace(p, Mapping{size, handle, false, 0, 0});
  counters().vmm_maps++;
  return true;
}

bool Memory::set_access(void* ptr, std::size_t size, std::uint64_t changed, std::uint64_t readers,
                        std::uint64_t writers) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  // Every byte of the range must be mapped.
  for (std::uintptr_t at = p; at < p + size;) {
    auto m = mappings_.find(at);
    if (m == mappings_.end()) return false;
    at += m->second.size;
  }
  for (std::uintptr_t at = p; at < p + size;) {
    Mapping& m = mappings_.at(at);
    m.accessible = true;
    m.readers = (m.readers & ~changed) | (readers & changed);
    m.writers = (m.writers & ~changed) | (writers & changed);
    at += m.size;
  }
  return mprotect(ptr, size, PROT_READ | PROT_WRITE) == 0;
}

cudaError_t Memory::enable_peer_access(int accessor, int owner) {
  std::lock_guard<std::mutex> lock(mu_);
  if (owner < 0 || owner >= devices_ || owner == accessor) return cudaErrorInvalidDevice;
  std::uint64_t& peers = peers_[static_cast<std::size_t>(accessor)];
  if ((peers >> owner & 1u) != 0) return cudaErrorPeerAccessAlreadyEnabled;
  peers |= std::uint64_t{1} << owner;
  return cudaSuccess;
}

cudaError_t Memory::disable_peer_access(int accessor, int owner) {
  std::lock_guard<std::mutex> lock(mu_);
  if (owner < 0 || owner >= devices_ || owner == accessor) return cudaErrorInvalidDevice;
  std::uint64_t& peers = peers_[static_cast<std::size_t>(accessor)];
  if ((peers >> owner & 1u) == 0) return cudaErrorPeerAccessNotEnabled;
  peers &= ~(std::uint64_t{1} << owner);
  return cudaSuccess;
}

int Memory::access_from(const void* ptr, int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.upper_bound(p);
  if (it != live_.begin() && p < std::prev(it)->first + std::prev(it)->second.size) {
    const int owner = std::prev(it)->second.device;
    const bool peer = (peers_[static_cast<std::size_t>(device)] >> owner & 1u) != 0;
    return owner == device || peer ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
  }
  auto m = mappings_.upper_bound(p);
  if (m == mappings_.begin() || p >= std::prev(m)->first + std::prev(m)->second.size) return cudaMemAccessFlagsProtNone;
  const Mapping& mapping = std::prev(m)->second;
  if ((mapping.writers >> device & 1u) != 0) return cudaMemAccessFlagsProtReadWrite;
  return (mapping.readers >> device & 1u) != 0 ? cudaMemAccessFlagsProtRead : cudaMemAccessFlagsProtNone;
}

bool Memory::unmap(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto m = mappings_.find(p);
  if (m == mappings_.end() || m->second.size != size) return false;  // whole mappings only, as the driver
  physical_[m->second.handle].mapped = false;
  mappings_.erase(m);
  // The contents go with the physical memory; later access faults.
  madvise(ptr, size, MADV_DONTNEED);
  mprotect(ptr, size, PROT_NONE);
  counters().vmm_unmaps++;
  return true;
}

void Memory::reset(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  // Peer access ends with either device's reset, as CUDA documents for
  // cudaDeviceEnablePeerAccess.
  peers_[static_cast<std::size_t>(device)] = 0;
  for (std::uint64_t& peers : peers_) peers &= ~(std::uint64_t{1} << device);
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    munmap(reinterpret_cast<void*>(it->first), it->second.mapped);
    counters().bytes_in_use -= it->second.size;
    it = live_.erase(it);
  }
  for (auto m = mappings_.begin(); m != mappings_.end();) {
    if (physical_.at(m->second.handle).device != device) {
      ++m;
      continue;
    }
    void* p = reinterpret_cast<void*>(m->first);
    madvise(p, m->second.size, MADV_DONTNEED);
    mprotect(p, m->second.size, PROT_NONE);
    m = mappings_.erase(m);
  }
  for (auto it = physical_.begin(); it != physical_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    counters().bytes_in_use -= it->second.size;
    it = physical_.erase(it);
  }
  used_[static_cast<std::size_t>(device)] = 0;
}

void Memory::info(int device, std::size_t* free_bytes, std::size_t* total_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  *total_bytes = capacity_;
  *free_bytes = capacity_ - used_[static_cast<std::size_t>(device)];
}

}  // namespace simcuda
