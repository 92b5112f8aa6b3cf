// Builds a DeviceReport from a pool's state (the caller holds the pool's lock).
#pragma once

#include "pool/device_pool.hpp"
#include "report/report_data.hpp"

namespace gpupool::report {

// `largest_leaks`: how many of the largest live blocks to itemize.
DeviceReport collect(const DevicePool& pool, int device, std::size_t largest_leaks = 10);

}  // namespace gpupool::report
