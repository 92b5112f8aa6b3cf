// This thread's per-thread default stream as a pool stream id (thread_state.hpp).
#include <atomic>

#include "shim/thread_state.hpp"

namespace gpupool::shim {

StreamId this_thread_stream() {
  static std::atomic<StreamId> next{1};
  thread_local const StreamId id = (next.fetch_add(1) << 4) | 0x2;
  return id;
}

}  // namespace gpupool::shim
