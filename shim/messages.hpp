// One-line messages on stderr (configuration problems, out-of-memory events,
// where a report went), filtered by GPUPOOL_LOG_LEVEL, written through spdlog.
#pragma once

#include <string>

#include "config/config.hpp"

namespace gpupool::shim {

void set_log_level(config::LogLevel level);
void message(config::LogLevel level, const std::string& line);

}  // namespace gpupool::shim
