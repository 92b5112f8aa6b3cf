// The per-thread caches of stream-ordered frees (shim/thread_cache.cpp) under
// any sequence of keeps, takes, flushes and device resets, with any size
// bound. Every kept block comes back exactly once (taken again, pushed out,
// flushed, or given back to the pool before its device is reset); a taken
// block suits the request; the cache never holds more than its bounds; the
// blocks it counts as sent back for want of room are those a keep gave back
// and those a miss took from the spill.
#include <algorithm>
#include <cstdint>
#include <map>

#include "pool/size_rules.hpp"
#include "shim/thread_cache.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace gpupool;
using namespace gpupool::shim;

namespace {

std::map<DevicePtr, CachedBlock>* g_outstanding = nullptr;  // kept, not yet back
std::int64_t g_given_back = 0;  // blocks the caches gave back to the "pool"

void came_back(const CachedBlock& b) {
  auto it = g_outstanding->find(b.ptr);
  FUZZ_CHECK(it != g_outstanding->end());  // kept once, back once
  FUZZ_CHECK(it->second.block.size == b.block.size && it->second.stream == b.stream);
  g_outstanding->erase(it);
}

void given_back(const CachedBlock& b) {
  ++g_given_back;
  came_back(b);
}

StreamCaches& caches() {
  static auto* c = new StreamCaches(given_back);  // one per process, as in the shim
  return *c;
}

std::int64_t let_go(StreamCaches& c) { return c.traffic(0).let_go + c.traffic(1).let_go; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<DevicePtr, CachedBlock> outstanding;
  g_outstanding = &outstanding;
  StreamCaches& c = caches();
  std::size_t at = 0;
  auto byte = [&]() -> std::uint8_t { return at < size ? data[at++] : 0; };
  const std::size_t bounds[] = {1 * kMiB, 64 * kMiB, 256 * kMiB, 16 * kGiB};
  c.set_max_bytes(bounds[byte() % 4]);
  DevicePtr next = DevicePtr{1} << 40;
  std::int64_t expected_let_go = let_go(c);
  for (int step = 0; step < 8192 && at < size; ++step) {
    const std::uint8_t op = byte();
    const StreamId stream = 0x100 + byte() % 3;
    const int device = byte() % 2;
    const std::size_t bytes = (std::size_t{512} << (byte() % 22)) * (1 + byte() % 5);
    switch (op % 8) {
      case 0: case 1: case 2: {  // a cudaFreeAsync kept in this thread's cache
        const CachedBlock b{next, LiveBlock{bytes, bytes - bytes / 8, device, true}, stream};
        next += bytes + 512;
        outstanding.emplace(b.ptr, b);
        const std::int64_t before = g_given_back;
        c.keep(b);
        expected_let_go += g_given_back - before;  // all for want of room
        break;
      }
      case 3: case 4: case 5: {  // a cudaMallocAsync served from it
        CachedBlock got{};
        if (op & 8) {  // an allocation the cache could not serve takes the spill to the pool
          if (c.take_spill(device, &got)) {
            FUZZ_CHECK(got.block.device == device && got.block.size <= c.max_bytes() / 4);
            came_back(got);
            ++expected_let_go;
          }
          break;
        }
        if (!c.take(stream, device, bytes, bytes, &got)) break;
        FUZZ_CHECK(got.stream == stream && got.block.device == device);
        FUZZ_CHECK(got.block.size >= bytes && got.block.size <= bytes + bytes / 4);
        came_back(got);
        break;
      }
      case 6:
        if (op & 8) c.flush_all();
        else c.flush_stream(stream);
        break;
      case 7:  // cudaDeviceReset: the device's cached blocks go back to its pool, the others stay
        c.forget_device(device);
        for (const auto& [ptr, b] : outstanding) FUZZ_CHECK(b.block.device != device);
        break;
    }
    std::size_t held = 0;
    std::size_t largest = 0;
    for (const auto& [ptr, b] : outstanding) {
      held += b.block.size;
      largest = std::max(largest, b.block.size);
    }
    FUZZ_CHECK(outstanding.size() <= ThreadCache::kCapacity);
    FUZZ_CHECK(let_go(c) == expected_let_go);
    // Within the limit, but for the spill: one block of at most a quarter of it.
    FUZZ_CHECK(held - largest <= c.max_bytes() && held <= c.max_bytes() + c.max_bytes() / 4);
  }
  c.flush_all();
  FUZZ_CHECK(outstanding.empty());
  g_outstanding = nullptr;
  return 0;
}
