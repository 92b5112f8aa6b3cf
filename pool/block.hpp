// A block is a piece of a segment: allocated to the program, or free and cached.
// The blocks of a segment tile it exactly and are linked in address order.
#pragma once

#include <cstddef>
#include <cstdint>

#include <boost/intrusive/set_hook.hpp>

#include "pool/types.hpp"

namespace gpupool {

struct Block;

// Free blocks are kept ordered by (stream, size, address): see BlockPool.
// The tree's links live in the block itself (no node to allocate, one load
// less per comparison); normal_link: no checks on the hot path.
using BlockHook = boost::intrusive::set_member_hook<boost::intrusive::link_mode<boost::intrusive::normal_link>>;

// One upstream allocation. Its head block always starts at `base` (merging keeps
// the lower block), so the head never changes while the segment lives.
struct Segment {
  DevicePtr base = 0;
  std::size_t size = 0;  // an expandable segment's whole address range
  PoolKind kind = PoolKind::Small;
  // Expandable: only mapped pages are memory; unmapped blocks are address space.
  bool expandable = false;
  std::size_t mapped_bytes = 0;
  Block* head = nullptr;
  // garbage collection: the pool's reuse-attempt counter when the segment last
  // became entirely free (its "age" is how many attempts passed since).
  std::uint64_t idle_since = 0;
};

struct Block {
  DevicePtr addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // allocated: the bytes the program asked for
  // Allocated: the stream the program named (kAnyStream for cudaMalloc).
  // Free: the stream on which the block may be reused with no ordering step
  // (kAnyStream: reuse needs the device barrier to cover device_epoch).
  StreamId stream = kAnyStream;
  std::uint64_t stream_epoch = 0;  // free: `stream`'s free epoch at the free
  std::uint64_t device_epoch = 0;  // free: the device free epoch at the free
  // Free: the pool's reuse-attempt count at the latest free that made it up
  // (recycling leaves the pages of recently used blocks alone).
  std::uint64_t freed_at = 0;
  // Free: bytes outside [hot_begin, hot_end) were last freed at device epochs
  // <= cold_epoch (see plain_reuse.cpp); an empty range (begin == end) means
  // every byte. Kept up to date by frees, merges and splits.
  DevicePtr hot_begin = 0;
  DevicePtr hot_end = 0;
  std::uint64_t cold_epoch = 0;
  // Free: the hot bytes outside [fresh_begin, fresh_end), which holds those
  // of the newest free into the block, were last freed at device epochs <=
  // older_epoch. Completion fences reach them first: a stream may take them
  // while the newest free is pending. Only its part within the hot range
  // counts (splits leave it as it is).
  DevicePtr fresh_begin = 0;
  DevicePtr fresh_end = 0;
  std::uint64_t older_epoch = 0;
  Block* prev = nullptr;           // neighbours in the segment, by address
  Block* next = nullptr;
  Segment* segment = nullptr;
  std::uint32_t site = 0;  // allocation call site (0: not recorded)
  bool allocated = false;
  // False only for free blocks of an expandable segment whose pages are not
  // backed by memory; such blocks start and end on page boundaries.
  bool mapped = true;
  // Freed inside a stream capture: the free happens when the graph runs, which
  // the pool cannot see, so the block is kept out of reuse for good.
  bool quarantined = false;

  // Its links in the BlockPool that holds it while it is free.
  BlockHook pool_hook;

  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool is_free() const { return !allocated && !quarantined; }
  bool is_free_mapped() const { return is_free() && mapped; }
};

struct BlockOrder {
  bool operator()(const Block& a, const Block& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    return a.addr < b.addr;
  }
};

}  // namespace gpupool
