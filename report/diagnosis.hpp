// What the numbers mean: a verdict for each out-of-memory event, computed from
// the pool's state at that moment, and short advice lines that each name the
// variable to change and why.
#pragma once

#include <string>
#include <vector>

#include "report/report_data.hpp"

namespace gpupool::report {

enum class OomCause {
  TooLarge,       // larger than any device could hold
  LimitReached,   // GPUPOOL_MEMORY_LIMIT refused it
  PendingReuse,   // a free block fit, but the work before its free was not known done
  CaptureKeptCache,  // giving the cache back would have made room, but a capture forbade it
  Fragmentation,  // the pool held enough free bytes, but in pieces too small
  OtherUsers,     // the device's memory is taken by someone other than this pool
  DeviceRefused,  // the device said no though it reports room for the request
  DeviceFull,     // this process's live allocations fill the device
};

struct OomDiagnosis {
  OomCause cause = OomCause::DeviceFull;
  std::string verdict;  // one sentence with the numbers
  std::string advice;   // the setting that would help, or empty
};

OomDiagnosis diagnose(const OomRecord& oom, const PoolOptions& options);
const char* cause_name(OomCause cause);

std::vector<std::string> advice(const DeviceReport& device);

// "1.50 GiB", "512 MiB", "3.0 KiB", "100 B"
std::string human_bytes(double bytes);

}  // namespace gpupool::report
