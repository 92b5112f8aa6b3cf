// What cudaMemGetInfo says before and after the program caches 100 MiB, as
// JSON: {"total": .., "free_before": .., "free_after": ..}.
#include "common.hpp"

int main() {
  size_t free_before = 0, free_after = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 100 << 20));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
  std::printf("{\"total\": %zu, \"free_before\": %zu, \"free_after\": %zu}\n", total, free_before, free_after);
  return 0;
}
