// Reuse hazards on the simulated device (the cases: hazard_cases.hpp). The old
// owner's slow "kernel" is a host function, which writes device memory
// directly on the simulated device.
//   hazards <case> [delay_ms]
// HAZARDS_PRIORITY=N makes its streams with cudaStreamCreateWithPriority.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "hazard_cases.hpp"

// The driver's stream destroy the driver-linked cases call, weak: the
// simulated runtime is the driver too and defines it, a real runtime does
// not, and a strong reference would stop this program at its start there.
#pragma weak cuStreamDestroy_v2

namespace hazards {

extern const size_t kBytes = 1 << 20;

namespace {
struct SlowWrite {
  void* ptr;
  size_t bytes;
  unsigned char value;
};

void slow_write(void* arg) {
  auto* w = static_cast<SlowWrite*>(arg);
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  std::memset(w->ptr, w->value, w->bytes);
  delete w;
}
}  // namespace

void old_owner_writes(void* p, cudaStream_t stream, size_t bytes) {
  // Its own record: several writes may be queued at once, on several streams.
  HAZARD_CHECK(cudaLaunchHostFunc(stream, slow_write, new SlowWrite{p, bytes, kOld}));
}

}  // namespace hazards

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hazards <case> [delay_ms]\n");
    return 64;
  }
  if (argc > 2) hazards::delay_ms = static_cast<unsigned>(std::atoi(argv[2]));
  const int result = hazards::run_case(argv[1]);
  if (result < 0) {
    std::fprintf(stderr, "hazards: unknown case %s\n", argv[1]);
    return 64;
  }
  return result;
}
