#include "shim/library_opening.hpp"

#include <dlfcn.h>
#include <sched.h>

#include <atomic>
#include <chrono>

namespace gpupool::shim {

namespace {
// Sequentially consistent, both sides: an opener either sees the opening
// closed, or is seen opening by the closer, which waits for it.
std::atomic<int> openers{0};
std::atomic<bool> closed{false};
}  // namespace

void* open_loaded_library(const char* path) {
  openers.fetch_add(1);
  void* handle = closed.load() ? nullptr : dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  openers.fetch_sub(1);
  return handle;
}

void close_library_opening() {
  closed.store(true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (openers.load() != 0 && std::chrono::steady_clock::now() < deadline) sched_yield();
}

void forget_library_openers() { openers.store(0); }

}  // namespace gpupool::shim
