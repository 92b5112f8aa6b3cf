// One-line messages on stderr (configuration problems, out-of-memory events,
// where a report went), filtered by GPUPOOL_LOG_LEVEL, written through spdlog.
#pragma once

#include <mutex>
#include <string>
#include <string_view>

#include "config/config.hpp"

namespace gpupool::shim {

void set_log_level(config::LogLevel level);
void message(config::LogLevel level, std::string_view line);
// Held while a line is written, and across fork() (taken last: lines are
// written with other locks held) so that a child never inherits it locked.
std::mutex& messages_mutex();

}  // namespace gpupool::shim
