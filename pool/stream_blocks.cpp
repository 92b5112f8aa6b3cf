// A stream's cached blocks as the stream comes and goes: a handle that names a
// new stream, a stream destroyed or found gone. Their blocks are keyed anew so
// that no block stays keyed to a handle another stream may get (the books of
// the streams themselves are stream_books.cpp's).
#include <algorithm>
#include <unordered_set>
#include <vector>

#include "pool/device_pool.hpp"

namespace gpupool {

bool DevicePool::stream_created(StreamId id, StreamKind kind) {
  // A handle already known names a new stream (see StreamOrdering::
  // stream_created): what the old stream left cached is a destroyed stream's.
  if (kind != StreamKind::PerThread && ordering_.knows(id)) rekey(id, kAnyStream);
  return ordering_.stream_created(id, kind);
}

void DevicePool::stream_destroy_begin(StreamId id) {
  const StreamId key = ordering_.stream_destroy_begin(id);
  try {
    rekey(id, key);
  } catch (...) {
    // Out of host memory partway: some blocks may stay keyed to the stream,
    // whose row must then be among the report's gone streams to count them.
    ordering_.stream_destroy_end(id, true);
    ordering_.destroyed_stream_keys_left();
    throw;
  }
}

void DevicePool::rekey(StreamId id, StreamId key) {
  // Blocks keyed to the stream: from now on the device barrier (which the
  // retired fence feeds), or the destroyed stream's own event (`key`), orders
  // their reuse. A new stream may get the same handle, so none may stay keyed
  // to it.
  for (BlockPool& pool : pools_) {
    // Found before any is taken out (the lists may allocate).
    std::vector<Block*> keyed;
    for (Block* b = pool.best_fit(id, 0); b != nullptr && b->stream == id; b = pool.next(b)) keyed.push_back(b);
    // Re-keyed, a block may now merge with a neighbour it was kept apart from
    // (see mergeable): in address order, each joins the block before it.
    std::sort(keyed.begin(), keyed.end(), [](const Block* a, const Block* b) { return a->addr < b->addr; });
    std::unordered_set<const Block*> waiting(keyed.begin(), keyed.end());
    for (Block* b : keyed) remove_free(b);
    for (Block* b : keyed) {
      waiting.erase(b);
      b->stream = key;
      b->stream_epoch = 0;
      merge_and_list(b, &waiting);
    }
  }
}

void DevicePool::forget_gone_streams() {
  const std::vector<StreamId> gone = ordering_.gone_streams();
  for (StreamId id : gone) rekey(id, kAnyStream);
  forgotten_streams_.reserve(forgotten_streams_.size() + gone.size());  // room first: nothing fails after
  const std::vector<StreamId> dropped = ordering_.forget_gone_streams();
  forgotten_streams_.insert(forgotten_streams_.end(), dropped.begin(), dropped.end());
}

}  // namespace gpupool
