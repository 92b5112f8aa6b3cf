// Allocation call stacks for GPUPOOL_BACKTRACE=1: each distinct stack gets a
// small id stored in the block; the report groups leaked blocks by it.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpupool::shim {

class CallSites {
 public:
  void enable();
  bool enabled() const { return enabled_; }
  // The caller's stack (frames inside gpupool skipped) as a site id; 0 when off.
  // The check inline: off (the default), it is every allocation's only cost.
  std::uint32_t capture() { return enabled_ ? capture_stack() : 0; }
  // "function+0x1c (library)" per frame, innermost first.
  std::vector<std::string> symbolize(std::uint32_t site);

  // Held across fork() so that the child never inherits it locked.
  std::mutex& mutex() { return mu_; }

 private:
  std::uint32_t capture_stack();

  bool enabled_ = false;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::uint32_t> by_hash_;
  std::vector<std::vector<void*>> stacks_;  // site id - 1 -> frames
};

}  // namespace gpupool::shim
