// BlockPool's in-place updates (rekeyed, take_place) against a
// reference: the pool must hold exactly the reference's blocks, in order,
// whether a new key still sorts at the block's place or not.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <random>
#include <vector>

#include "pool/block_pool.hpp"
#include "random_ops.hpp"

using namespace gpupool;

namespace {

struct Fixture {
  BlockPool pool{PoolKind::Small};
  std::deque<Block> storage;  // stable addresses
  std::vector<Block*> listed;
  DevicePtr next_addr = 512;

  // A free block with a fresh address, in no pool.
  Block* make(StreamId stream, std::size_t size) {
    Block& b = storage.emplace_back();
    b.stream = stream;
    b.size = size;
    b.addr = next_addr;
    next_addr += 512;
    return &b;
  }

  // Blocks of stream 1 of these sizes, listed.
  std::vector<Block*> list(std::initializer_list<std::size_t> sizes) {
    std::vector<Block*> out;
    for (std::size_t size : sizes) {
      out.push_back(make(1, size));
      pool.insert(out.back());
      listed.push_back(out.back());
    }
    return out;
  }

  void check() const {
    REQUIRE(pool.ordered());
    std::vector<Block*> expected = listed;
    std::sort(expected.begin(), expected.end(), [](const Block* a, const Block* b) { return BlockOrder()(*a, *b); });
    std::vector<Block*> seen;
    for (Block* b : pool.blocks()) seen.push_back(b);
    REQUIRE(seen == expected);
    for (const Block* b : listed) REQUIRE(pool.contains(b));
  }
};

}  // namespace

TEST_CASE("a free block that shrinks or grows in place keeps its place or moves, and the pool stays ordered") {
  Fixture f;
  const std::vector<Block*> blocks = f.list({1024, 4096, 65536});
  Block* small = blocks[0];
  Block* middle = blocks[1];
  f.check();

  middle->size = 8192;  // grown, still between its neighbours
  f.pool.rekeyed(middle);
  f.check();
  middle->size = 512;  // now below `small`: it must move
  f.pool.rekeyed(middle);
  f.check();
  REQUIRE(f.pool.best_fit(1, 600) == small);
  middle->stream = 2;  // another stream: past every block of stream 1
  f.pool.rekeyed(middle);
  f.check();
  REQUIRE(f.pool.best_fit(1, 70000) == nullptr);
  REQUIRE(f.pool.best_fit(2, 1) == middle);
}

TEST_CASE("a block taking another's place keeps it when it sorts there, else is filed where it sorts") {
  Fixture f;
  Block* b = f.list({1024, 8192, 65536})[1];
  Block* fits = f.make(1, 4096);
  f.pool.take_place(b, fits);
  f.pool.rekeyed(fits);
  std::replace(f.listed.begin(), f.listed.end(), b, fits);
  f.check();
  REQUIRE_FALSE(f.pool.contains(b));
  Block* past = f.make(1, 1 << 20);  // past the largest
  f.pool.take_place(fits, past);
  f.pool.rekeyed(past);
  std::replace(f.listed.begin(), f.listed.end(), fits, past);
  f.check();
  REQUIRE(f.pool.best_fit(1, 100000) == past);
}

TEST_CASE("random in-place updates keep the pool equal to a sorted reference", "[random]") {
  std::mt19937 rng(static_cast<std::uint32_t>(testing::test_seed(7)));
  Fixture f;
  auto random_key = [&](Block* b) {
    b->stream = rng() % 3;
    b->size = 512 * (1 + rng() % 64);
  };
  for (int step = 0; step < 20000; ++step) {
    const auto op = f.listed.empty() ? 0 : rng() % 4;
    if (op == 0) {  // insert
      Block* b = f.make(rng() % 3, 512 * (1 + rng() % 64));
      f.pool.insert(b);
      f.listed.push_back(b);
    } else {
      const std::size_t i = rng() % f.listed.size();
      Block* b = f.listed[i];
      if (op == 1) {  // erase
        f.pool.erase(b);
        f.listed.erase(f.listed.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 2) {  // a new key in place
        random_key(b);
        f.pool.rekeyed(b);
      } else {  // a new block takes the place whatever its key, then is settled
        Block* with = f.make(0, 512);
        random_key(with);
        f.pool.take_place(b, with);
        f.pool.rekeyed(with);
        f.listed[i] = with;
      }
    }
    if (step % 97 == 0) f.check();
  }
  f.check();
}
