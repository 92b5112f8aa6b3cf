// Samples of allocated/reserved/requested bytes over a run in bounded memory:
// when the buffer fills, every other sample is dropped and the sampling stride
// doubles, so a run of any length keeps an evenly spread picture.
#pragma once

#include <cstdint>
#include <vector>

#include "pool/stats.hpp"

namespace gpupool {

class Timeline {
 public:
  explicit Timeline(std::size_t capacity = 1024) : capacity_(capacity < 4 ? 4 : capacity) {
    samples_.reserve(capacity_);
  }

  // Asked once per pool operation: keep one sample per `stride` operations,
  // plus each new reserved peak when it happens (a later decimation may drop
  // it again; the exact peaks live in the statistics).
  bool wants(std::uint64_t op, bool new_peak) const { return new_peak || (op & (stride_ - 1)) == 0; }

  void record(std::uint64_t op, std::uint64_t time_ns, const MemoryStats& s) {
    if (samples_.size() == capacity_) decimate();
    samples_.push_back(TimelineSample{time_ns, op, s.allocated_bytes[kAll].current,
                                      s.reserved_bytes[kAll].current,
                                      s.requested_bytes[kAll].current});
  }

  const std::vector<TimelineSample>& samples() const { return samples_; }
  std::uint64_t stride() const { return stride_; }

 private:
  void decimate() {
    std::size_t out = 0;
    for (std::size_t i = 0; i < samples_.size(); i += 2) samples_[out++] = samples_[i];
    samples_.resize(out);
    stride_ *= 2;
  }

  std::size_t capacity_;
  std::uint64_t stride_ = 1;  // a power of two
  std::vector<TimelineSample> samples_;
};

}  // namespace gpupool
