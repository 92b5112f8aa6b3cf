// Environment variables -> a typed configuration. Parsing is a pure function of
// the environment it is given; it collects every problem and never aborts.
#pragma once

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "config/value_types.hpp"
#include "pool/options.hpp"

namespace gpupool::config {

enum class MemGetInfo { CachedIsFree, CachedIsUsed };
enum class LogFormat { Text, Json };
enum class LogLevel { Off, Error, Warn, Info, Debug };

inline constexpr const char* kMemGetInfoNames[] = {"cached_is_free", "cached_is_used"};
inline constexpr const char* kCrossStreamNames[] = {"auto", "completed", "never"};
inline constexpr const char* kLogFormatNames[] = {"text", "json"};
inline constexpr const char* kLogLevelNames[] = {"off", "error", "warn", "info", "debug"};

using MemGetInfoChoice = Choice<MemGetInfo, kMemGetInfoNames, 2>;
using CrossStreamChoice = Choice<CrossStreamReuse, kCrossStreamNames, 3>;
using LogFormatChoice = Choice<LogFormat, kLogFormatNames, 2>;
using LogLevelChoice = Choice<LogLevel, kLogLevelNames, 5>;

struct Config {
#define GPUPOOL_OPTION(key, Kind, def, lo, hi, desc) Kind::value_type key = def;
#include "config/options.def"
#undef GPUPOOL_OPTION
};

// One row of the option table.
struct OptionInfo {
  std::string key;          // GPUPOOL_CONF key, e.g. max_split_size_mb
  std::string variable;     // GPUPOOL_MAX_SPLIT_SIZE_MB
  std::string kind;         // size, bool, choice, ...
  std::string default_text;
  std::string accepted;     // the range or choices, in words
  std::string description;
  std::size_t min = 0;  // numeric range, for size kinds (0 and 0 otherwise)
  std::size_t max = 0;
  // Parses `text` into the option's member of `config`, range included;
  // on failure leaves it untouched and explains in *why.
  bool (*parse)(std::string_view text, Config& config, std::string* why);
  std::string (*show)(const Config& config);
};

const std::vector<OptionInfo>& option_table();
const OptionInfo* find_option(std::string_view key);

// A problem found in the environment: printed as one line, never fatal unless
// GPUPOOL_STRICT asks for it.
struct Problem {
  std::string variable;  // GPUPOOL_X, or GPUPOOL_CONF:key
  std::string what;
  std::string value;
  std::string fallback;  // what is used instead ("ignored" for unknown keys)
  // gpupool: <VARIABLE>: <what is wrong> ('<value>'); using <fallback>
  std::string line() const;
};

struct ParsedConfig {
  Config config;
  std::vector<Problem> problems;
  // Valid settings that another setting makes ineffective: one line each,
  // told but never a problem (GPUPOOL_STRICT ignores them).
  std::vector<std::string> notes;
};

using Environment = std::vector<std::pair<std::string, std::string>>;

// The calling process's environment (the only impure function here).
Environment process_environment();

// Defaults, then GPUPOOL_CONF (PyTorch syntax: key:value,key:value), then each
// GPUPOOL_<KEY>, which wins. Unknown GPUPOOL_* variables are problems too.
ParsedConfig parse_config(const Environment& environment);

// The pool's share of the configuration.
PoolOptions to_pool_options(const Config& config);

// The option table as the README's markdown table (one row per option).
std::string markdown_table();

}  // namespace gpupool::config
