// Blocks one thread freed stream-ordered, parked in its cache, and a second
// thread that then needs as much: the pool should serve it from those blocks
// once it has had to grow, not double the memory. Prints nothing; the test
// reads the report.
//   parked [blocks] [MiB each]
//   parked double-free    a block freed twice while it waits in a thread's
//                         cache: the second free is refused, and the block is
//                         handed out once, not twice
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

}  // namespace

int main(int argc, char** argv) {
  const bool twice = argc > 1 && std::strcmp(argv[1], "double-free") == 0;
  const int blocks = argc > 1 && !twice ? std::atoi(argv[1]) : 16;
  const size_t bytes = static_cast<size_t>(argc > 2 ? std::atoi(argv[2]) : 8) << 20;
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  void* warm = nullptr;  // this thread's stream-ordered call: the next thread's turns caching on
  CHECK_CUDA(cudaMallocAsync(&warm, 512, first));
  CHECK_CUDA(cudaFreeAsync(warm, first));
  if (twice) return double_free(first, second);
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
