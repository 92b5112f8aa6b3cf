// The shim's per-thread cache (shim/thread_cache.cpp has no CUDA in it): what
// it keeps, what it gives back to the pool, and that it never exceeds its
// limits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <thread>
#include <vector>

#include "shim/thread_cache.hpp"

namespace gpupool::shim {
namespace {

std::vector<CachedBlock>& given_back() {
  static std::vector<CachedBlock> blocks;
  return blocks;
}
void record_give_back(const CachedBlock& b) { given_back().push_back(b); }

// One for the whole binary, as in the shim (a thread's cache outlives tests);
// each test empties it first and uses streams of its own.
StreamCaches& caches() {
  static auto* c = new StreamCaches(record_give_back);
  return *c;
}

struct CacheFixture {
  CacheFixture() {
    caches().flush_all();
    given_back().clear();
  }
  DevicePtr next = 1 << 20;
  CachedBlock block(std::size_t size, StreamId stream) {
    CachedBlock b{};
    b.ptr = next;
    next += size + 512;
    b.block = LiveBlock{size, size, 0, false};
    b.stream = stream;
    return b;
  }
  // One cycle: each size is taken from the cache if there, else "allocated"
  // anew, then kept again. Returns the hits.
  int cycle(const std::vector<std::size_t>& sizes, StreamId stream) {
    int hits = 0;
    for (std::size_t size : sizes) {
      CachedBlock b{};
      if (caches().take(stream, 0, size, size, &b)) {
        CHECK(b.block.size >= size);
        CHECK(b.stream == stream);
        ++hits;
      } else {
        b = block(size, stream);
      }
      caches().keep(b);
    }
    return hits;
  }
};

TEST_CASE("the caches turn on at a second thread's call, even once the first thread has ended") {
  // Threads that start one after the other tend to get the same thread-local
  // storage: a thread told apart by a thread-local's address looked like the
  // one before it, and the caches stayed off.
  // (No block is kept: no thread's cache is made, so these can go.)
  StreamCaches one_thread(record_give_back);
  one_thread.note_caller();
  one_thread.note_caller();
  CHECK_FALSE(one_thread.enabled());  // one thread, however many calls
  StreamCaches two_threads(record_give_back);
  std::thread([&] { two_threads.note_caller(); }).join();
  CHECK_FALSE(two_threads.enabled());
  std::thread([&] { two_threads.note_caller(); }).join();
  CHECK(two_threads.enabled());
}

TEST_CASE_METHOD(CacheFixture, "a working set larger than the cache is served in part, not missed entirely") {
  // 20 small sizes (2.6 MiB in all) and 12 from 20 MiB to 3.4 GiB, each more
  // than a quarter apart (no block serves another size), cycled: more than
  // StreamCaches::max_bytes(). Pushing out the oldest block misses on every
  // call; keeping the smaller blocks serves every small size and the large
  // ones that fit beside them, smallest first.
  std::vector<std::size_t> sizes;
  double size = 4096;
  for (int i = 0; i < 20; ++i, size *= 1.3) sizes.push_back(static_cast<std::size_t>(size) / 512 * 512);
  size = 20 * kMiB;
  for (int i = 0; i < 12; ++i, size *= 1.3) sizes.push_back(static_cast<std::size_t>(size) / 512 * 512);
  int fit = 0;
  std::size_t held = 0;
  for (std::size_t s : sizes) {  // ascending
    if (held + s > caches().max_bytes()) break;
    held += s;
    ++fit;
  }
  REQUIRE(fit > 20);
  REQUIRE(fit < static_cast<int>(sizes.size()));
  for (int round = 0; round < 3; ++round) cycle(sizes, 0x51);
  CHECK(cycle(sizes, 0x51) == fit);
}

TEST_CASE_METHOD(CacheFixture, "a new working set replaces blocks that went unused") {
  // The cache full (by count) of small blocks of an earlier phase.
  std::set<DevicePtr> old_blocks;
  for (int i = 0; i < ThreadCache::kCapacity; ++i) {
    const CachedBlock b = block(4096, 0x52);
    old_blocks.insert(b.ptr);
    caches().keep(b);
  }
  REQUIRE(given_back().empty());
  // A new phase with 12 larger sizes. The old blocks are smaller, so they go
  // only once unused for ThreadCache::kStaleOps calls: until then the new
  // blocks go back to the pool and the old ones stay (no thrashing).
  std::vector<std::size_t> new_sizes;
  double size = kMiB;
  for (int i = 0; i < 12; ++i, size *= 1.3) new_sizes.push_back(static_cast<std::size_t>(size) / 512 * 512);
  CHECK(cycle(new_sizes, 0x52) == 0);
  for (const CachedBlock& b : given_back()) CHECK(old_blocks.count(b.ptr) == 0);
  const int rounds = static_cast<int>(ThreadCache::kStaleOps / (2 * new_sizes.size())) + 1;
  for (int round = 0; round < rounds; ++round) cycle(new_sizes, 0x52);
  CHECK(cycle(new_sizes, 0x52) == 12);
  std::size_t old_returned = 0;
  for (const CachedBlock& b : given_back()) old_returned += old_blocks.count(b.ptr);
  CHECK(old_returned == 12);  // only as many as the new blocks needed
}

TEST_CASE_METHOD(CacheFixture, "a full cache lets a block go for one a little larger that serves its size") {
  REQUIRE(caches().max_bytes() == 256 * kMiB);
  const StreamId stream = 0x55;
  const CachedBlock largest = block(64 * kMiB, stream);
  const CachedBlock twin = block(44 * kMiB, stream);  // 48 MiB is within a quarter above it
  caches().keep(largest);
  caches().keep(twin);
  caches().keep(block(40 * kMiB, 0x56));  // within a quarter too, but another stream's
  caches().keep(block(38 * kMiB, stream));  // 48 MiB is more than a quarter above it
  for (int i = 0; i < 2; ++i) caches().keep(block(27 * kMiB, stream));
  REQUIRE(given_back().empty());  // 240 MiB
  const CachedBlock larger_twin = block(48 * kMiB, stream);
  caches().keep(larger_twin);  // 288 MiB: 32 MiB must go, and the 44 MiB block is enough
  REQUIRE(given_back().size() == 1);
  CHECK(given_back()[0].ptr == twin.ptr);
  CachedBlock b{};
  REQUIRE(caches().take(stream, 0, 44 * kMiB, 44 * kMiB, &b));
  CHECK(b.ptr == larger_twin.ptr);
  REQUIRE(caches().take(stream, 0, 64 * kMiB, 64 * kMiB, &b));
  CHECK(b.ptr == largest.ptr);

  // When no block it can stand in for makes room alone, larger ones go as before.
  caches().flush_all();
  given_back().clear();
  caches().keep(largest);
  caches().keep(block(16 * kMiB, stream));  // 19 MiB serves its size, but 16 MiB is not room enough
  for (int i = 0; i < 5; ++i) caches().keep(block(35 * kMiB, stream));
  REQUIRE(given_back().empty());  // 255 MiB
  caches().keep(block(19 * kMiB, stream));  // 274 MiB with it: 18 MiB must go
  REQUIRE(given_back().size() == 1);
  CHECK(given_back()[0].ptr == largest.ptr);
}

TEST_CASE_METHOD(CacheFixture, "a block is taken only by its stream, closest fit first, within a quarter") {
  caches().keep(block(2 * kMiB, 0x61));
  caches().keep(block(2 * kMiB + 512, 0x62));
  caches().keep(block(3 * kMiB, 0x62));
  CachedBlock b{};
  CHECK_FALSE(caches().take(0x62, 0, 3 * kMiB + 512, 3 * kMiB + 512, &b));  // too small
  CHECK_FALSE(caches().take(0x62, 1, 2 * kMiB, 2 * kMiB, &b));  // another device
  CHECK_FALSE(caches().take(0x62, 0, 2 * kMiB + 1024, 2 * kMiB + 1024, &b));  // 3 MiB: more than a quarter over
  caches().flush_all();
  caches().keep(block(2 * kMiB, 0x61));
  caches().keep(block(2 * kMiB + 512, 0x62));
  caches().keep(block(2 * kMiB + 100 * 1024, 0x62));
  REQUIRE(caches().take(0x62, 0, 2 * kMiB, 2 * kMiB, &b));
  CHECK(b.stream == 0x62);
  CHECK(b.block.size == 2 * kMiB + 512);  // the stream-0x61 block fits better but is not its own
  CHECK_FALSE(caches().take(0x62, 0, 4 * kMiB, 4 * kMiB, &b));
  REQUIRE(caches().take(0x61, 0, 2 * kMiB, 2 * kMiB, &b));
  CHECK(b.stream == 0x61);
}

TEST_CASE_METHOD(CacheFixture, "the cache never holds more than its limits and loses no block") {
  std::size_t made = 0;
  std::set<DevicePtr> held;
  std::uint64_t x = 12345;
  for (int op = 0; op < 20000; ++op) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::size_t size = ((x >> 33) % (48 * kMiB)) / 512 * 512 + 512;
    CachedBlock b{};
    if (caches().take(0x71, 0, size, size, &b)) {
      REQUIRE(held.erase(b.ptr) == 1);
    } else {
      b = block(size, 0x71);
      ++made;
    }
    caches().keep(b);
    held.insert(b.ptr);
    for (const CachedBlock& g : given_back()) REQUIRE(held.erase(g.ptr) == 1);
    given_back().clear();
    REQUIRE(held.size() <= static_cast<std::size_t>(ThreadCache::kCapacity));
  }
  // Everything made is either given back already or still held, once: within
  // the limit, but for one block of at most a quarter of it (the spill).
  caches().flush_all();
  CHECK(given_back().size() == held.size());
  std::size_t held_bytes = 0;
  std::size_t largest = 0;
  for (const CachedBlock& g : given_back()) {
    held_bytes += g.block.size;
    largest = std::max(largest, g.block.size);
  }
  CHECK(held_bytes <= caches().max_bytes() + caches().max_bytes() / 4);
  CHECK(held_bytes - largest <= caches().max_bytes());
  CHECK(made > 0);
}

TEST_CASE_METHOD(CacheFixture, "a block past the limit waits for the thread's next visit to the pool") {
  REQUIRE(caches().max_bytes() == 256 * kMiB);
  for (int i = 0; i < 8; ++i) caches().keep(block(30 * kMiB, 0x81));
  // 280 MiB, and no larger block to make way for this one: kept as the spill.
  const CachedBlock first = block(40 * kMiB, 0x81);
  caches().keep(first);
  CHECK(given_back().empty());
  CachedBlock b{};
  CHECK_FALSE(caches().take_spill(1, &b));  // another device's lock
  REQUIRE(caches().take_spill(0, &b));
  CHECK(b.ptr == first.ptr);
  CHECK_FALSE(caches().take_spill(0, &b));  // only once

  // A second spill sends the first back; one over a quarter of the limit
  // goes back at once; a smaller block makes a larger one go, never the spill.
  caches().keep(first);
  const CachedBlock second = block(50 * kMiB, 0x81);
  caches().keep(second);
  REQUIRE(given_back().size() == 1);
  CHECK(given_back()[0].ptr == first.ptr);
  const CachedBlock too_large = block(65 * kMiB, 0x81);
  caches().keep(too_large);
  REQUIRE(given_back().size() == 2);
  CHECK(given_back()[1].ptr == too_large.ptr);
  caches().keep(block(20 * kMiB, 0x81));  // 260 MiB besides the spill: a 30 MiB block makes room
  REQUIRE(given_back().size() == 3);
  CHECK(given_back()[2].block.size == 30 * kMiB);

  // The spill serves its stream like any kept block, and is then gone.
  REQUIRE(caches().take(0x81, 0, 50 * kMiB, 50 * kMiB, &b));
  CHECK(b.ptr == second.ptr);
  CHECK_FALSE(caches().take_spill(0, &b));
}

TEST_CASE_METHOD(CacheFixture, "a free that finds the cache full is counted apart from the blocks sent back") {
  const CacheTraffic before = caches().traffic(0);
  for (int i = 0; i < 8; ++i) caches().keep(block(30 * kMiB, 0x83));  // 240 MiB
  const CachedBlock spilled = block(40 * kMiB, 0x83);
  caches().keep(spilled);  // full: it waits as the spill
  CachedBlock b{};
  REQUIRE(caches().take(0x83, 0, 40 * kMiB, 40 * kMiB, &b));  // and serves the next request of its size
  caches().keep(b);  // full again, and again nothing goes back
  CHECK(given_back().empty());
  CacheTraffic t = caches().traffic(0);
  CHECK(t.keeps - before.keeps == 10);
  CHECK(t.keeps_full - before.keeps_full == 2);
  CHECK(t.let_go == before.let_go);

  caches().keep(block(50 * kMiB, 0x83));  // a new spill sends the old one back
  REQUIRE(caches().take_spill(0, &b));    // the next miss takes the new one to the pool
  caches().keep(block(65 * kMiB, 0x83));  // over a quarter of the limit: straight back
  REQUIRE(given_back().size() == 2);
  t = caches().traffic(0);
  CHECK(t.keeps_full - before.keeps_full == 4);
  CHECK(t.let_go - before.let_go == 3);
}

}  // namespace
}  // namespace gpupool::shim
