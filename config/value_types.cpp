#include "config/value_types.hpp"

#include <bit>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <limits>

namespace gpupool::config {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// Suffix -> multiplier; K, KB, KiB all mean 1024 (as mimalloc and PyTorch users expect).
bool suffix_multiplier(std::string_view suffix, std::size_t* out) {
  struct Unit {
    char letter;
    std::size_t bytes;
  };
  static constexpr Unit kUnits[] = {{'k', kKiB}, {'m', kMiB}, {'g', kGiB}, {'t', kGiB * 1024}};
  if (suffix.empty()) return false;
  const char first = static_cast<char>(std::tolower(static_cast<unsigned char>(suffix[0])));
  if (first == 'b' && suffix.size() == 1) {
    *out = 1;
    return true;
  }
  for (const Unit& u : kUnits) {
    if (first != u.letter) continue;
    const std::string_view rest = suffix.substr(1);
    if (rest.empty() || equals_ignoring_case(rest, "b") || equals_ignoring_case(rest, "ib")) {
      *out = u.bytes;
      return true;
    }
  }
  return false;
}

}  // namespace

bool parse_unsigned(std::string_view text, std::uint64_t* out, std::string* why) {
  text = trim(text);
  if (text.empty()) {
    *why = "empty value";
    return false;
  }
  if (text.front() == '-') {
    *why = "must not be negative";
    return false;
  }
  if (text.front() == '+') text.remove_prefix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (ec == std::errc::result_out_of_range) {
    *why = "number too large";
    return false;
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    *why = "not a whole number";
    return false;
  }
  return true;
}

bool parse_size(std::string_view text, std::size_t default_unit, std::size_t* out,
                std::string* why) {
  text = trim(text);
  if (text.empty()) {
    *why = "empty value";
    return false;
  }
  if (equals_ignoring_case(text, "unlimited") || equals_ignoring_case(text, "none")) {
    *out = kUnlimited;
    return true;
  }
  if (text.front() == '-') {
    *why = "must not be negative";
    return false;
  }
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) {
    *why = "not a size (expected a number with an optional K, M, G or T suffix)";
    return false;
  }
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  (void)end;
  if (ec == std::errc::result_out_of_range) {
    *why = "size too large";
    return false;
  }
  std::size_t unit = default_unit;
  const std::string_view suffix = trim(text.substr(digits));
  if (!suffix.empty() && !suffix_multiplier(suffix, &unit)) {
    *why = "unknown size suffix '" + std::string(suffix) + "' (use K, M, G or T)";
    return false;
  }
  if (number > std::numeric_limits<std::size_t>::max() / unit) {
    *why = "size too large";
    return false;
  }
  *out = static_cast<std::size_t>(number) * unit;
  return true;
}

std::string format_size(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  static constexpr const char* kSuffix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  std::size_t v = bytes;
  while (i < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++i;
  }
  return std::to_string(v) + kSuffix[i];
}

bool ByteSize::parse(std::string_view text, value_type* out, std::string* why) {
  return parse_size(text, 1, out, why);
}

bool MiBSize::parse(std::string_view text, value_type* out, std::string* why) {
  return parse_size(text, kMiB, out, why);
}

std::string MiBSize::format(value_type v) {
  if (v == kUnlimited) return "unlimited";
  if (v % kMiB == 0) return std::to_string(v / kMiB);
  return format_size(v);
}

bool CountOrAuto::parse(std::string_view text, value_type* out, std::string* why) {
  if (equals_ignoring_case(trim(text), "auto")) {
    *out = kAuto;
    return true;
  }
  if (!parse_unsigned(text, out, why)) return false;
  if (*out < kAuto) return true;
  *why = "number too large";  // would read as auto
  return false;
}

bool Fraction::parse(std::string_view text, value_type* out, std::string* why) {
  text = trim(text);
  if (text.empty()) {
    *why = "empty value";
    return false;
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v == v)) {
    *why = "not a number";
    return false;
  }
  *out = v;
  return true;
}

std::string Fraction::format(value_type v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool Flag::parse(std::string_view text, value_type* out, std::string* why) {
  text = trim(text);
  for (const char* yes : {"1", "true", "yes", "on"}) {
    if (equals_ignoring_case(text, yes)) {
      *out = true;
      return true;
    }
  }
  for (const char* no : {"0", "false", "no", "off"}) {
    if (equals_ignoring_case(text, no)) {
      *out = false;
      return true;
    }
  }
  *why = text.empty() ? "empty value" : "must be 1 or 0 (or true/false, yes/no, on/off)";
  return false;
}

namespace {

bool parse_path_template(std::string_view text, bool device_field, std::string* out, std::string* why) {
  text = trim(text);
  if (text.empty()) {
    *why = "empty value";
    return false;
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') continue;
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (next != 'p' && next != 'e' && next != 'r' && next != '%' && !(device_field && next == 'd')) {
      std::string fields = "%p pid, %e program, %r rank, ";
      if (device_field) fields += "%d device, ";
      fields += "%% percent";
      why->assign("unknown '%").append(1, next).append("' (use ").append(fields).append(")");
      return false;
    }
    ++i;
  }
  *out = std::string(text);
  return true;
}

}  // namespace

bool NameList::parse(std::string_view text, value_type* out, std::string* why) {
  text = trim(text);
  if (text.empty()) {
    *why = "no library name";
    return false;
  }
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find(':', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view name = text.substr(start, end - start);
    if (name.empty()) {
      *why = "an empty name between colons";
      return false;
    }
    if (name.find('/') != std::string_view::npos) {
      *why = "a file name, not a path ('" + std::string(name) + "')";
      return false;
    }
    start = end + 1;
  }
  *out = std::string(text);
  return true;
}

bool names_match(const std::string& names, std::string_view path) {
  const std::size_t slash = path.rfind('/');
  const std::string_view file = slash == std::string_view::npos ? path : path.substr(slash + 1);
  std::string_view rest = names;
  while (!rest.empty()) {
    const std::size_t colon = rest.find(':');
    const std::string_view name = rest.substr(0, colon);
    if (!name.empty() && file.substr(0, name.size()) == name) return true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return false;
}

bool PathTemplate::parse(std::string_view text, value_type* out, std::string* why) {
  return parse_path_template(text, false, out, why);
}

bool DevicePathTemplate::parse(std::string_view text, value_type* out, std::string* why) {
  return parse_path_template(text, true, out, why);
}

bool Divisions::parse(std::string_view text, value_type* out, std::string* why) {
  text = trim(text);
  auto valid_division = [&](std::uint64_t d) {
    if (d != 0 && (!std::has_single_bit(d) || d > 1024)) {
      *why = "divisions must be 0 or a power of two up to 1024";
      return false;
    }
    return true;
  };
  value_type result{};
  if (text.empty() || text.front() != '[') {
    std::uint64_t d = 0;
    if (!parse_unsigned(text, &d, why) || !valid_division(d)) return false;
    result.fill(static_cast<std::uint32_t>(d));
    *out = result;
    return true;
  }
  if (text.back() != ']') {
    *why = "list must end with ']'";
    return false;
  }
  std::string_view body = text.substr(1, text.size() - 2);
  bool first = true;
  int last_index = -1;
  while (!body.empty()) {
    const std::size_t comma = body.find(',');
    const std::string_view item = trim(body.substr(0, comma));
    body = comma == std::string_view::npos ? std::string_view() : body.substr(comma + 1);
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      *why = "list entries are SIZE_MB:DIVISIONS or >:DIVISIONS";
      return false;
    }
    const std::string_view key = trim(item.substr(0, colon));
    std::uint64_t d = 0;
    if (!parse_unsigned(item.substr(colon + 1), &d, why) || !valid_division(d)) return false;
    if (key == ">") {
      for (int i = last_index + 1; i < kRoundupIntervals; ++i) result[i] = static_cast<std::uint32_t>(d);
      last_index = kRoundupIntervals - 1;
      continue;
    }
    std::uint64_t mb = 0;
    if (!parse_unsigned(key, &mb, why)) return false;
    if (mb == 0 || !std::has_single_bit(mb)) {
      *why = "interval starts must be powers of two (in MiB)";
      return false;
    }
    int index = static_cast<int>(std::bit_width(mb)) - 1;
    if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
    if (first) {
      for (int i = 0; i < index; ++i) result[i] = static_cast<std::uint32_t>(d);
      first = false;
    }
    result[index] = static_cast<std::uint32_t>(d);
    last_index = index;
  }
  *out = result;
  return true;
}

std::string Divisions::format(const value_type& v) {
  // Written so that parse reads back exactly this table: the first entry also
  // sets the intervals below it, '>' sets those after the last entry, and an
  // interval no entry names stays 0 (not the value before it).
  int lead_end = 0;  // the leading run of equal values: v[0..lead_end]
  while (lead_end + 1 < kRoundupIntervals && v[lead_end + 1] == v[0]) ++lead_end;
  if (lead_end == kRoundupIntervals - 1) return std::to_string(v[0]);
  int tail_begin = kRoundupIntervals - 1;  // the trailing run: v[tail_begin..]
  while (tail_begin - 1 > lead_end && v[tail_begin - 1] == v[kRoundupIntervals - 1]) --tail_begin;
  std::string s = "[";
  auto entry = [&](const std::string& key, std::uint32_t d) { s.append(key).append(":").append(std::to_string(d)).append(","); };
  entry(std::to_string(std::size_t{1} << lead_end), v[lead_end]);
  int last = lead_end;
  for (int i = lead_end + 1; i < tail_begin; ++i) {
    if (v[i] == 0) continue;
    entry(std::to_string(std::size_t{1} << i), v[i]);
    last = i;
  }
  if (v[tail_begin] != 0) {
    if (last != tail_begin - 1) entry(std::to_string(std::size_t{1} << tail_begin), v[tail_begin]);
    entry(">", v[tail_begin]);
  }
  s.back() = ']';
  return s;
}

bool Signal::parse(std::string_view text, value_type* out, std::string* why) {
  text = trim(text);
  if (equals_ignoring_case(text, "none") || equals_ignoring_case(text, "off") || text == "0") {
    *out = 0;
    return true;
  }
  if (equals_ignoring_case(text, "SIGUSR1") || equals_ignoring_case(text, "USR1") ||
      text == std::to_string(SIGUSR1)) {
    *out = SIGUSR1;
    return true;
  }
  if (equals_ignoring_case(text, "SIGUSR2") || equals_ignoring_case(text, "USR2") ||
      text == std::to_string(SIGUSR2)) {
    *out = SIGUSR2;
    return true;
  }
  *why = text.empty() ? "empty value" : "must be USR1, USR2 or none";
  return false;
}

std::string Signal::format(value_type v) {
  if (v == SIGUSR1) return "USR1";
  if (v == SIGUSR2) return "USR2";
  return "none";
}

}  // namespace gpupool::config
