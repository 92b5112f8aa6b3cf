// Free blocks of one size class, ordered by (stream, size, address): lower_bound
// on (stream, size) is the best fit among the blocks reusable on that stream.
// An intrusive tree: a block links itself in (see Block::pool_hook), so an
// insert allocates nothing and an erase or a step to the next block needs no
// search.
#pragma once

#include <iterator>

#include <boost/intrusive/set.hpp>

#include "pool/block.hpp"

namespace gpupool {

class BlockPool {
 public:
  using Set = boost::intrusive::set<Block, boost::intrusive::member_hook<Block, BlockHook, &Block::pool_hook>,
                                    boost::intrusive::compare<BlockOrder>>;

  // The blocks in order, as pointers (what the walks over them want).
  class Range {
   public:
    class Iterator {
     public:
      explicit Iterator(Set::const_iterator it) : it_(it) {}
      Block* operator*() const { return const_cast<Block*>(&*it_); }
      Iterator& operator++() {
        ++it_;
        return *this;
      }
      bool operator!=(const Iterator& other) const { return it_ != other.it_; }

     private:
      Set::const_iterator it_;
    };
    explicit Range(const Set& set) : set_(set) {}
    Iterator begin() const { return Iterator(set_.begin()); }
    Iterator end() const { return Iterator(set_.end()); }

   private:
    const Set& set_;
  };

  explicit BlockPool(PoolKind kind) : kind_(kind) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  PoolKind kind() const { return kind_; }

  // The smallest free block of at least `size` bytes keyed to `stream`, or null.
  Block* best_fit(StreamId stream, std::size_t size) const {
    Block probe;
    probe.stream = stream;
    probe.size = size;
    probe.addr = 0;
    auto it = blocks_.lower_bound(probe);
    if (it == blocks_.end() || it->stream != stream) return nullptr;
    return const_cast<Block*>(&*it);
  }

  // The first key (stream) after `after`, for walking every stream's blocks;
  // returns false when there is none.
  bool next_stream(StreamId after, StreamId* out, bool first) const {
    Block probe;
    probe.stream = after;
    probe.size = kUnlimited;
    probe.addr = ~DevicePtr{0};
    auto it = first ? blocks_.begin() : blocks_.upper_bound(probe);
    if (it == blocks_.end()) return false;
    *out = it->stream;
    return true;
  }

  // The block after `block` (which is in the pool) in (stream, size,
  // address) order, or null.
  Block* next(const Block* block) const {
    auto it = blocks_.iterator_to(*block);
    return ++it == blocks_.end() ? nullptr : const_cast<Block*>(&*it);
  }

  void insert(Block* block) { blocks_.insert(*block); }
  // Unlinks by position: no comparison, so `block`'s key may be stale.
  void erase(Block* block) { blocks_.erase(blocks_.iterator_to(*block)); }

  // A block split or joined at its far end usually still sorts between its
  // neighbours, and so keeps its place: no search, no rebalancing. A cache-hit
  // pair on a stream then makes no insert or erase; a plain one, whose
  // allocation splits twice (plain_reuse.cpp), makes one of each.
  //
  // `block` (in the pool) changed its key in place: keeps it ordered.
  [[gnu::always_inline]] void rekeyed(Block* block) {
    const auto it = blocks_.iterator_to(*block);
    if (sorts_at(it, *block)) return;
    blocks_.erase(it);
    blocks_.insert(*block);
  }
  // `with` (in no pool) takes `old`'s place whatever its key, and `old`
  // leaves the pool: the caller calls rekeyed(with) before anything else
  // looks into the pool (erase() may come in between).
  void take_place(Block* old, Block* with) { blocks_.replace_node(blocks_.iterator_to(*old), *with); }

  // Whether every block sorts strictly after the one before it (validate()).
  bool ordered() const {
    const Block* before = nullptr;
    for (const Block& b : blocks_) {
      if (before != nullptr && !BlockOrder()(*before, b)) return false;
      before = &b;
    }
    return true;
  }
  bool contains(const Block* block) const {
    auto it = blocks_.find(*block);
    return it != blocks_.end() && &*it == block;
  }
  std::size_t size() const { return blocks_.size(); }
  Range blocks() const { return Range(blocks_); }

 private:
  // Whether `key` sorts strictly between the neighbours of the block at `it`.
  bool sorts_at(Set::const_iterator it, const Block& key) const {
    if (it != blocks_.begin() && !BlockOrder()(*std::prev(it), key)) return false;
    const auto after = std::next(it);
    return after == blocks_.end() || BlockOrder()(key, *after);
  }

  PoolKind kind_;
  Set blocks_;
};

}  // namespace gpupool
