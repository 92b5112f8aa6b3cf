// The pool's typed settings. config/ fills them from the environment; tests and
// the replay tool set them directly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "pool/types.hpp"

namespace gpupool {

// roundup_power2_divisions: one entry per power-of-two interval from 1 MiB
// ([1 MiB, 2 MiB) is entry 0) up to 32 GiB and above (entry 15); sizes below
// 1 MiB use entry 0. 0 or 1 means "no power-of-two rounding" for that interval.
inline constexpr int kRoundupIntervals = 16;
using RoundupDivisions = std::array<std::uint32_t, kRoundupIntervals>;

// Which free blocks a request on one stream may take from another stream.
enum class CrossStreamReuse : std::uint8_t {
  Auto,       // blocks whose last use is known complete; and, when new memory
              // cannot be had, blocks whose work may still run, the new stream
              // waiting for it on the device (cudaStreamWaitEvent, no host wait)
  Completed,  // only blocks whose last use is known complete: no device waits
  Never,      // none (PyTorch's rule): each stream keeps its own cache
};

struct PoolOptions {
  // Blocks at or above this size are never split and never serve a smaller
  // request (PyTorch's max_split_size_mb). kUnlimited: everything may split.
  // Fixed segments only: a pool with expandable segments runs unlimited.
  std::size_t max_split_size = kUnlimited;
  // An oversize request (>= max_split_size) takes a cached oversize block only
  // if it wastes less than this (PyTorch's max_non_split_rounding_mb).
  std::size_t max_non_split_rounding = 20 * kMiB;
  // Segment asked upstream for small requests, and for large requests below
  // half of large_segment_size.
  std::size_t small_segment_size = 2 * kMiB;
  std::size_t large_segment_size = 20 * kMiB;
  // Granularity of large segments above large_segment_size / 2.
  std::size_t large_segment_rounding = 2 * kMiB;
  RoundupDivisions roundup_divisions{};
  // 0 disables; otherwise (0, 1): once reserved memory passes this fraction of
  // memory_limit, cached segments unused for longest are returned first.
  double garbage_collection_threshold = 0.0;
  // Bytes this device's pool may reserve; kUnlimited: what the device gives.
  std::size_t memory_limit = kUnlimited;
  CrossStreamReuse cross_stream_reuse = CrossStreamReuse::Auto;
  // One growable address range per pool kind instead of fixed segments: pages
  // are mapped as the range grows and free pages can be unmapped, so free
  // space never strands between segments (PyTorch's expandable_segments).
  // Needs an upstream with virtual memory; without one, fixed segments.
  bool expandable_segments = false;
  // Expandable segments: before growing past the largest reservation so far,
  // while more than 2% of it is cached free, unmap as many free pages as the
  // growth needs among those whose last use is known complete (no host
  // waits), so the peak stays close to the live bytes.
  bool recycle_pages = true;
  // Recycling leaves alone the free blocks used within this many allocations:
  // they are the working set. Recycling them too keeps the peak lowest, but a
  // working set just above the peak then has its pages unmapped and mapped
  // again over and over, and on a GPU each map costs about as much as a
  // cudaMalloc. (Replaying the shared traces, 16 left 11 maps over passes 3-6
  // of one trace and none on the others, every peak within 5.1% of the live
  // bytes; 0 gives 2.8%. A loop one page above its peak: 4 maps, not 673.)
  std::uint64_t recycle_idle_allocations = 16;
  // A plain request whose best-fitting free block was freed since the last
  // device barrier looks at up to this many larger plain blocks for memory
  // that barrier covers before recording a new one (plain_reuse.cpp). Each
  // barrier makes every live non-blocking stream wait (PyTorch's stream pool:
  // 32 per priority level), so with many such streams it costs far more than
  // the one cudaEventRecord it is alone. It costs memory: replayed plain
  // beside 64 idle streams, 16 took the ordering calls per allocation from
  // 16-23 to 3-6 and peak reserved / peak live from 1.0124 to 1.0575
  // (gpt-medium-ctx512-infer), from 1.0456 to 1.1636 (multistream-10) and
  // from 1.0283 to 1.0382 (lora-finetune-1.3b), the other two within 0.003.
  // So kSearchAuto (the default) searches only
  // where barriers are dear: kAutoSearchLength blocks while the device has
  // kAutoSearchStreams or more live non-blocking streams, none below. (On an
  // H200, PyTorch steps with its stream pool took 1.10x its own allocator's
  // time without the search and 1.00x with it, one run each.)
  static constexpr std::uint32_t kSearchAuto = 0xFFFFFFFFu;
  static constexpr std::uint32_t kAutoSearchLength = 16;
  static constexpr std::size_t kAutoSearchStreams = 8;
  std::uint32_t plain_reuse_search = kSearchAuto;
  // Testing only: skip every ordering step (fences, barriers, event waits) so
  // that the hazard tests can show they fail without them. Never safe.
  bool unsafe_skip_ordering = false;
};

}  // namespace gpupool
