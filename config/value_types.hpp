// The kinds of value an option can hold. Each kind knows how to parse text
// (reporting what is wrong in words a user understands), check a range, and
// print a value back in the form it accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pool/options.hpp"

namespace gpupool::config {

// Parsing helpers shared by the kinds; each returns false and sets *why.
bool parse_unsigned(std::string_view text, std::uint64_t* out, std::string* why);
// A byte size: digits with an optional K/M/G/T suffix (binary: K = 1024);
// without a suffix the number counts `default_unit` bytes.
bool parse_size(std::string_view text, std::size_t default_unit, std::size_t* out,
                std::string* why);
std::string format_size(std::size_t bytes);  // "2M", "20M", "1536K", "unlimited"

struct ByteSize {
  using value_type = std::size_t;
  static constexpr const char* kKind = "size";
  static constexpr std::size_t kUnit = 1;
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v) { return format_size(v); }
};

// PyTorch's *_mb keys: a bare number is MiB; a suffix may say otherwise.
struct MiBSize {
  using value_type = std::size_t;
  static constexpr const char* kKind = "size (MiB)";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v);
};

// A plain count, like a number of allocations.
struct Count {
  using value_type = std::uint64_t;
  static constexpr const char* kKind = "count";
  static bool parse(std::string_view text, value_type* out, std::string* why) {
    return parse_unsigned(text, out, why);
  }
  static std::string format(value_type v) { return std::to_string(v); }
};

// A count, or auto: PoolOptions::kSearchAuto, which the pool resolves as it goes.
struct CountOrAuto {
  using value_type = std::uint64_t;
  static constexpr const char* kKind = "count or auto";
  static constexpr value_type kAuto = PoolOptions::kSearchAuto;
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v) { return v == kAuto ? "auto" : std::to_string(v); }
};

struct Fraction {
  using value_type = double;
  static constexpr const char* kKind = "fraction";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v);
};

struct Flag {
  using value_type = bool;
  static constexpr const char* kKind = "bool";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v) { return v ? "1" : "0"; }
};

// A path template: %p pid, %e program name, %r distributed rank, %% a percent.
struct PathTemplate {
  using value_type = std::string;
  static constexpr const char* kKind = "path";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(const value_type& v) { return v.empty() ? "(none)" : v; }
};

// The same, and %d the device: one file per device (traces).
struct DevicePathTemplate : PathTemplate {
  static bool parse(std::string_view text, value_type* out, std::string* why);
};

// Library file names separated by colons (as in LD_LIBRARY_PATH), each
// matching a loaded library whose file name starts with it: "libengine.so".
struct NameList {
  using value_type = std::string;
  static constexpr const char* kKind = "names";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(const value_type& v) { return v.empty() ? "(none)" : v; }
};
// Whether the file name at the end of `path` starts with one of the names.
bool names_match(const std::string& names, std::string_view path);

// roundup_power2_divisions: one number for every size, or PyTorch's list form
// [256:1,512:2,>:8] (keys are MiB interval starts, powers of two).
struct Divisions {
  using value_type = RoundupDivisions;
  static constexpr const char* kKind = "divisions";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(const value_type& v);
};

// A signal for on-demand reports: USR1, USR2, or none.
struct Signal {
  using value_type = int;
  static constexpr const char* kKind = "signal";
  static bool parse(std::string_view text, value_type* out, std::string* why);
  static std::string format(value_type v);
};

// Enumerations: the value is the index into the kind's names.
template <typename Enum, const char* const* Names, int Count>
struct Choice {
  using value_type = Enum;
  static constexpr const char* kKind = "choice";
  static bool parse(std::string_view text, value_type* out, std::string* why) {
    for (int i = 0; i < Count; ++i) {
      if (text == Names[i]) {
        *out = static_cast<Enum>(i);
        return true;
      }
    }
    *why = "must be one of " + choices();
    return false;
  }
  static std::string format(value_type v) { return Names[static_cast<int>(v)]; }
  static std::string choices() {
    std::string s;
    for (int i = 0; i < Count; ++i) s += (i == 0 ? "" : (i + 1 == Count ? " or " : ", ")) + std::string(Names[i]);
    return s;
  }
};

}  // namespace gpupool::config
