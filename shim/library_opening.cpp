#include "shim/library_opening.hpp"

#include <dlfcn.h>
#include <sched.h>

#include <atomic>

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
  while (openers.load() != 0) sched_yield();
}

}  // namespace gpupool::shim
