// A device reset (cudaDeviceReset) frees every allocation and destroys every
// event and stream: the caller replaces the pool with a fresh one, which
// takes over the old one's history so that the report covers the whole run,
// not only what came after the last reset (CUDA's samples end with one).
#include "pool/device_pool.hpp"

namespace gpupool {

void DevicePool::continue_history(const DevicePool& before) {
  stats_ = before.stats_;
  end_current_figures(stats_);
  request_histogram_ = before.request_histogram_;
  free_blocks_at_peak_ = before.free_blocks_at_peak_;
  fragmentation_at_peak_ = before.fragmentation_at_peak_;
  peak_snapshot_ = before.peak_snapshot_;
  ooms_ = before.ooms_;
  timeline_ = before.timeline_;
  timeline_.record(stats_.pool_ops, now(), stats_);  // the drop to zero
  ordering_.continue_history(before.ordering_);

  reset_losses_ = before.reset_losses_;
  ++reset_losses_.resets;
  reset_losses_.segments = stats_.num_device_alloc - stats_.num_device_free;
  before.allocated_.for_each([&](DevicePtr, const Block* b) {
    ++reset_losses_.lost.blocks;
    reset_losses_.lost.bytes += b->size;
    if (b->site == 0) return;
    ResetLosses::Tally& t = reset_losses_.by_site[b->site];
    ++t.blocks;
    t.bytes += b->size;
  });
}

}  // namespace gpupool
