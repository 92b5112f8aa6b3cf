#include "tools/trace.hpp"

#include <charconv>
#include <fstream>
#include <string_view>

namespace gpupool::tools {

namespace {

bool parse_hex(std::string_view s, std::uint64_t* out) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

bool parse_decimal(std::string_view s, std::uint64_t* out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 10);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// HH:MM:SS.ffffff -> microseconds.
bool parse_time(std::string_view s, std::uint64_t* out) {
  std::uint64_t h = 0, m = 0, sec = 0, frac = 0;
  if (s.size() < 8 || s[2] != ':' || s[5] != ':') return false;
  if (!parse_decimal(s.substr(0, 2), &h) || !parse_decimal(s.substr(3, 2), &m) ||
      !parse_decimal(s.substr(6, 2), &sec)) {
    return false;
  }
  std::string_view rest = s.substr(8);
  if (!rest.empty()) {
    if (rest[0] != '.' || !parse_decimal(rest.substr(1), &frac)) return false;
    for (std::size_t digits = rest.size() - 1; digits < 6; ++digits) frac *= 10;
    for (std::size_t digits = rest.size() - 1; digits > 6; --digits) frac /= 10;
  }
  *out = ((h * 60 + m) * 60 + sec) * 1000000 + frac;
  return true;
}

// One line's fields into `e`; the error, or nullptr if the line is good.
const char* parse_line(std::string_view line, TraceEvent* e, std::string* detail) {
  std::string_view fields[6];
  std::string_view rest = line;
  int n = 0;
  for (; n < 6 && !rest.empty(); ++n) {
    const std::size_t comma = rest.find(',');
    fields[n] = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  if (n != 6 || !rest.empty()) return "expected 6 fields: Thread,Time,Action,Pointer,Size,Stream";
  if (fields[2] == "allocate") {
    e->action = TraceEvent::Action::Allocate;
  } else if (fields[2] == "free") {
    e->action = TraceEvent::Action::Free;
  } else if (fields[2] == "allocate failure") {
    e->action = TraceEvent::Action::AllocateFailure;
  } else {
    *detail = "unknown action '" + std::string(fields[2]) + "' (allocate, allocate failure or free)";
    return detail->c_str();
  }
  if (!parse_time(fields[1], &e->time_us)) return "bad time (expected HH:MM:SS.ffffff)";
  if (!parse_hex(fields[3], &e->pointer)) return "bad pointer (expected hexadecimal)";
  std::uint64_t size = 0;
  if (!parse_decimal(fields[4], &size)) return "bad size (expected a decimal byte count)";
  e->size = static_cast<std::size_t>(size);
  std::uint64_t stream = 0;
  if (!parse_hex(fields[5], &stream)) return "bad stream (expected hexadecimal)";
  e->stream = stream;
  return nullptr;
}

}  // namespace

bool read_trace(const std::string& path, Trace* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open";
    return false;
  }
  if (!parse_trace(in, path, out, error)) return false;
  out->name = path.substr(path.find_last_of('/') + 1);
  return true;
}

bool parse_trace(std::istream& in, const std::string& name, Trace* out, std::string* error) {
  out->name = name;
  out->events.clear();
  out->cut_line = 0;
  out->unterminated_line = 0;
  std::string line;
  std::string detail;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    // getline stopped at the end of the file, not at a newline.
    const bool unterminated = in.eof();
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (number == 1 && line.rfind("Thread", 0) == 0) continue;  // the header
    TraceEvent e{};
    if (const char* what = parse_line(line, &e, &detail)) {
      // A writer stopped partway (a full disk, a reader gone, a crash) leaves
      // its last line cut: the lines before it still make a trace. A file
      // of one such line is more likely no trace at all.
      if (unterminated && number > 1) {
        out->cut_line = number;
        return true;
      }
      *error = name + ":" + std::to_string(number) + ": " + what + " ('" + line + "')";
      return false;
    }
    out->events.push_back(e);
    if (unterminated) out->unterminated_line = number;
  }
  return true;
}

}  // namespace gpupool::tools
