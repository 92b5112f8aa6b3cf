// Builds the report from the pools and writes it where GPUPOOL_LOG says.
#pragma once

#include <string>
#include <vector>

#include "config/config.hpp"
#include "shim/call_sites.hpp"
#include "shim/thread_cache.hpp"

namespace gpupool::shim {

struct DeviceState;

// %p pid, %e program name, %r distributed rank (RANK, LOCAL_RANK,
// OMPI_COMM_WORLD_RANK, SLURM_PROCID; 0 when none), %d `device`, %% percent.
std::string expand_path_template(const std::string& pattern, int device = 0);
// Whether the pattern has a %d (one file per device), a %p (one per process).
bool names_device(const std::string& pattern);
bool names_process(const std::string& pattern);

// Takes each device's lock in turn. Never calls into CUDA.
void write_report_file(const config::Config& config, const std::vector<config::Problem>& problems,
                       const std::vector<std::string>& notes, const std::vector<std::string>& trace_problems,
                       const std::vector<DeviceState*>& devices, CallSites& call_sites, StreamCaches& caches,
                       const char* reason, double wall_seconds);

}  // namespace gpupool::shim
