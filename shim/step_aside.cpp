#include "shim/step_aside.hpp"

#include <cstdio>
#include <exception>
#include <new>

#include "shim/messages.hpp"

namespace gpupool::shim {

namespace {
// Fixed buffers: when the host is out of memory, nothing here may allocate.
char g_call[64];
char g_reason[160];
std::atomic<bool> g_details{false};  // g_call and g_reason are written
}  // namespace

void step_aside(const char* call, bool exiting) noexcept {
  if (stepped_aside_flag().exchange(true)) return;
  const char* reason = "an unknown exception";
  if (const std::exception_ptr thrown = std::current_exception()) {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::bad_alloc&) {
      reason = "out of host memory (std::bad_alloc)";
    } catch (const std::exception& e) {
      reason = e.what();
    } catch (...) {
    }
  }
  std::snprintf(g_call, sizeof g_call, "%s", call);
  std::snprintf(g_reason, sizeof g_reason, "%s", reason);
  g_details.store(true, std::memory_order_release);
  char line[400];
  std::snprintf(line, sizeof line,
                exiting ? "gpupool: %s failed inside gpupool: %s; gpupool steps aside for the rest of the exit, and "
                          "its report and messages at exit may be missing"
                        : "gpupool: %s failed inside gpupool: %s; gpupool steps aside: from now on the CUDA runtime "
                          "serves every allocation, and the memory gpupool holds stays held until exit",
                g_call, g_reason);
  message(config::LogLevel::Error, line);
}

const char* stepped_aside_call() { return g_details.load(std::memory_order_acquire) ? g_call : ""; }
const char* stepped_aside_reason() { return g_details.load(std::memory_order_acquire) ? g_reason : ""; }

}  // namespace gpupool::shim
