#include "shim/trace_writer.hpp"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "shim/messages.hpp"
#include "shim/output_file.hpp"
#include "shim/report_file.hpp"
#include "shim/sigpipe_held.hpp"
#include "shim/trace_format.hpp"

namespace gpupool::shim {

namespace {
constexpr std::size_t kFlushBytes = 1 << 20;

using trace_format::put_decimal;
using trace_format::put_fixed;
using trace_format::put_hex;
using trace_format::put_text;

// What repeats from one line to the next, kept per thread: "tid," and the
// "HH:MM:SS." of this thread's last line.
struct LineStart {
  char thread[24];
  std::size_t thread_length = 0;
  long second = -1;
  char time_of_day[9];
};

LineStart& line_start() {
  thread_local LineStart start;
  if (start.thread_length == 0) {
    char* end = put_decimal(start.thread, static_cast<unsigned long long>(syscall(SYS_gettid)));
    *end++ = ',';
    start.thread_length = static_cast<std::size_t>(end - start.thread);
  }
  return start;
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
  out.path = path;
  out.fd = open_output_file(path, OutputPlace::Chosen).fd;
  if (out.fd < 0) return false;
  out.buffer.reserve(kFlushBytes + 256);
  out.buffer = "Thread,Time,Action,Pointer,Size,Stream\n";
  return true;
}

TraceWriter::Output& TraceWriter::output_for(int device) {
  if (device >= 0 && device < 64) devices_seen_ |= std::uint64_t{1} << device;
  const auto index = per_device_ ? static_cast<std::size_t>(std::max(device, 0)) : 0;
  if (outputs_.size() <= index) outputs_.resize(index + 1);
  Output& out = outputs_[index];
  if (!out.tried) {
    const std::string path = expand_path_template(template_, device);
    if (!open_output(out, path)) {
      out.problem = "gpupool: GPUPOOL_TRACE: cannot write '" + path + "'; " +
                    (per_device_ ? "device " + std::to_string(device) : std::string("it is")) + " not traced";
      message(config::LogLevel::Error, out.problem);
    }
  }
  return out;
}

void TraceWriter::record(Action action, DevicePtr ptr, std::size_t size, StreamId stream, int device,
                         bool may_write) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  LineStart& start = line_start();
  if (now.tv_sec != start.second) {
    // Local time of day without localtime_r's locking: the offset is read once.
    const long seconds = (now.tv_sec + utc_offset_) % 86400;
    put_fixed(start.time_of_day + 2, static_cast<unsigned long>(seconds / 3600), 2);
    start.time_of_day[2] = ':';
    put_fixed(start.time_of_day + 5, static_cast<unsigned long>(seconds / 60 % 60), 2);
    start.time_of_day[5] = ':';
    put_fixed(start.time_of_day + 8, static_cast<unsigned long>(seconds % 60), 2);
    start.time_of_day[8] = '.';
    start.second = now.tv_sec;
  }
  struct Name {
    const char* text;
    std::size_t length;
  };
  static constexpr Name kActions[] = {{",allocate,", 10}, {",allocate failure,", 18}, {",free,", 6}};
  // Thread,HH:MM:SS.ffffff,action,0xpointer,size,0xstream
  char line[160];
  char* out = put_text(line, start.thread, start.thread_length);
  out = put_text(out, start.time_of_day, sizeof start.time_of_day);
  put_fixed(out + 6, static_cast<unsigned long>(now.tv_nsec / 1000), 6);
  out += 6;
  const Name& name = kActions[static_cast<int>(action)];
  out = put_text(out, name.text, name.length);
  out = put_hex(out, ptr);
  *out++ = ',';
  out = put_decimal(out, size);
  *out++ = ',';
  out = put_hex(out, stream == kAnyStream ? 0 : stream);
  *out++ = '\n';
  const auto n = static_cast<std::size_t>(out - line);
  std::lock_guard<AdaptiveMutex> lock(mu_);
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
  std::lock_guard<AdaptiveMutex> lock(mu_);
  for (Output& o : outputs_) {
    if (o.buffer.size() >= kFlushBytes) flush_output(o);
  }
  unwritten_full_.store(false, std::memory_order_relaxed);
}

void TraceWriter::flush() {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  for (Output& o : outputs_) flush_output(o);
}

void TraceWriter::flush_output(Output& out) {
  if (out.fd < 0 || out.buffer.empty()) {
    out.buffer.clear();
    return;
  }
  const SigpipeHeld held;
  int error = 0;
  write_whole(out.fd, out.buffer, &error);
  out.buffer.clear();
  if (error == 0) return;
  // A reader gone (a pipe), a full disk: the trace stops here, said once,
  // rather than failing again at every buffer.
  ::close(out.fd);
  out.fd = -1;
  try {
    out.problem = "gpupool: GPUPOOL_TRACE: cannot write '" + out.path + "' (" + std::strerror(error) +
                  "); the rest of the trace is lost";
    message(config::LogLevel::Error, out.problem);
  } catch (...) {  // out of host memory: the trace is lost all the same
  }
}

void TraceWriter::after_fork_child() {
  for (Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);  // the child's copy
    o.fd = -1;
    o.tried = false;
    o.buffer.clear();  // keeps its storage
    o.problem.clear();
  }
  devices_seen_ = 0;
  unwritten_full_.store(false, std::memory_order_relaxed);
  if (!names_process(template_)) opened_ = false;
}

std::string TraceWriter::mixed_devices_line_locked() const {
  const int devices = per_device_ ? 0 : __builtin_popcountll(devices_seen_);
  if (devices < 2) return std::string();
  return "gpupool: GPUPOOL_TRACE: '" + expand_path_template(template_) + "' mixes " + std::to_string(devices) +
         " devices, which gpupool-replay replays as one; put %d in the path for a trace per device";
}

std::string TraceWriter::mixed_devices_line() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return mixed_devices_line_locked();
}

std::vector<std::string> TraceWriter::problems() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  std::vector<std::string> lines;
  for (const Output& o : outputs_) {
    if (!o.problem.empty()) lines.push_back(o.problem);
  }
  if (std::string mixed = mixed_devices_line_locked(); !mixed.empty()) lines.push_back(std::move(mixed));
  return lines;
}

}  // namespace gpupool::shim
