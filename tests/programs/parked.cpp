// Blocks one thread freed stream-ordered, parked in its cache, and a second
// thread that then needs as much: the pool should serve it from those blocks
// once it has had to grow, not double the memory. Prints nothing; the test
// reads the report.
//   parked [blocks] [MiB each]
//   parked double-free    a block freed twice while it waits in a thread's
//                         cache: the second free is refused, and the block is
//                         handed out once, not twice
//   parked spill [ROUNDS] a thread whose blocks live at once take more than
//                         its cache holds (run with GPUPOOL_THREAD_CACHE_SIZE=8M):
//                         a block past the limit waits as the spill until the
//                         thread's next allocation the cache cannot serve gives
//                         it back to the pool. First one spill, then a plain
//                         block made from it, which must free normally; then
//                         ROUNDS of allocating every size, then freeing them
//                         all, every block keeping its pattern. Prints
//                         {"allocations": N, "plain_reused_spill": B}
//   parked spill-cycle [ROUNDS]
//                         a thread cycling one block at a time through sizes
//                         that fill a 32 MiB cache (run with
//                         GPUPOOL_THREAD_CACHE_SIZE=32M) but for the largest,
//                         which no kept block can serve: that one waits as the
//                         spill and serves its size in the next round, so the
//                         cache is found full once a round and sends nothing
//                         back. Prints {"allocations": N}
#include <future>
#include <thread>

#include "common.hpp"

namespace {

int double_free(cudaStream_t first, cudaStream_t second) {
  std::thread([&] {  // a second thread making stream-ordered calls: caches on
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, second));
    CHECK_CUDA(cudaFreeAsync(p, second));  // into this thread's cache
    EXPECT(cudaFreeAsync(p, second) == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    void* a = nullptr;
    void* b = nullptr;
    CHECK_CUDA(cudaMallocAsync(&a, 1 << 20, second));
    CHECK_CUDA(cudaMallocAsync(&b, 1 << 20, second));
    EXPECT(a != b);
    CHECK_CUDA(cudaFreeAsync(a, second));
    CHECK_CUDA(cudaFreeAsync(b, second));
    CHECK_CUDA(cudaStreamSynchronize(second));
  }).join();
  CHECK_CUDA(cudaStreamDestroy(first));
  CHECK_CUDA(cudaStreamDestroy(second));
  return 0;
}

// One spill given back, then taken by a plain cudaMalloc: the block must be
// the pool's again, not still marked as waiting in a cache (its plain free
// would be refused as a second free). The spill lies below a block kept
// live, so that it stays a block of its own when the others come back to the
// pool. A plain request takes a stream's block only once its last use is
// known complete: the first one records the fence that shows it (and takes
// other memory), the second, after a device synchronization, can take the
// spill. True when one of them did.
bool plain_block_from_a_spill(cudaStream_t stream, long* allocations) {
  constexpr size_t kTwo = 2 << 20;
  void* spilled = nullptr;
  void* above = nullptr;
  void* kept[4];
  CHECK_CUDA(cudaMallocAsync(&spilled, kTwo, stream));
  CHECK_CUDA(cudaMallocAsync(&above, kTwo, stream));
  for (void*& p : kept) CHECK_CUDA(cudaMallocAsync(&p, kTwo, stream));
  for (void* p : kept) CHECK_CUDA(cudaFreeAsync(p, stream));  // 8 MiB: the cache is full
  CHECK_CUDA(cudaFreeAsync(spilled, stream));                 // past the limit: the spill
  void* larger = nullptr;  // the cache cannot serve it: the spill goes back to the pool
  CHECK_CUDA(cudaMallocAsync(&larger, 3 << 20, stream));
  void* plain[2] = {};
  for (void*& p : plain) {
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMalloc(&p, kTwo));
    CHECK_CUDA(cudaMemset(p, 0x5a, kTwo));
  }
  for (void* p : plain) {
    EXPECT(testprog::holds_sampled(p, kTwo, 0x5a));
    CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUDA(cudaFreeAsync(larger, stream));
  CHECK_CUDA(cudaFreeAsync(above, stream));
  *allocations += 9;
  return plain[0] == spilled || plain[1] == spilled;
}

// Sizes 1 MiB to 1.94 MiB, 23.5 MiB together: about three times the 8 MiB
// cache, each at most the quarter of it a spill may be. Live at once: one
// at a time, a few blocks would serve them all (each serves sizes up to a
// quarter smaller).
size_t spill_size(int i) { return (size_t{1} << 20) + static_cast<size_t>(i) * (64 << 10); }
constexpr int kSpillSizes = 16;

int spill(cudaStream_t stream, int rounds) {
  long allocations = 1;  // the first thread's
  bool reused = false;
  std::thread([&] {  // a second thread making stream-ordered calls: caches on
    reused = plain_block_from_a_spill(stream, &allocations);
    for (int round = 0; round < rounds; ++round) {
      void* blocks[kSpillSizes];
      auto tag = [&](int i) { return static_cast<unsigned char>(1 + (round * kSpillSizes + i) % 250); };
      for (int i = 0; i < kSpillSizes; ++i) {
        CHECK_CUDA(cudaMallocAsync(&blocks[i], spill_size(i), stream));
        CHECK_CUDA(cudaMemsetAsync(blocks[i], tag(i), spill_size(i), stream));
        ++allocations;
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      for (int i = 0; i < kSpillSizes; ++i) {
        EXPECT(testprog::holds_sampled(blocks[i], spill_size(i), tag(i)));
        CHECK_CUDA(cudaFreeAsync(blocks[i], stream));
      }
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }).join();
  std::printf("{\"allocations\": %ld, \"plain_reused_spill\": %s}\n", allocations, reused ? "true" : "false");
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

// 25.3 MiB, each size more than a quarter above the one before, and 8 MiB
// (a quarter of the cache, and more than a quarter above the next largest,
// so no smaller block serves it) past the limit.
int spill_cycle(cudaStream_t stream, int rounds) {
  constexpr double kMiBs[] = {0.5, 0.7, 1.0, 1.3, 1.7, 2.2, 2.9, 3.8, 4.9, 6.3, 8.0};
  long allocations = 1;  // the first thread's
  std::thread([&] {  // a second thread making stream-ordered calls: caches on
    for (int round = 0; round < rounds; ++round) {
      for (const double mib : kMiBs) {
        const auto size = static_cast<size_t>(mib * (1 << 20));
        void* p = nullptr;
        CHECK_CUDA(cudaMallocAsync(&p, size, stream));
        CHECK_CUDA(cudaFreeAsync(p, stream));
        ++allocations;
      }
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }).join();
  std::printf("{\"allocations\": %ld}\n", allocations);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool twice = argc > 1 && std::strcmp(argv[1], "double-free") == 0;
  const bool spills = argc > 1 && std::strcmp(argv[1], "spill") == 0;
  const bool spill_cycles = argc > 1 && std::strcmp(argv[1], "spill-cycle") == 0;
  const int blocks = argc > 1 && !twice && !spills && !spill_cycles ? std::atoi(argv[1]) : 16;
  const size_t bytes = static_cast<size_t>(argc > 2 ? std::atoi(argv[2]) : 8) << 20;
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  void* warm = nullptr;  // this thread's stream-ordered call: the next thread's turns caching on
  CHECK_CUDA(cudaMallocAsync(&warm, 512, first));
  CHECK_CUDA(cudaFreeAsync(warm, first));
  if (twice) return double_free(first, second);
  if (spills || spill_cycles) {
    CHECK_CUDA(cudaStreamDestroy(first));
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
    return spills ? spill(second, rounds) : spill_cycle(second, rounds);
  }
  auto use = [&](cudaStream_t stream, unsigned char tag) {
    std::vector<void*> held(static_cast<size_t>(blocks));
    for (void*& p : held) {
      CHECK_CUDA(cudaMallocAsync(&p, bytes, stream));
      CHECK_CUDA(cudaMemsetAsync(p, tag, bytes, stream));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (void* p : held) {
      EXPECT(testprog::holds_sampled(p, bytes, tag));
      CHECK_CUDA(cudaFreeAsync(p, stream));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  // The first thread stays alive (its cache with it) while the second works.
  std::promise<void> first_done;
  std::promise<void> second_done;
  std::thread a([&] {
    use(first, 0x11);
    first_done.set_value();
    second_done.get_future().wait();
  });
  first_done.get_future().wait();
  use(second, 0x22);  // on this thread: a third caller, with a cache of its own
  second_done.set_value();
  a.join();
  CHECK_CUDA(cudaStreamDestroy(first));
  CHECK_CUDA(cudaStreamDestroy(second));
  return 0;
}
