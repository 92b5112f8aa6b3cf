// A program that goes on using the GPU while gpupool's own host allocations
// fail (run with libtest-failing-malloc.so preloaded ahead of libgpupool.so).
//   host-oom FIRST ALL
//     arms the failures at the core's FIRST-th allocation from now on (0:
//     none, only counted; ALL=1: that one and every later one), then
//     allocates, tags, checks and frees blocks of many sizes with cudaMalloc
//     and cudaMallocAsync on three streams, from two threads, asks for a
//     report by signal, reads the memory figures and trims; every CUDA call
//     must succeed, no two live blocks may overlap and each must hold its tag.
//     Prints {"core_allocations": N, "failures": F} (counted while armed).
//   host-oom after-reset
//     holds two blocks of one fixed segment, has gpupool step aside at its
//     next allocation (a stream's state), frees one, asks for an IPC handle
//     of the other (not the segment's start: refused), resets the device,
//     then makes 40 pairs of 3 MiB, each checked: all the runtime's now, some
//     at addresses the reset freed from gpupool; at the end the device must
//     have as much memory free as after the first (no free of the runtime's
//     memory was taken for gpupool's). Prints {"in_old_segment": K} (pairs
//     that landed in gpupool's old fixed segment of 20 MiB). A reset the
//     runtime refuses (SIMCUDA_RESET_ERROR=refused) leaves the other block
//     whole and its free gpupool's: prints {"reset": "refused"}. One that
//     returns an earlier launch's error having reset (SIMCUDA_RESET_ERROR=late)
//     goes on as a reset, and adds "reset": "cudaErrorLaunchFailure".
//   host-oom fork
//     holds blocks, makes every core allocation fail from the next one on (the
//     fork handler's room for the parent's pools the first), forks, and
//     disarms in the parent. The child, failing every one, exits at once; the
//     parent checks its blocks, makes checked pairs and frees everything.
//     Prints {"child_exit": S, "parent_failures": F} (S: the child's exit
//     status, -1 if it did not exit; F: the failures the parent saw, the fork
//     handler's); exits 1 unless the child exited 0.
//   host-oom at-exit
//     leaves a plain block and a stream-ordered one live, then makes every
//     core allocation fail from the next one on, through exit.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common.hpp"

namespace {

struct Live {
  char* ptr;
  size_t size;
  unsigned char tag;
  cudaStream_t freed_on;  // cudaFreeAsync on this stream; nullptr: cudaFree
};

const size_t kSizes[] = {512, 1000, 4096, 70000, 300000, 1 << 20, 2 << 20, 3 << 20};

void check_all(std::vector<Live>& live) {
  CHECK_CUDA(cudaDeviceSynchronize());
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.ptr < b.ptr; });
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT(i == 0 || live[i - 1].ptr + live[i - 1].size <= live[i].ptr);
    EXPECT(testprog::holds_sampled(live[i].ptr, live[i].size, live[i].tag));
  }
}

void free_block(const Live& b) {
  if (b.freed_on == nullptr) {
    CHECK_CUDA(cudaFree(b.ptr));
  } else {
    CHECK_CUDA(cudaFreeAsync(b.ptr, b.freed_on));
  }
}

// Stream-ordered pairs on this thread's default stream, each block checked.
void pairs_on_another_thread() {
  std::thread([] {
    for (int i = 0; i < 64; ++i) {
      const size_t size = kSizes[i % 6];
      void* p = nullptr;
      CHECK_CUDA(cudaMallocAsync(&p, size, cudaStreamPerThread));
      const auto tag = static_cast<unsigned char>(0x80 | i);
      CHECK_CUDA(cudaMemsetAsync(p, tag, size, cudaStreamPerThread));
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
      EXPECT(testprog::holds_sampled(p, size, tag));
      CHECK_CUDA(cudaFreeAsync(p, cudaStreamPerThread));
    }
    CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  }).join();
}

// Plain pairs of every size, each block checked.
void checked_pairs() {
  for (int i = 0; i < 16; ++i) {
    const size_t size = kSizes[i % 8];
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, size));
    const auto tag = static_cast<unsigned char>(0x40 + i);
    CHECK_CUDA(cudaMemset(p, tag, size));
    EXPECT(testprog::holds_sampled(p, size, tag));
    CHECK_CUDA(cudaFree(p));
  }
}

}  // namespace

int after_fork(int (*arm)(long, int), long (*disarm)(long*)) {
  std::vector<Live> live;
  for (int i = 0; i < 8; ++i) {
    Live b{nullptr, kSizes[i], static_cast<unsigned char>(i + 1), i % 2 == 0 ? nullptr : cudaStreamLegacy};
    if (b.freed_on == nullptr) {
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&b.ptr), b.size));
    } else {
      CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&b.ptr), b.size, cudaStreamLegacy));
    }
    CHECK_CUDA(cudaMemset(b.ptr, b.tag, b.size));
    live.push_back(b);
  }
  check_all(live);
  EXPECT(arm(1, 1) == 1);
  std::fflush(nullptr);
  const pid_t child = fork();
  EXPECT(child >= 0);
  // The child uses no CUDA (CUDA does not survive a fork): it leaves through
  // gpupool's exit handler, which cannot allocate either.
  if (child == 0) std::exit(0);
  long failures = 0;
  disarm(&failures);
  int status = 0;
  EXPECT(waitpid(child, &status, 0) == child);
  check_all(live);
  checked_pairs();
  for (const Live& b : live) free_block(b);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("{\"child_exit\": %d, \"parent_failures\": %ld}\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              failures);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int after_reset(int (*arm)(long, int)) {
  constexpr size_t kBlock = 3 << 20;
  char* first = nullptr;
  char* second = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&first), kBlock));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&second), kBlock));
  CHECK_CUDA(cudaMemset(second, 0x5a, kBlock));
  EXPECT(arm(1, 0) == 1);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaFree(first));
  cudaIpcMemHandle_t handle;
  EXPECT(cudaIpcGetMemHandle(&handle, second) == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_CUDA(cudaStreamDestroy(stream));
  const cudaError_t reset = cudaDeviceReset();
  if (reset == cudaErrorNotPermitted) {
    // Refused (SIMCUDA_RESET_ERROR=refused): the block is still the
    // program's, whole, and its free gpupool's as before the reset.
    (void)cudaGetLastError();
    EXPECT(testprog::holds_sampled(second, kBlock, 0x5a));
    CHECK_CUDA(cudaFree(second));
    std::printf("{\"reset\": \"refused\"}\n");
    return 0;
  }
  if (reset == cudaErrorLaunchFailure) {
    (void)cudaGetLastError();  // an earlier launch's, returned by a reset that happened
  } else {
    CHECK_CUDA(reset);
  }
  int in_old_segment = 0;
  size_t free_after_first = 0;
  size_t total = 0;
  for (int i = 0; i < 40; ++i) {
    char* p = nullptr;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), kBlock));
    in_old_segment += p >= first && p < first + (20 << 20);  // a fixed segment of 20 MiB
    const auto tag = static_cast<unsigned char>(i + 1);
    CHECK_CUDA(cudaMemset(p, tag, kBlock));
    EXPECT(testprog::holds_sampled(p, kBlock, tag));
    CHECK_CUDA(cudaFree(p));
    // From the first pair on (a GPU's context takes some memory of its own).
    if (i == 0) CHECK_CUDA(cudaMemGetInfo(&free_after_first, &total));
  }
  size_t free_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  EXPECT(free_bytes == free_after_first);
  if (reset != cudaSuccess) {
    std::printf("{\"in_old_segment\": %d, \"reset\": \"%s\"}\n", in_old_segment, cudaGetErrorName(reset));
  } else {
    std::printf("{\"in_old_segment\": %d}\n", in_old_segment);
  }
  return 0;
}

int through_exit(int (*arm)(long, int)) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* plain = nullptr;
  void* ordered = nullptr;
  CHECK_CUDA(cudaMalloc(&plain, 3 << 20));
  CHECK_CUDA(cudaMallocAsync(&ordered, 1 << 20, stream));
  CHECK_CUDA(cudaMemsetAsync(ordered, 7, 1 << 20, stream));
  EXPECT(arm(1, 1) == 1);
  return 0;
}

int main(int argc, char** argv) {
  auto arm = reinterpret_cast<int (*)(long, int)>(dlsym(RTLD_DEFAULT, "failing_malloc_arm"));
  auto disarm = reinterpret_cast<long (*)(long*)>(dlsym(RTLD_DEFAULT, "failing_malloc_disarm"));
  EXPECT(arm != nullptr && disarm != nullptr);
  if (argc == 2 && std::strcmp(argv[1], "after-reset") == 0) {
    CHECK_CUDA(cudaFree(nullptr));  // loads gpupool's core
    return after_reset(arm);
  }
  if (argc == 2 && std::strcmp(argv[1], "fork") == 0) {
    CHECK_CUDA(cudaFree(nullptr));
    return after_fork(arm, disarm);
  }
  if (argc == 2 && std::strcmp(argv[1], "at-exit") == 0) return through_exit(arm);
  if (argc != 3) {
    std::fprintf(stderr, "usage: host-oom FIRST ALL | host-oom after-reset | host-oom fork | host-oom at-exit\n");
    return 2;
  }
  CHECK_CUDA(cudaFree(nullptr));  // loads gpupool's core
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, 512));  // and starts device 0's pool
  CHECK_CUDA(cudaFree(first));
  EXPECT(arm(std::atol(argv[1]), std::atoi(argv[2])) == 1);

  cudaStream_t streams[3] = {cudaStreamLegacy, nullptr, nullptr};
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreate(&streams[2]));
  std::vector<Live> live;
  unsigned char next_tag = 1;
  auto allocate = [&](int i) {
    const size_t size = kSizes[i % 8] + static_cast<size_t>(i) * 512;
    Live b{nullptr, size, next_tag++, nullptr};
    if (next_tag == 0x80) next_tag = 1;
    if (i % 3 == 0) {
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&b.ptr), size));
      CHECK_CUDA(cudaMemset(b.ptr, b.tag, size));
      if (i % 2 == 0) b.freed_on = streams[1];  // a cudaMalloc block freed stream-ordered
    } else {
      cudaStream_t s = streams[i % 3];
      CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&b.ptr), size, s));
      CHECK_CUDA(cudaMemsetAsync(b.ptr, b.tag, size, s));
      b.freed_on = i % 4 == 1 ? nullptr : streams[(i + 1) % 3];
    }
    live.push_back(b);
  };

  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 24; ++i) allocate(round * 24 + i);
    check_all(live);
    std::vector<Live> kept;
    for (size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 0) {
        free_block(live[i]);
      } else {
        kept.push_back(live[i]);
      }
    }
    live.swap(kept);
    for (int i = 0; i < 12; ++i) allocate(round * 24 + i * 2);
    check_all(live);
    if (round == 1) {
      raise(SIGUSR1);  // the next call writes a report
      pairs_on_another_thread();
    }
    if (round == 2) {
      size_t free_bytes = 0;
      size_t total = 0;
      CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
      cudaMemPool_t pool = nullptr;
      CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
      std::uint64_t used = 0;
      CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
      CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    }
  }
  for (const Live& b : live) free_block(b);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(streams[1]));
  CHECK_CUDA(cudaStreamDestroy(streams[2]));
  long failures = 0;
  const long counted = disarm(&failures);
  std::printf("{\"core_allocations\": %ld, \"failures\": %ld}\n", counted, failures);
  return 0;
}
