// Blocks one thread freed stream-ordered, parked in its cache, and a second
// thread that then needs as much: the pool should serve it from those blocks
// once it has had to grow, not double the memory. Prints nothing; the test
// reads the report.
//   parked [blocks] [MiB each]
#include <future>
#include <thread>

#include "common.hpp"

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 16;
  const size_t bytes = static_cast<size_t>(argc > 2 ? std::atoi(argv[2]) : 8) << 20;
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  void* warm = nullptr;  // this thread's stream-ordered call: the next thread's turns caching on
  CHECK_CUDA(cudaMallocAsync(&warm, 512, first));
  CHECK_CUDA(cudaFreeAsync(warm, first));
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
