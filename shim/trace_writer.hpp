// GPUPOOL_TRACE: every intercepted allocation and free, in RMM's
// logging_resource_adaptor CSV layout (Thread,Time,Action,Pointer,Size,Stream),
// buffered and written in large chunks so that tracing a hot loop costs little.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "pool/types.hpp"

namespace gpupool::shim {

class TraceWriter {
 public:
  enum class Action { Allocate, AllocateFailure, Free };

  // Opens (truncates) `path`; false if it cannot.
  bool open(const std::string& path);
  void record(Action action, DevicePtr ptr, std::size_t size, StreamId stream);
  void flush();
  // In a forked child: the parent's buffered lines are the parent's to write.
  void forget_buffer();

  // Held across fork() so that the child never inherits it locked.
  std::mutex& mutex() { return mu_; }

 private:
  void flush_locked();

  std::mutex mu_;
  int fd_ = -1;
  long utc_offset_ = 0;
  std::string buffer_;
};

}  // namespace gpupool::shim
