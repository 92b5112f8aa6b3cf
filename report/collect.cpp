#include "report/collect.hpp"

#include <algorithm>

namespace gpupool::report {

DeviceReport collect(const DevicePool& pool, int device, std::size_t largest_leaks) {
  DeviceReport d;
  d.device = device;
  d.options = pool.options();
  d.stats = pool.stats();
  d.fragmentation = pool.fragmentation();
  d.fragmentation_at_peak = pool.fragmentation_at_peak();
  d.requests = pool.request_histogram();
  d.free_blocks_at_peak = pool.free_blocks_at_peak();
  d.free_blocks_now = pool.free_block_histogram();
  d.streams = pool.streams();
  d.ooms = pool.ooms();
  d.timeline = pool.timeline().samples();
  d.timeline_stride = pool.timeline().stride();
  d.quarantined_bytes = pool.quarantined_bytes();
  d.resets.count = pool.reset_losses().resets;
  d.resets.blocks = pool.reset_losses().lost.blocks;
  d.resets.bytes = pool.reset_losses().lost.bytes;
  pool.for_each_allocated([&](const Block& b) {
    ++d.leaks.blocks;
    d.leaks.bytes += b.size;
    d.leaks.requested_bytes += b.requested;
    d.leaks.largest.push_back(LeakedBlock{b.addr, b.size, b.requested, b.stream});
  });
  std::sort(d.leaks.largest.begin(), d.leaks.largest.end(), [](const LeakedBlock& a, const LeakedBlock& b) {
    return a.size != b.size ? a.size > b.size : a.addr < b.addr;
  });
  if (d.leaks.largest.size() > largest_leaks) d.leaks.largest.resize(largest_leaks);
  return d;
}

}  // namespace gpupool::report
