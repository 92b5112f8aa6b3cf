#include "shim/trace_writer.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

namespace gpupool::shim {

namespace {
constexpr std::size_t kFlushBytes = 1 << 20;

long thread_number() {
  thread_local const long tid = syscall(SYS_gettid);
  return tid;
}
}  // namespace

bool TraceWriter::open(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return false;
  const time_t t = time(nullptr);
  tm local;
  localtime_r(&t, &local);
  utc_offset_ = local.tm_gmtoff;
  buffer_.reserve(kFlushBytes + 256);
  buffer_ = "Thread,Time,Action,Pointer,Size,Stream\n";
  return true;
}

void TraceWriter::record(Action action, DevicePtr ptr, std::size_t size, StreamId stream) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  // Local time of day without localtime_r's locking: the offset is read once.
  const long seconds = (now.tv_sec + utc_offset_) % 86400;
  static constexpr const char* kActions[] = {"allocate", "allocate failure", "free"};
  char line[160];
  const int n = std::snprintf(line, sizeof line, "%ld,%02ld:%02ld:%02ld.%06ld,%s,0x%llx,%zu,0x%llx\n", thread_number(),
                              seconds / 3600, seconds / 60 % 60, seconds % 60, now.tv_nsec / 1000,
                              kActions[static_cast<int>(action)], static_cast<unsigned long long>(ptr), size,
                              static_cast<unsigned long long>(stream == kAnyStream ? 0 : stream));
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  buffer_.append(line, static_cast<std::size_t>(n));
  if (buffer_.size() >= kFlushBytes) flush_locked();
}

void TraceWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_locked();
}

void TraceWriter::flush_locked() {
  std::size_t done = 0;
  while (fd_ >= 0 && done < buffer_.size()) {
    const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  buffer_.clear();
}

void TraceWriter::forget_buffer() {
  std::lock_guard<std::mutex> lock(mu_);
  buffer_.clear();
}

}  // namespace gpupool::shim
