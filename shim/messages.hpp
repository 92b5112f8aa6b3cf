// One-line messages on stderr (configuration problems, out-of-memory events,
// where a report went), filtered by GPUPOOL_LOG_LEVEL, written through spdlog.
#pragma once

#include <mutex>
#include <string>
#include <string_view>

#include "config/config.hpp"

namespace gpupool::shim {

void set_log_level(config::LogLevel level);
// Asked before each line: lines are written only while it answers 1 (the
// preload's stderr_takes_lines: descriptor 2 is still the program's first
// stderr, or a pipe put there since; not a file the program opened there).
// None set (the tools, the tests of the core alone): always written.
void set_stderr_check(int (*stderr_takes_lines)());
void message(config::LogLevel level, std::string_view line);
// Held while a line is written, and across fork() (taken last: lines are
// written with other locks held) so that a child never inherits it locked.
std::mutex& messages_mutex();

}  // namespace gpupool::shim
