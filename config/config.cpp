#include "config/config.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <map>
#include <tuple>
#include <type_traits>

namespace gpupool::config {

namespace {

// Kinds with a numeric range checked against the table's min and max.
template <typename Kind>
inline constexpr bool kRanged =
    std::is_same_v<Kind, ByteSize> || std::is_same_v<Kind, MiBSize> || std::is_same_v<Kind, Count>;

template <typename Kind>
std::string accepted_text(std::size_t lo, std::size_t hi) {
  if constexpr (std::is_same_v<Kind, CountOrAuto>) {
    return "auto, or from " + Kind::format(lo) + " to " + Kind::format(hi);
  } else if constexpr (kRanged<Kind>) {
    std::string text = "from " + Kind::format(lo);
    if (hi == kUnlimited) return text + " up, or unlimited";
    return text + " to " + Kind::format(hi);
  } else if constexpr (std::is_same_v<Kind, Fraction>) {
    return "0 (off), or more than 0 and less than 1";
  } else if constexpr (std::is_same_v<Kind, Flag>) {
    return "1 or 0 (true/false, yes/no, on/off)";
  } else if constexpr (std::is_same_v<Kind, PathTemplate>) {
    return "a path; %p, %e, %r, %% expand";
  } else if constexpr (std::is_same_v<Kind, DevicePathTemplate>) {
    return "a path; %p, %e, %r, %d, %% expand";
  } else if constexpr (std::is_same_v<Kind, Divisions>) {
    return "0 or a power of two up to 1024, or [MB:N,...,>:N]";
  } else if constexpr (std::is_same_v<Kind, Signal>) {
    return "USR1, USR2 or none";
  } else if constexpr (std::is_same_v<Kind, NameList>) {
    return "library file names separated by colons";
  } else {
    return Kind::choices();
  }
}

template <typename Kind, typename Value>
bool check_range(const Value& v, std::size_t lo, std::size_t hi, std::string* why) {
  if constexpr (std::is_same_v<Kind, CountOrAuto>) {
    if (v != Kind::kAuto && (v < lo || v > hi)) {
      *why = "out of range (" + accepted_text<Kind>(lo, hi) + ")";
      return false;
    }
  } else if constexpr (kRanged<Kind>) {
    if (v < lo || v > hi) {
      *why = "out of range (" + accepted_text<Kind>(lo, hi) + ")";
      return false;
    }
  } else if constexpr (std::is_same_v<Kind, Fraction>) {
    (void)lo;
    (void)hi;
    if (v < 0.0 || v >= 1.0) {
      *why = "out of range (" + accepted_text<Kind>(0, 0) + ")";
      return false;
    }
  } else {
    (void)v;
    (void)lo;
    (void)hi;
    (void)why;
  }
  return true;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known name closest to `name`, if close enough to be a likely typo: one
// that starts with it (a missing suffix), else about one typo per four letters.
std::string suggestion(std::string_view name, bool variables) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 4 + 1);
  for (const OptionInfo& o : option_table()) {
    const std::string& candidate = variables ? o.variable : o.key;
    if (name.size() >= 4 && candidate.rfind(name, 0) == 0) {
      best = candidate;
      break;
    }
    const std::size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best.empty() ? std::string() : " (did you mean " + best + "?)";
}

// PyTorch keys that have no gpupool counterpart: named as such when pasted.
bool is_pytorch_only_key(std::string_view key) {
  static constexpr const char* kKeys[] = {
      "backend", "release_lock_on_cudamalloc",
      "pinned_use_cuda_host_register", "pinned_num_register_threads",
      "pinned_use_background_threads", "per_process_memory_fraction",
      "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
      "large_segment_size_mb"};
  return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

// Splits GPUPOOL_CONF on commas outside brackets.
std::vector<std::string_view> split_conf(std::string_view conf) {
  std::vector<std::string_view> entries;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    if (i < conf.size() && conf[i] == '[') ++depth;
    if (i < conf.size() && conf[i] == ']') --depth;
    if (i == conf.size() || (conf[i] == ',' && depth <= 0)) {
      const std::string_view entry = trim(conf.substr(start, i - start));
      if (!entry.empty()) entries.push_back(entry);
      start = i + 1;
    }
  }
  return entries;
}

void apply(const OptionInfo& option, std::string variable, std::string_view value,
           ParsedConfig& parsed) {
  std::string why;
  if (!option.parse(value, parsed.config, &why)) {
    // GPUPOOL_REPORT=/tmp/run.txt is a natural guess: say where a path goes.
    if (option.key == "report" && value.find('/') != std::string_view::npos) {
      why += "; the report's path goes in GPUPOOL_LOG";
    }
    parsed.problems.push_back(
        Problem{std::move(variable), why, std::string(value), option.show(parsed.config)});
  }
}

}  // namespace

const std::vector<OptionInfo>& option_table() {
  // Never destroyed: the preload library reads it while the process exits,
  // after function-local statics would have been destroyed.
  static const std::vector<OptionInfo>& table = *[] {
    auto* t_ptr = new std::vector<OptionInfo>();
    std::vector<OptionInfo>& t = *t_ptr;
#define GPUPOOL_OPTION(key, Kind, def, lo, hi, desc)                                        \
  t.push_back(OptionInfo{                                                                   \
      #key, "GPUPOOL_" + upper(#key), Kind::kKind, Kind::format(def),                       \
      accepted_text<Kind>(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi)), desc, \
      kRanged<Kind> ? static_cast<std::size_t>(lo) : 0,                                     \
      kRanged<Kind> ? static_cast<std::size_t>(hi) : 0,                                     \
      [](std::string_view text, Config& c, std::string* why) {                              \
        Kind::value_type v{};                                                               \
        if (!Kind::parse(text, &v, why)) return false;                                      \
        if (!check_range<Kind>(v, static_cast<std::size_t>(lo), static_cast<std::size_t>(hi), why)) \
          return false;                                                                     \
        c.key = v;                                                                          \
        return true;                                                                        \
      },                                                                                    \
      [](const Config& c) { return Kind::format(c.key); }});
#include "config/options.def"
#undef GPUPOOL_OPTION
    return t_ptr;
  }();
  return table;
}

const OptionInfo* find_option(std::string_view key) {
  for (const OptionInfo& o : option_table()) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

namespace {

// Control characters written as escapes, so that a value with a newline in it
// still makes one line; a long value is cut (its start is what tells).
std::string one_line(std::string_view text, std::size_t most = 256) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= most) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

std::string Problem::line() const {
  const std::string s = "gpupool: " + one_line(variable) + ": " + one_line(what) + " ('" + one_line(value) + "'); ";
  return s + (fallback == "ignored" ? "ignored" : "using " + one_line(fallback));
}

ParsedConfig parse_config(const Environment& environment) {
  ParsedConfig parsed;
  std::map<std::string, std::string> vars;
  for (const auto& [name, value] : environment) {
    if (name.rfind("GPUPOOL_", 0) == 0) vars[name] = value;
  }

  if (auto conf = vars.find("GPUPOOL_CONF"); conf != vars.end()) {
    for (std::string_view entry : split_conf(conf->second)) {
      const std::size_t colon = entry.find(':');
      if (colon == std::string_view::npos) {
        parsed.problems.push_back(
            Problem{"GPUPOOL_CONF", "expected key:value", std::string(entry), "ignored"});
        continue;
      }
      const std::string key(trim(entry.substr(0, colon)));
      const std::string_view value = trim(entry.substr(colon + 1));
      if (const OptionInfo* option = find_option(key)) {
        apply(*option, "GPUPOOL_CONF:" + key, value, parsed);
      } else if (is_pytorch_only_key(key)) {
        // A pasted PyTorch setting is valid there: told, not a problem (so
        // GPUPOOL_STRICT=1 does not stop on it).
        parsed.notes.push_back("gpupool: GPUPOOL_CONF: PyTorch option '" + key + "' has no gpupool equivalent ('" +
                               std::string(entry) + "'); ignored");
      } else {
        parsed.problems.push_back(Problem{"GPUPOOL_CONF",
                                          "unknown key '" + key + "'" + suggestion(key, false),
                                          std::string(entry), "ignored"});
      }
    }
  }

  for (const OptionInfo& option : option_table()) {
    if (auto it = vars.find(option.variable); it != vars.end()) {
      apply(option, option.variable, it->second, parsed);
    }
  }
  for (const auto& [name, value] : vars) {
    if (name == "GPUPOOL_CONF") continue;
    const std::string& variable = name;  // (clang 14 cannot capture a structured binding)
    const bool known = std::any_of(option_table().begin(), option_table().end(),
                                   [&](const OptionInfo& o) { return o.variable == variable; });
    if (!known) {
      parsed.problems.push_back(
          Problem{name, "unknown variable" + suggestion(name, true), value, "ignored"});
    }
  }

  Config& c = parsed.config;
  // Blocks tile segments in 2 MiB pages, as the device allocates them.
  const Config defaults;
  for (auto [size, variable, fallback] :
       {std::tuple{&c.small_segment_size, "GPUPOOL_SMALL_SEGMENT_SIZE", defaults.small_segment_size},
        std::tuple{&c.large_segment_size, "GPUPOOL_LARGE_SEGMENT_SIZE", defaults.large_segment_size}}) {
    if (*size % (2 * kMiB) != 0) {
      parsed.problems.push_back(Problem{variable, "must be a multiple of 2M", format_size(*size),
                                        format_size(fallback)});
      *size = fallback;
    }
  }
  // Cross-option rule: an oversize threshold at or below the large segment size
  // would strand the remainders of ordinary segments (PyTorch requires > 20 MiB).
  if (c.max_split_size_mb != kUnlimited && c.max_split_size_mb <= c.large_segment_size) {
    parsed.problems.push_back(Problem{"GPUPOOL_MAX_SPLIT_SIZE_MB",
                                      "must be more than large_segment_size (" +
                                          format_size(c.large_segment_size) + ")",
                                      MiBSize::format(c.max_split_size_mb), "unlimited"});
    c.max_split_size_mb = kUnlimited;
  }
  // A PyTorch setting pasted in: the limit guards fixed segments, and the
  // default is expandable (pool/device_pool.cpp says why it is ignored there).
  if (c.max_split_size_mb != kUnlimited && c.expandable_segments) {
    parsed.notes.push_back("gpupool: max_split_size_mb (" + MiBSize::format(c.max_split_size_mb) +
                           ") applies to fixed segments only and is ignored with expandable_segments:1, where free "
                           "memory joins up and is remapped where a request fits; set expandable_segments:0 to use it");
  }
  if (!c.static_runtime_libraries.empty() && !c.static_runtime) {
    parsed.notes.push_back("gpupool: static_runtime_libraries (" + c.static_runtime_libraries +
                           ") applies with static_runtime:1 only; set it to take those libraries' memory over");
  }
  return parsed;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env.emplace_back(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

PoolOptions to_pool_options(const Config& c) {
  PoolOptions o;
  o.max_split_size = c.max_split_size_mb;
  o.max_non_split_rounding = c.max_non_split_rounding_mb;
  o.roundup_divisions = c.roundup_power2_divisions;
  o.garbage_collection_threshold = c.garbage_collection_threshold;
  o.small_segment_size = c.small_segment_size;
  o.large_segment_size = c.large_segment_size;
  o.memory_limit = c.memory_limit;
  o.cross_stream_reuse = c.cross_stream_reuse;
  o.expandable_segments = c.expandable_segments;
  o.recycle_pages = c.recycle_pages;
  o.recycle_idle_allocations = c.recycle_idle_allocations;
  o.plain_reuse_search = static_cast<std::uint32_t>(c.plain_reuse_search);
  o.unsafe_skip_ordering = c.debug_unsafe_skip_ordering;
  return o;
}

std::string markdown_table() {
  std::string s =
      "| Variable | `GPUPOOL_CONF` key | Default | Accepted | What it does |\n"
      "|---|---|---|---|---|\n";
  for (const OptionInfo& o : option_table()) {
    s += "| `" + o.variable + "` | `" + o.key + "` | `" + o.default_text + "` | " + o.accepted +
         " | " + o.description + " |\n";
  }
  return s;
}

}  // namespace gpupool::config
