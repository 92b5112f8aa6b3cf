// Recycles fixed-size nodes (the pool's blocks) so that the hot path (a block
// per split) does not call malloc: free nodes go on a list and are handed out
// again. Memory is returned to the heap when the recycler dies.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace gpupool {

class NodeRecycler {
 public:
  NodeRecycler() = default;
  NodeRecycler(const NodeRecycler&) = delete;
  NodeRecycler& operator=(const NodeRecycler&) = delete;
  ~NodeRecycler() {
    for (void* chunk : chunks_) ::operator delete(chunk);
  }

  // All nodes of one recycler have the same size: the first one asked for.
  void* take(std::size_t bytes) {
    if (node_size_ == 0) node_size_ = bytes < sizeof(FreeNode) ? sizeof(FreeNode) : bytes;
    if (bytes > node_size_) return ::operator new(bytes);
    if (free_ == nullptr) grow();
    FreeNode* node = free_;
    free_ = node->next;
    --free_count_;
    return node;
  }

  // Makes sure the next `nodes` takes of `bytes` allocate nothing, so none of
  // them can throw: an operation that may need them reserves them before it
  // changes anything.
  void reserve(std::size_t nodes, std::size_t bytes) {
    if (free_count_ < nodes) grow_to(nodes, bytes);
  }

  void give_back(void* p, std::size_t bytes) {
    if (bytes > node_size_) {
      ::operator delete(p);
      return;
    }
    auto* node = static_cast<FreeNode*>(p);
    node->next = free_;
    free_ = node;
    ++free_count_;
  }

 private:
  struct FreeNode {
    FreeNode* next;
  };
  static constexpr std::size_t kNodesPerChunk = 256;

  // Out of line: reserve() runs on every allocation, and only its check
  // belongs on that path.
  [[gnu::noinline, gnu::cold]] void grow_to(std::size_t nodes, std::size_t bytes) {
    if (node_size_ == 0) node_size_ = bytes < sizeof(FreeNode) ? sizeof(FreeNode) : bytes;
    while (free_count_ < nodes) grow();
  }

  [[gnu::noinline, gnu::cold]] void grow() {
    const std::size_t stride = (node_size_ + alignof(std::max_align_t) - 1) /
                               alignof(std::max_align_t) * alignof(std::max_align_t);
    char* chunk = static_cast<char*>(::operator new(stride * kNodesPerChunk));
    try {
      chunks_.push_back(chunk);
    } catch (...) {
      ::operator delete(chunk);
      throw;
    }
    for (std::size_t i = 0; i < kNodesPerChunk; ++i) {
      auto* node = reinterpret_cast<FreeNode*>(chunk + i * stride);
      node->next = free_;
      free_ = node;
    }
    free_count_ += kNodesPerChunk;
    node_size_ = stride;
  }

  std::size_t node_size_ = 0;
  FreeNode* free_ = nullptr;
  std::size_t free_count_ = 0;
  std::vector<void*> chunks_;
};

}  // namespace gpupool
