// Free blocks of one size class, ordered by (stream, size, address): lower_bound
// on (stream, size) is the best fit among the blocks reusable on that stream.
#pragma once

#include "pool/block.hpp"
#include "pool/node_recycler.hpp"

namespace gpupool {

class BlockPool {
 public:
  using Set = BlockSet;

  explicit BlockPool(PoolKind kind) : kind_(kind), blocks_(BlockOrder{}, RecyclingAllocator<Block*>(&nodes_)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  PoolKind kind() const { return kind_; }

  // The smallest free block of at least `size` bytes keyed to `stream`, or null.
  Block* best_fit(StreamId stream, std::size_t size) const {
    Block probe;
    probe.stream = stream;
    probe.size = size;
    probe.addr = 0;
    auto it = blocks_.lower_bound(&probe);
    if (it == blocks_.end() || (*it)->stream != stream) return nullptr;
    return *it;
  }

  // The first key (stream) after `after`, for walking every stream's blocks;
  // returns false when there is none.
  bool next_stream(StreamId after, StreamId* out, bool first) const {
    Block probe;
    probe.stream = after;
    probe.size = kUnlimited;
    probe.addr = ~DevicePtr{0};
    auto it = first ? blocks_.begin() : blocks_.upper_bound(&probe);
    if (it == blocks_.end()) return false;
    *out = (*it)->stream;
    return true;
  }

  // The block after `block` in (stream, size, address) order, or null.
  Block* next(Block* block) const {
    auto it = blocks_.upper_bound(block);
    return it == blocks_.end() ? nullptr : *it;
  }

  // A block in the pool remembers its position, so erasing needs no search.
  void insert(Block* block) { block->pool_position = blocks_.insert(block).first; }
  void erase(Block* block) { blocks_.erase(block->pool_position); }
  bool contains(Block* block) const { return blocks_.count(block) != 0; }
  std::size_t size() const { return blocks_.size(); }
  const Set& blocks() const { return blocks_; }

 private:
  PoolKind kind_;
  NodeRecycler nodes_;
  Set blocks_;
};

}  // namespace gpupool
