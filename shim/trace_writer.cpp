#include "shim/trace_writer.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>


namespace gpupool::shim {

namespace {
constexpr std::size_t kFlushBytes = 1 << 20;

long thread_number() {
  thread_local const long tid = syscall(SYS_gettid);
  return tid;
}

// Hand-rolled formatting: snprintf's parsing cost most of a traced call.
char* put_decimal(char* out, unsigned long long v) {
  char digits[20];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

char* put_fixed(char* out, unsigned long v, int width) {
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<char>('0' + v % 10);
    v /= 10;
  }
  return out + width;
}

char* put_hex(char* out, unsigned long long v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  *out++ = '0';
  *out++ = 'x';
  char digits[16];
  int n = 0;
  do {
    digits[n++] = kDigits[v & 15];
    v >>= 4;
  } while (v != 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

char* put_text(char* out, const char* text) {
  while (*text != '\0') *out++ = *text++;
  return out;
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
  // Thread,HH:MM:SS.ffffff,action,0xpointer,size,0xstream
  char line[160];
  char* out = put_decimal(line, static_cast<unsigned long long>(thread_number()));
  *out++ = ',';
  out = put_fixed(out, static_cast<unsigned long>(seconds / 3600), 2);
  *out++ = ':';
  out = put_fixed(out, static_cast<unsigned long>(seconds / 60 % 60), 2);
  *out++ = ':';
  out = put_fixed(out, static_cast<unsigned long>(seconds % 60), 2);
  *out++ = '.';
  out = put_fixed(out, static_cast<unsigned long>(now.tv_nsec / 1000), 6);
  *out++ = ',';
  out = put_text(out, kActions[static_cast<int>(action)]);
  *out++ = ',';
  out = put_hex(out, ptr);
  *out++ = ',';
  out = put_decimal(out, size);
  *out++ = ',';
  out = put_hex(out, stream == kAnyStream ? 0 : stream);
  *out++ = '\n';
  const auto n = static_cast<std::size_t>(out - line);
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  buffer_.append(line, n);
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
