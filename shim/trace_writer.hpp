// GPUPOOL_TRACE: every intercepted allocation and free, in RMM's
// logging_resource_adaptor CSV layout (Thread,Time,Action,Pointer,Size,Stream),
// buffered and written in large chunks so that tracing a hot loop costs little.
// The layout has no device column: a path template with %d gives each device
// its own file (opened at its first record), since gpupool-replay replays a
// trace as one device. A write that fails (a pipe's reader gone, a full disk)
// ends that file's trace there, said once on stderr and in the report (a
// trace cut at a line's end reads as whole: only the report can tell).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "pool/types.hpp"
#include "shim/locks.hpp"

namespace gpupool::shim {

class TraceWriter {
 public:
  enum class Action { Allocate, AllocateFailure, Free };

  // Opens (truncates) the file the template names, expanded as GPUPOOL_LOG's;
  // false if it cannot. With %d, each device's file is opened at its first
  // record instead (a failure then is said once, and that device untraced).
  bool open(const std::string& path_template);
  // may_write false: the caller holds a pool's lock; a full buffer waits for
  // write_full_buffers (or the next record) to write it.
  void record(Action action, DevicePtr ptr, std::size_t size, StreamId stream, int device, bool may_write = true);
  void write_full_buffers();
  void flush();
  // In a forked child, before any other call (allocates nothing): the
  // parent's files and buffered lines are the parent's. The child traces to
  // its own files, opened at its first record, when the template names the
  // process (%p); otherwise it would write into the parent's, so it does not.
  void after_fork_child();
  // What the report says of the trace: each file that could not be opened or
  // written to the end, and one file mixing devices. Lines as told on stderr.
  std::vector<std::string> problems() const;
  std::string mixed_devices_line() const;  // empty unless one file mixes devices

  // Held across fork() so that the child never inherits it locked.
  AdaptiveMutex& mutex() { return mu_; }

 private:
  struct Output {
    int fd = -1;
    bool tried = false;  // opened, or failed to: not tried again
    std::string path;
    std::string buffer;
    std::string problem;  // why it could not be opened or written to the end
  };
  Output& output_for(int device);  // with mu_ held; opens the output at its first use
  bool open_output(Output& out, const std::string& path);
  static void flush_output(Output& out);
  std::string mixed_devices_line_locked() const;

  // Taken twice a traced pair, mostly for a few dozen instructions (a full
  // buffer's write is the rare long hold): the shim's own lock, inline, not
  // pthread's (about 80 instructions a record).
  mutable AdaptiveMutex mu_;
  std::string template_;
  bool per_device_ = false;
  bool opened_ = false;
  long utc_offset_ = 0;
  std::vector<Output> outputs_;     // by device; just one without %d
  std::uint64_t devices_seen_ = 0;  // a bit per device recorded (up to 64)
  std::atomic<bool> unwritten_full_{false};  // a record left a full buffer to write_full_buffers
};

}  // namespace gpupool::shim
