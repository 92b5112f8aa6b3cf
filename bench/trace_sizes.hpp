// The allocation sizes of the real traces (read at run time from the folder
// TRACES_DIR names, by default ../shared/traces beside the checkout), in
// trace order; a fixed mix when no trace is there.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tools/trace.hpp"

namespace gpupool::bench {

inline std::string traces_dir() {
  const char* dir = std::getenv("TRACES_DIR");
  return dir != nullptr ? dir : GPUPOOL_SOURCE_DIR "/../shared/traces";
}

inline std::vector<std::string> trace_paths() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(traces_dir(), ec)) {
    if (entry.path().extension() == ".csv") out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Where the sizes come from, for a benchmark's output: runs compared side by
// side must have read the same ones (a checkout elsewhere finds no traces
// beside it and falls back to the fixed mix).
inline std::string size_source() {
  const std::size_t traces = trace_paths().size();
  return traces > 0 ? std::to_string(traces) + " traces in " + traces_dir()
                    : "a fixed mix (no trace in " + traces_dir() + ")";
}

inline std::vector<std::size_t> trace_sizes() {
  std::vector<std::size_t> sizes;
  for (const std::string& path : trace_paths()) {
    tools::Trace t;
    std::string error;
    if (!tools::read_trace(path, &t, &error)) continue;
    for (const tools::TraceEvent& e : t.events) {
      if (e.action == tools::TraceEvent::Action::Allocate && e.size > 0) sizes.push_back(e.size);
    }
  }
  if (sizes.empty()) sizes = {512, 4096, 65536, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20, 256 << 20};
  return sizes;
}

}  // namespace gpupool::bench
