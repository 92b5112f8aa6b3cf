#include "shim/trace_writer.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "shim/messages.hpp"
#include "shim/report_file.hpp"

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

bool TraceWriter::open(const std::string& path_template) {
  template_ = path_template;
  per_device_ = names_device(path_template);
  const time_t t = time(nullptr);
  tm local;
  localtime_r(&t, &local);
  utc_offset_ = local.tm_gmtoff;
  opened_ = true;
  if (per_device_) return true;
  outputs_.resize(1);
  return open_output(outputs_[0], expand_path_template(path_template));
}

bool TraceWriter::open_output(Output& out, const std::string& path) {
  out.tried = true;
  out.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out.fd < 0) return false;
  out.buffer.reserve(kFlushBytes + 256);
  out.buffer = "Thread,Time,Action,Pointer,Size,Stream\n";
  return true;
}

TraceWriter::Output& TraceWriter::output_for(int device) {
  if (device >= 0 && device < 64) devices_seen_ |= std::uint64_t{1} << device;
  if (!per_device_) return outputs_[0];
  const auto index = static_cast<std::size_t>(std::max(device, 0));
  if (outputs_.size() <= index) outputs_.resize(index + 1);
  Output& out = outputs_[index];
  if (!out.tried) {
    const std::string path = expand_path_template(template_, device);
    if (!open_output(out, path)) {
      message(config::LogLevel::Error, "gpupool: GPUPOOL_TRACE: cannot write '" + path + "'; device " +
                                           std::to_string(device) + " not traced");
    }
  }
  return out;
}

void TraceWriter::record(Action action, DevicePtr ptr, std::size_t size, StreamId stream, int device,
                         bool may_write) {
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
  if (!opened_) return;
  Output& o = output_for(device);
  if (o.fd < 0) return;
  o.buffer.append(line, n);
  if (o.buffer.size() < kFlushBytes) return;
  if (may_write) {
    flush_output(o);
  } else {
    unwritten_full_.store(true, std::memory_order_relaxed);
  }
}

void TraceWriter::write_full_buffers() {
  if (!unwritten_full_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (Output& o : outputs_) {
    if (o.buffer.size() >= kFlushBytes) flush_output(o);
  }
  unwritten_full_.store(false, std::memory_order_relaxed);
}

void TraceWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Output& o : outputs_) flush_output(o);
}

void TraceWriter::flush_output(Output& out) {
  std::size_t done = 0;
  while (out.fd >= 0 && done < out.buffer.size()) {
    const ssize_t w = ::write(out.fd, out.buffer.data() + done, out.buffer.size() - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  out.buffer.clear();
}

void TraceWriter::forget_buffer() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Output& o : outputs_) o.buffer.clear();
}

int TraceWriter::devices_in_one_file() const {
  std::lock_guard<std::mutex> lock(mu_);
  return per_device_ ? 0 : __builtin_popcountll(devices_seen_);
}

std::string TraceWriter::one_file() const { return per_device_ ? std::string() : expand_path_template(template_); }

}  // namespace gpupool::shim
