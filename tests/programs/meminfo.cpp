// What a program reads of its memory.
//   meminfo        what cudaMemGetInfo says before and after the program caches
//                  100 MiB, as JSON: {"total": .., "free_before": .., "free_after": ..}
//   meminfo async [threads]
//                  the same with cudaMallocAsync/cudaFreeAsync on a stream;
//                  with threads, after a second thread's stream-ordered calls
//                  (under gpupool, the freeing thread then keeps the block)
//   meminfo pool [threads]
//                  reads its device's default memory pool's figures
//                  (cudaMemPoolGetAttribute) around stream-ordered allocations,
//                  frees, a reset of the high watermarks and a trim, with a
//                  plain cudaMalloc block held (never in use there, nor
//                  once freed with cudaFreeAsync), checks
//                  what any pool must show, and prints the figures as JSON;
//                  with threads, after a second thread's stream-ordered calls
//                  (under gpupool, threads then keep the blocks they free)
//   meminfo own-pool
//                  makes a memory pool of its own the current pool of device
//                  0: its cudaMallocAsync calls draw from that pool (its
//                  figures count them), cudaMallocFromPoolAsync from the pool
//                  it names, until the default pool is current
//                  again; then makes another pool current and destroys it,
//                  which makes the default pool current again too
//   meminfo own-pool by-location
//                  the same, each pool made current with CUDA 13's
//                  cudaMemSetMemPool (device 0's pinned memory) and read back
//                  with cudaMemGetMemPool
//   meminfo poolless-neighbour
//                  with device 1 a GPU without memory pools (the simulated
//                  runtime's SIMCUDA_POOLLESS_DEVICE=1) and used, reads device
//                  0's pool figures: no error may be left for the program's
//                  next cudaGetLastError but the one it left pending itself
#include <cinttypes>
#include <string>

#include "common.hpp"

namespace {

std::uint64_t figure(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  std::uint64_t value = 0;
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, attr, &value));
  return value;
}

struct Figures {
  std::uint64_t used, used_high, reserved, reserved_high;
};

Figures figures(cudaMemPool_t pool) {
  const Figures f{figure(pool, cudaMemPoolAttrUsedMemCurrent), figure(pool, cudaMemPoolAttrUsedMemHigh),
                  figure(pool, cudaMemPoolAttrReservedMemCurrent), figure(pool, cudaMemPoolAttrReservedMemHigh)};
  // What any pool's figures keep to: in use within reserved, each at most its
  // high watermark.
  EXPECT(f.used <= f.reserved);
  EXPECT(f.used <= f.used_high);
  EXPECT(f.reserved <= f.reserved_high);
  return f;
}

void print(const char* name, const Figures& f, bool last = false) {
  std::printf("\"%s\": {\"used\": %" PRIu64 ", \"used_high\": %" PRIu64 ", \"reserved\": %" PRIu64
              ", \"reserved_high\": %" PRIu64 "}%s",
              name, f.used, f.used_high, f.reserved, f.reserved_high, last ? "}\n" : ", ");
}

int pool_figures(bool threads) {
  if (threads) testprog::turn_thread_caches_on();
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("{");
  const Figures start = figures(pool);
  print("start", start);

  // A plain cudaMalloc block, held throughout: not the pool's, so never in
  // its "in use" figure (gpupool serves it from the same memory).
  constexpr size_t kMiB = size_t{1} << 20;
  constexpr size_t kPlain = 16 * kMiB;
  void* plain = nullptr;
  CHECK_CUDA(cudaMalloc(&plain, kPlain));
  CHECK_CUDA(cudaMemset(plain, 0x5a, kPlain));

  // 8 blocks of 1 to 8 MiB (36 MiB), in use on the stream.
  constexpr size_t kTotal = 36 * kMiB;
  void* blocks[8];
  for (int i = 0; i < 8; ++i) {
    CHECK_CUDA(cudaMallocAsync(&blocks[i], (i + 1) * kMiB, stream));
    CHECK_CUDA(cudaMemsetAsync(blocks[i], i, (i + 1) * kMiB, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const Figures held = figures(pool);
  print("held", held);
  EXPECT(held.used >= start.used + kTotal);
  EXPECT(held.used < start.used + kTotal + kPlain);
  EXPECT(held.used_high >= start.used + kTotal);
  EXPECT(held.used_high < start.used_high + kTotal + kPlain);

  // The larger half freed (26 MiB): no longer in use.
  for (int i = 4; i < 8; ++i) CHECK_CUDA(cudaFreeAsync(blocks[i], stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const Figures freed = figures(pool);
  print("freed", freed);
  EXPECT(held.used - freed.used >= 26 * kMiB);
  EXPECT(freed.used_high == held.used_high);

  // A high watermark can only be reset, to 0: it then starts from what is held.
  const std::uint64_t nonzero = 1;
  EXPECT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, const_cast<std::uint64_t*>(&nonzero)) ==
         cudaErrorInvalidValue);
  cudaGetLastError();
  std::uint64_t zero = 0;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  const Figures reset = figures(pool);
  print("reset", reset);
  EXPECT(reset.used_high == reset.used);
  EXPECT(reset.used_high < held.used_high);
  EXPECT(reset.reserved_high == reset.reserved);

  // A trim to 0 keeps what is in use.
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
  const Figures trimmed = figures(pool);
  print("trimmed", trimmed);
  EXPECT(trimmed.used == reset.used);

  // Other attributes are the runtime's: a release threshold set is read back.
  std::uint64_t threshold = 64 * kMiB;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT(figure(pool, cudaMemPoolAttrReleaseThreshold) == 64 * kMiB);

  for (int i = 0; i < 4; ++i) {
    EXPECT(testprog::holds_sampled(blocks[i], (i + 1) * kMiB, static_cast<unsigned char>(i)));
    CHECK_CUDA(cudaFreeAsync(blocks[i], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(testprog::holds_sampled(plain, kPlain, 0x5a));
  CHECK_CUDA(cudaFree(plain));
  // A plain block (made with thread caches on, where there are any) freed in
  // stream order is not the pool's either; its memory taken back by a
  // stream-ordered request of its size (from the thread's cache, where there
  // is one) is the pool's, in use.
  const std::uint64_t before = figures(pool).used;
  CHECK_CUDA(cudaMalloc(&plain, kPlain));
  CHECK_CUDA(cudaFreeAsync(plain, stream));
  EXPECT(figures(pool).used == before);
  void* again = nullptr;
  CHECK_CUDA(cudaMallocAsync(&again, kPlain, stream));
  EXPECT(figures(pool).used >= before + kPlain);
  CHECK_CUDA(cudaFreeAsync(again, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const Figures end = figures(pool);
  print("end", end, true);
  EXPECT(end.used == start.used);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

// Makes `pool` device 0's current pool, with the call of CUDA 13 or the older one.
void make_current(cudaMemPool_t pool, bool by_location) {
  if (!by_location) {
    CHECK_CUDA(cudaDeviceSetMemPool(0, pool));
    return;
  }
  cudaMemLocation location{};
  location.type = cudaMemLocationTypeDevice;
  location.id = 0;
  CHECK_CUDA(cudaMemSetMemPool(&location, cudaMemAllocationTypePinned, pool));
  cudaMemPool_t current = nullptr;
  CHECK_CUDA(cudaMemGetMemPool(&current, &location, cudaMemAllocationTypePinned));
  EXPECT(current == pool);
}

int own_pool(bool by_location) {
  constexpr size_t kBlock = size_t{4} << 20;
  cudaMemPool_t own = testprog::new_device_pool(0);
  cudaMemPool_t default_pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, 0));
  make_current(own, by_location);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* blocks[4];
  for (int i = 0; i < 4; ++i) {
    CHECK_CUDA(cudaMallocAsync(&blocks[i], kBlock, stream));
    CHECK_CUDA(cudaMemsetAsync(blocks[i], i + 1, kBlock, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::uint64_t own_used = figure(own, cudaMemPoolAttrUsedMemCurrent);
  EXPECT(own_used >= 4 * kBlock);  // drawn from the program's pool
  for (int i = 0; i < 4; ++i) {
    EXPECT(testprog::holds_sampled(blocks[i], kBlock, static_cast<unsigned char>(i + 1)));
    CHECK_CUDA(cudaFreeAsync(blocks[i], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(figure(own, cudaMemPoolAttrUsedMemCurrent) == 0);

  // Each pool named: from it, whichever is current.
  void* named[2];
  CHECK_CUDA(cudaMallocFromPoolAsync(&named[0], kBlock, default_pool, stream));
  CHECK_CUDA(cudaMallocFromPoolAsync(&named[1], kBlock, own, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(figure(default_pool, cudaMemPoolAttrUsedMemCurrent) >= kBlock);
  EXPECT(figure(own, cudaMemPoolAttrUsedMemCurrent) == kBlock);
  for (void* q : named) CHECK_CUDA(cudaFreeAsync(q, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  // The program's pool's figures and trims are its own: what gpupool holds
  // for the default pool (the block just freed) is neither counted nor given
  // back there.
  const std::uint64_t default_reserved = figure(default_pool, cudaMemPoolAttrReservedMemCurrent);
  CHECK_CUDA(cudaMemPoolTrimTo(own, 0));
  EXPECT(figure(own, cudaMemPoolAttrReservedMemCurrent) == 0);
  EXPECT(figure(default_pool, cudaMemPoolAttrReservedMemCurrent) == default_reserved);

  // The default pool current again: drawn from it.
  make_current(default_pool, by_location);
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBlock, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::uint64_t default_used = figure(default_pool, cudaMemPoolAttrUsedMemCurrent);
  EXPECT(default_used >= kBlock);
  EXPECT(figure(own, cudaMemPoolAttrUsedMemCurrent) == 0);
  CHECK_CUDA(cudaFreeAsync(p, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemPoolDestroy(own));

  // Destroying a device's current pool makes its default pool current.
  own = testprog::new_device_pool(0);
  make_current(own, by_location);
  CHECK_CUDA(cudaMemPoolDestroy(own));
  cudaMemPool_t current = nullptr;
  CHECK_CUDA(cudaDeviceGetMemPool(&current, 0));
  EXPECT(current == default_pool);
  CHECK_CUDA(cudaMallocAsync(&p, kBlock, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(figure(default_pool, cudaMemPoolAttrUsedMemCurrent) >= kBlock);
  CHECK_CUDA(cudaFreeAsync(p, stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("{\"own_pool_used\": %" PRIu64 ", \"default_pool_used\": %" PRIu64 "}\n", own_used, default_used);
  return 0;
}

int poolless_neighbour() {
  int supported = 1;
  CHECK_CUDA(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 1));
  EXPECT(supported == 0);
  CHECK_CUDA(cudaSetDevice(1));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaSetDevice(0));
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  figures(pool);
  EXPECT(cudaGetLastError() == cudaSuccess);
  // An error the program left pending is still its next one.
  EXPECT(cudaSetDevice(99) == cudaErrorInvalidDevice);
  figures(pool);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDevice);
  EXPECT(cudaGetLastError() == cudaSuccess);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "poolless-neighbour") return poolless_neighbour();
  if (argc > 1 && std::string(argv[1]) == "pool") return pool_figures(argc > 2 && std::string(argv[2]) == "threads");
  if (argc > 1 && std::string(argv[1]) == "own-pool") {
    return own_pool(argc > 2 && std::string(argv[2]) == "by-location");
  }
  const bool async = argc > 1 && std::string(argv[1]) == "async";
  if (async && argc > 2 && std::string(argv[2]) == "threads") testprog::turn_thread_caches_on();
  cudaStream_t stream = nullptr;
  if (async) CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t free_before = 0, free_after = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
  void* p = nullptr;
  if (async) {
    CHECK_CUDA(cudaMallocAsync(&p, 100 << 20, stream));
    CHECK_CUDA(cudaFreeAsync(p, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
  } else {
    CHECK_CUDA(cudaMalloc(&p, 100 << 20));
    CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
  std::printf("{\"total\": %zu, \"free_before\": %zu, \"free_after\": %zu}\n", total, free_before, free_after);
  return 0;
}
