// Two CUDA runtimes in one process: this program's (the simulated runtime, as
// CUDA 13's) and that of LIB, a library built against another
// (second_runtime.c as CUDA 12's), loaded RTLD_LOCAL as Python loads an
// extension module. Each runtime keeps its own last error, and each caller's
// cudaGetLastError must read its own: errors of its calls that gpupool serves
// or passes on, but not the other runtime's callers'.
//
//   two_runtimes LIB   prints one JSON line: what each call returned, by name
#include <dlfcn.h>

#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace {

using Call = cudaError_t (*)();

template <typename F>
F library_function(void* library, const char* name) {
  void* f = dlsym(library, name);
  if (f == nullptr) {
    std::fprintf(stderr, "%s: %s\n", name, dlerror());
    std::exit(1);
  }
  F typed;
  std::memcpy(&typed, &f, sizeof f);
  return typed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: two_runtimes LIB\n");
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  const auto launch12 = library_function<Call>(library, "cuda12_launch");
  const auto get12 = library_function<Call>(library, "cuda12_get_last_error");
  const auto peek12 = library_function<Call>(library, "cuda12_peek_at_last_error");
  const auto malloc_free12 = library_function<cudaError_t (*)(size_t)>(library, "cuda12_malloc_free");
  const auto peer12 = library_function<cudaError_t (*)(int)>(library, "cuda12_enable_peer_access");
  const auto fetch12 =
      library_function<cudaError_t (*)(const char*, void**)>(library, "cuda12_fetch_driver_function");
  constexpr size_t kTooLarge = size_t{1} << 50;

  std::vector<std::pair<std::string, cudaError_t>> results;
  auto note = [&](const char* name, cudaError_t err) { results.emplace_back(name, err); };
  void* block = nullptr;
  CHECK_CUDA(cudaMalloc(&block, 1 << 20));  // the pool is made, and serves what follows

  // A launch the other runtime refuses is its callers' error, after calls of
  // this program's in between.
  note("launch12", launch12());
  CHECK_CUDA(cudaFree(block));
  CHECK_CUDA(cudaMalloc(&block, 1 << 20));
  note("peek12", peek12());
  note("get12", get12());
  note("get12_again", get12());
  // An error of this program's runtime is this program's.
  note("set_device", cudaSetDevice(1000));
  note("get12_beside_set_device", get12());
  note("get_after_set_device", cudaGetLastError());
  // A call of the library's that gpupool passes on to this program's runtime
  // and that fails there (PyTorch clears cudaErrorPeerAccessAlreadyEnabled so).
  // A device that does not exist, which every runtime refuses alike (for
  // device 0 itself, CUDA 13 answers cudaErrorPeerAccessUnsupported).
  note("peer12", peer12(-1));
  note("get_after_peer12", cudaGetLastError());
  note("peek12_after_peer12", peek12());
  note("get12_after_peer12", get12());
  // An allocation of the library's that fails, then one of this program's.
  note("oom12", malloc_free12(kTooLarge));
  note("get_after_oom12", cudaGetLastError());
  note("get12_after_oom12", get12());
  void* huge = nullptr;
  note("oom", cudaMalloc(&huge, kTooLarge));
  note("get12_after_oom", get12());
  note("peek_after_oom", cudaPeekAtLastError());
  note("get_after_oom", cudaGetLastError());
  // The driver's cuMemFree as the library's runtime fetches it: that
  // runtime's answer (its own version's function), which gpupool watches.
  auto watched = [](void* function) {
    Dl_info where{};
    return static_cast<cudaError_t>(dladdr(function, &where) != 0 && where.dli_fname != nullptr &&
                                    std::strstr(where.dli_fname, "libgpupool") != nullptr);
  };
  void* free12 = nullptr;
  note("fetch_free12", fetch12("cuMemFree", &free12));
  using DriverFree = int (*)(unsigned long long);
  DriverFree driver_free12 = nullptr;
  std::memcpy(&driver_free12, &free12, sizeof free12);
  // Memory no one lent: the fetched function's own answer.
  note("driver_free12", static_cast<cudaError_t>(driver_free12 != nullptr ? driver_free12(0x1000) : -1));
  note("driver_free12_watched", watched(free12));
  void* destroy12 = nullptr;
  note("fetch_destroy12", fetch12("cuStreamDestroy", &destroy12));
  note("driver_destroy12_watched", watched(destroy12));
  // A fetch the library's runtime refuses (nowhere to put the function): its
  // error, which that runtime's callers read, and no one else.
  note("fetch_refused12", fetch12("cuMemFree", nullptr));
  note("get_after_fetch_refused12", cudaGetLastError());
  note("get12_after_fetch_refused12", get12());
  // Both go on: an allocation each, and no error left anywhere.
  note("pair12", malloc_free12(1 << 20));
  CHECK_CUDA(cudaFree(block));
  note("get12_at_end", get12());
  note("get_at_end", cudaGetLastError());

  std::printf("{");
  for (size_t i = 0; i < results.size(); ++i) {
    std::printf("%s\"%s\": %d", i > 0 ? ", " : "", results[i].first.c_str(), static_cast<int>(results[i].second));
  }
  std::printf("}\n");
  return 0;
}
