#include "shim/messages.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>

#include "shim/sigpipe_held.hpp"

namespace gpupool::shim {

namespace {

std::atomic<config::LogLevel> g_level{config::LogLevel::Info};
// Ours, not spdlog's console lock: fork's handlers hold it (see messages.hpp).
std::mutex g_write_mu;
bool g_line_failed = false;  // spdlog could not write the line (g_write_mu held)
std::atomic<int (*)()> g_stderr_takes_lines{nullptr};

// Not registered with spdlog's global registry: the host program may use spdlog
// itself, and ours must never collide with or outlive its loggers.
spdlog::logger& stderr_logger() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("gpupool", std::make_shared<spdlog::sinks::stderr_sink_st>());
    l->set_pattern("%v");
    l->set_level(spdlog::level::trace);
    // spdlog reports its own failures here instead of throwing.
    l->set_error_handler([](const std::string&) { g_line_failed = true; });
    return l;
  }();
  return *logger;
}

}  // namespace

void set_log_level(config::LogLevel level) { g_level.store(level); }
void set_stderr_check(int (*stderr_takes_lines)()) { g_stderr_takes_lines.store(stderr_takes_lines); }

void message(config::LogLevel level, std::string_view line) {
  if (level == config::LogLevel::Off || static_cast<int>(level) > static_cast<int>(g_level.load())) return;
  std::lock_guard<std::mutex> lock(g_write_mu);
  // Descriptor 2 may now be a file of the program's (see preload.c): then
  // the line goes nowhere, and stderr's FILE, perhaps closed, is not touched.
  const auto takes_lines = g_stderr_takes_lines.load();
  if (takes_lines != nullptr && takes_lines() == 0) return;
  // stderr may be a pipe whose reader is gone (`prog 2>&1 | head`): a line of
  // gpupool's must not end the program, nor change its exit status.
  const SigpipeHeld held;
  g_line_failed = false;
  try {
    stderr_logger().info(line);
    stderr_logger().flush();
  } catch (...) {
    g_line_failed = true;
  }
  // Out of host memory, the line still goes out, unformatted.
  if (g_line_failed) std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

std::mutex& messages_mutex() { return g_write_mu; }

}  // namespace gpupool::shim
