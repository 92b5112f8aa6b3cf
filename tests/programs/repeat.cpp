// The same allocation sequence repeated: a pool should serve all but the first
// round from its cache. Prints what the program did (allocations, the peak of
// live requested bytes, the total requested) as JSON so the test
// can hold the report to it.
//   repeat [rounds]
#include "common.hpp"

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 50;
  static const size_t kSizes[] = {1, 700, 4096, 100000, 1 << 20, (1 << 20) + 1, 3 << 20, 9 << 20, 12 << 20, 33 << 20};
  long long allocations = 0, requested = 0, peak = 0, requested_total = 0;
  std::vector<void*> held;
  for (int r = 0; r < rounds; ++r) {
    for (size_t size : kSizes) {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, size));
      CHECK_CUDA(cudaMemset(p, r & 0xFF, size));
      held.push_back(p);
      ++allocations;
      requested += static_cast<long long>(size);
      requested_total += static_cast<long long>(size);
      if (requested > peak) peak = requested;
    }
    for (void* p : held) CHECK_CUDA(cudaFree(p));
    held.clear();
    requested = 0;
  }
  std::printf("{\"allocations\": %lld, \"peak_requested\": %lld, \"requested_total\": %lld}\n", allocations, peak,
              requested_total);
  return 0;
}
