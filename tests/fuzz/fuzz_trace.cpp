// gpupool-replay reads trace files users bring from anywhere. Whatever the
// bytes: no crash, a rejected file gets one line naming the file and line,
// only an unterminated last line is left out as cut short,
// and an accepted one replays (stream-ordered and plain) with its books
// balanced: every allocation and free accounted for, nothing live at the end,
// and a free unknown exactly when its pointer is not live in the trace at that
// point (an allocation that fails in the replay's smaller device is still live).
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_set>

#include "tests/fuzz/fuzz_check.hpp"
#include "tools/replay.hpp"
#include "tools/trace.hpp"

using namespace gpupool;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  tools::Trace trace;
  std::string error;
  if (!tools::parse_trace(in, "fuzz.csv", &trace, &error)) {
    FUZZ_CHECK(error.rfind("fuzz.csv:", 0) == 0);
    FUZZ_CHECK(error.find('\n') == std::string::npos);
    return 0;
  }
  // Only a last line without its newline is left out as cut short.
  FUZZ_CHECK(trace.cut_line == 0 || (trace.cut_line > 1 && data[size - 1] != '\n'));
  // A last line without its newline that reads whole is replayed, and named.
  FUZZ_CHECK(trace.unterminated_line == 0 || (trace.cut_line == 0 && data[size - 1] != '\n'));
  // And a last line without its newline is one or the other, unless empty or the header.
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::size_t end = text.rfind('\n');
  std::string last = text.substr(end == std::string::npos ? 0 : end + 1);
  if (!last.empty() && last.back() == '\r') last.pop_back();
  const bool header = end == std::string::npos && last.rfind("Thread", 0) == 0;
  FUZZ_CHECK(last.empty() || header || trace.cut_line != 0 || trace.unterminated_line != 0);
  auto count = [&](tools::TraceEvent::Action action) {
    return static_cast<std::uint64_t>(std::count_if(trace.events.begin(), trace.events.end(),
                                                    [&](const tools::TraceEvent& e) { return e.action == action; }));
  };
  const std::uint64_t allocations = count(tools::TraceEvent::Action::Allocate);
  const std::uint64_t frees = count(tools::TraceEvent::Action::Free);
  std::uint64_t unknown_frees = 0;  // per pass
  std::unordered_set<std::uint64_t> live;
  for (const tools::TraceEvent& e : trace.events) {
    if (e.action == tools::TraceEvent::Action::Allocate) live.insert(e.pointer);
    if (e.action == tools::TraceEvent::Action::Free && live.erase(e.pointer) == 0) ++unknown_frees;
  }
  for (const bool plain : {false, true}) {
    PoolOptions options;
    options.expandable_segments = !plain;  // both segment kinds, one with each mode
    const std::size_t capacity = 4 * kGiB;
    const tools::ReplayResult r = tools::replay(trace, options, capacity, 2, !plain, plain);
    FUZZ_CHECK(r.allocations == 2 * allocations);
    FUZZ_CHECK(r.frees + r.unknown_frees == 2 * frees);
    FUZZ_CHECK(r.unknown_frees == 2 * unknown_frees);
    FUZZ_CHECK(r.peak_reserved <= capacity);
    FUZZ_CHECK(r.device.stats.allocated_bytes[kAll].current == 0);
    FUZZ_CHECK(r.device.stats.requested_bytes[kAll].current == 0);
  }
  return 0;
}
