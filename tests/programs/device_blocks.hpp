// What the programs about several devices share: a block's size, a check of
// the device a block lies on, and a pattern written and checked.
#pragma once

#include "common.hpp"

namespace device_blocks {

inline constexpr size_t kBytes = 12 << 20;

inline void expect_on(const void* p, int device) {
  cudaPointerAttributes a{};
  CHECK_CUDA(cudaPointerGetAttributes(&a, p));
  if (a.type != cudaMemoryTypeDevice || a.device != device) {
    std::fprintf(stderr, "devices: %p is memory of device %d (type %d), asked of device %d\n", p, a.device,
                 static_cast<int>(a.type), device);
    std::exit(1);
  }
}

inline void fill(void* p, unsigned char tag, cudaStream_t stream) {
  CHECK_CUDA(cudaMemsetAsync(p, tag, kBytes, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(testprog::holds_sampled(p, kBytes, tag));
}

}  // namespace device_blocks
