// Random allocations and frees of many sizes, plain and stream-ordered, on a
// few streams. Every live block carries its own byte pattern; after every
// allocation the new block is written, and every so often all live blocks are
// read back: a pool that overlaps blocks, or reuses one early, corrupts a
// pattern. Prints what it did as JSON for the test to compare with the report.
// IDLE_STREAMS non-blocking streams more are made and never used, as
// PyTorch's stream pool: each device barrier must order them.
//   patterns [operations] [seed] [idle_streams]
#include <map>
#include <random>
#include <vector>

#include "common.hpp"

namespace {
struct Live {
  size_t size;
  unsigned char tag;
  cudaStream_t stream;
  bool async;
};
}  // namespace

int main(int argc, char** argv) {
  const int operations = argc > 1 ? std::atoi(argv[1]) : 4000;
  std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
  cudaStream_t streams[3] = {nullptr};
  CHECK_CUDA(cudaStreamCreate(&streams[1]));
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[2], cudaStreamNonBlocking));
  std::vector<cudaStream_t> idle(argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 0);
  for (cudaStream_t& s : idle) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::map<void*, Live> live;
  long long allocations = 0, frees = 0;
  long long requested = 0, peak_requested = 0;
  unsigned char next_tag = 1;
  for (int op = 0; op < operations; ++op) {
    const bool allocate = live.empty() || (rng() % 100 < 55 && live.size() < 300);
    if (allocate) {
      const unsigned r = static_cast<unsigned>(rng() % 100);
      size_t size = r < 60 ? 1 + rng() % 8192 : r < 90 ? 8192 + rng() % (2 << 20) : (2 << 20) + rng() % (24 << 20);
      Live l{size, next_tag, streams[rng() % 3], rng() % 2 == 0};
      next_tag = static_cast<unsigned char>(next_tag % 250 + 1);
      void* p = nullptr;
      if (l.async) {
        CHECK_CUDA(cudaMallocAsync(&p, size, l.stream));
      } else {
        CHECK_CUDA(cudaMalloc(&p, size));
      }
      EXPECT(reinterpret_cast<uintptr_t>(p) % 512 == 0);
      auto next = live.lower_bound(p);
      if (next != live.end()) EXPECT(static_cast<char*>(p) + size <= static_cast<char*>(next->first));
      if (next != live.begin()) {
        auto prev = std::prev(next);
        EXPECT(static_cast<char*>(prev->first) + prev->second.size <= static_cast<char*>(p));
      }
      CHECK_CUDA(cudaMemsetAsync(p, l.tag, size, l.async ? l.stream : nullptr));
      live.emplace(p, l);
      ++allocations;
      requested += static_cast<long long>(size);
      if (requested > peak_requested) peak_requested = requested;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const Live l = it->second;
      if (l.async) CHECK_CUDA(cudaStreamSynchronize(l.stream));
      if (!testprog::holds_sampled(it->first, l.size, l.tag)) {
        std::fprintf(stderr, "patterns: block %p of %zu bytes lost its pattern %u\n", it->first, l.size, l.tag);
        return 1;
      }
      if (l.async) {
        CHECK_CUDA(cudaFreeAsync(it->first, l.stream));
      } else {
        CHECK_CUDA(cudaFree(it->first));
      }
      requested -= static_cast<long long>(l.size);
      live.erase(it);
      ++frees;
    }
    if (op % 500 == 499) {
      CHECK_CUDA(cudaDeviceSynchronize());
      for (const auto& [p, l] : live) {
        if (!testprog::holds_sampled(p, l.size, l.tag)) {
          std::fprintf(stderr, "patterns: block %p of %zu bytes lost its pattern %u\n", p, l.size, l.tag);
          return 1;
        }
      }
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  for (const auto& [p, l] : live) {
    EXPECT(testprog::holds_sampled(p, l.size, l.tag));
    CHECK_CUDA(cudaFree(p));
    ++frees;
  }
  CHECK_CUDA(cudaStreamDestroy(streams[1]));
  CHECK_CUDA(cudaStreamDestroy(streams[2]));
  for (cudaStream_t s : idle) CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("{\"allocations\": %lld, \"frees\": %lld, \"peak_requested\": %lld}\n", allocations, frees,
              peak_requested);
  return 0;
}
