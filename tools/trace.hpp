// Allocation traces in RMM's logging_resource_adaptor CSV layout:
//   Thread,Time,Action,Pointer,Size,Stream
// with actions allocate, allocate failure and free. GPUPOOL_TRACE writes them;
// gpupool-replay and the benchmarks read them.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "pool/types.hpp"

namespace gpupool::tools {

struct TraceEvent {
  enum class Action : std::uint8_t { Allocate, AllocateFailure, Free } action;
  std::uint64_t pointer;
  std::size_t size;
  StreamId stream;  // as written: 0x0 is the legacy default stream
  std::uint64_t time_us;
};

struct Trace {
  std::string name;
  std::vector<TraceEvent> events;
  // The number of a last line cut short (no newline, not a whole line),
  // which is left out; 0 if the trace ends whole.
  std::size_t cut_line = 0;
  // The number of a last line without a newline that reads as a whole line
  // (replayed): a writer stopped partway may have cut its last field's digits.
  std::size_t unterminated_line = 0;
};

// Reads a trace; on a malformed line returns false with "FILE:LINE: what".
// A malformed last line without a newline (not the file's first) is a trace
// cut short: it is left out and its number kept in `cut_line`.
bool read_trace(const std::string& path, Trace* out, std::string* error);
// The same from any stream; `name` stands for the file in messages.
bool parse_trace(std::istream& in, const std::string& name, Trace* out, std::string* error);

}  // namespace gpupool::tools
