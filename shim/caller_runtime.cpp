#include "shim/caller_runtime.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "shim/library_opening.hpp"
#include "shim/real_cuda.hpp"
#include "shim/thread_state.hpp"

namespace gpupool::shim {

namespace {

std::atomic<const void* (*)()> caller_lookup{nullptr};

// The runtimes other than real()'s, by their cudaGetLastError, each numbered
// once: claimed with a compare-and-swap, so that no lock is ever held (a fork
// may come at any time) and no runtime gets two numbers.
std::atomic<void*> numbered[kMaxRuntimes];  // [0] unused: runtime 0 is real()'s

// Libraries whose runtime is known, by the address range of their segments:
// a lookup scans a few entries, and a library is resolved once (a race may
// add it twice, which costs nothing). Slots are reserved with fetch_add and
// published by `ready`; when all are taken, callers are resolved each time.
struct KnownLibrary {
  std::uintptr_t begin;
  std::uintptr_t end;
  CallerRuntime runtime;
  std::atomic<bool> ready{false};
};
constexpr int kKnownLibraries = 64;
KnownLibrary known[kKnownLibraries];
std::atomic<int> known_reserved{0};

struct Library {
  std::uintptr_t address;  // in
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  char name[PATH_MAX] = {};
  bool found = false;
};

int find_library(dl_phdr_info* info, size_t, void* data) {
  auto* library = static_cast<Library*>(data);
  std::uintptr_t begin = UINTPTR_MAX;
  std::uintptr_t end = 0;
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD) continue;
    const std::uintptr_t start = info->dlpi_addr + segment.p_vaddr;
    begin = std::min(begin, start);
    end = std::max(end, start + segment.p_memsz);
    contains = contains || (library->address >= start && library->address < start + segment.p_memsz);
  }
  if (!contains) return 0;
  library->begin = begin;
  library->end = end;
  if (info->dlpi_name != nullptr) std::strncpy(library->name, info->dlpi_name, sizeof library->name - 1);
  library->found = true;
  return 1;
}

// The number of the runtime whose cudaGetLastError is `get_last`, given one
// if it has none yet; 0 when every number is taken.
int number_of(void* get_last) {
  for (int i = 1; i < kMaxRuntimes; ++i) {
    void* held = nullptr;
    if (numbered[i].compare_exchange_strong(held, get_last) || held == get_last) return i;
  }
  return 0;
}

RuntimeErrors real_errors() { return {real().cudaGetLastError, real().cudaPeekAtLastError}; }

RuntimeFetches real_fetches() {
  const RealCuda& r = real();
  return {r.cudaGetDriverEntryPoint, r.cudaGetDriverEntryPoint_ptsz, r.cudaGetDriverEntryPointByVersion,
          r.cudaGetDriverEntryPointByVersion_ptsz, r.cudaRuntimeGetVersion};
}

// `library`'s function `name` as its own dependencies resolve it, into `out`.
template <typename F>
void own_function(void* library, const char* name, F* out) {
  void* f = dlsym(library, name);
  std::memcpy(out, &f, sizeof f);
}

// Resolves the library at `address` (or notes that no library holds it).
// Only the walk of the loaded libraries holds a lock of gpupool's: the loader
// takes its own for the rest, and may hold it while a library's constructor
// calls CUDA (and comes here).
CallerRuntime resolve(std::uintptr_t address, std::uintptr_t* outside_libraries) {
  Library library{address};
  {
    std::lock_guard<std::mutex> lock(caller_lookups_mutex());
    dl_iterate_phdr(find_library, &library);
  }
  if (!library.found) *outside_libraries = address;
  CallerRuntime runtime{0, real_errors(), real_fetches()};
  // The program (no name) resolves through the global scope, as real() does.
  if (library.found && library.name[0] != '\0') {
    if (void* handle = open_loaded_library(library.name)) {
      // A handle's lookup covers the library and its own dependencies only,
      // not the preload library before them.
      void* get_last = dlsym(handle, "cudaGetLastError");
      void* peek_at_last = dlsym(handle, "cudaPeekAtLastError");
      Dl_info where;
      const bool ours = get_last != nullptr && dladdr(get_last, &where) != 0 &&
                        where.dli_fbase == preload_library_base();
      const void* real_get = reinterpret_cast<const void*>(real().cudaGetLastError);
      if (get_last != nullptr && peek_at_last != nullptr && !ours && get_last != real_get) {
        if (const int number = number_of(get_last); number != 0) {
          runtime.number = number;
          std::memcpy(&runtime.errors.get_last, &get_last, sizeof get_last);
          std::memcpy(&runtime.errors.peek_at_last, &peek_at_last, sizeof peek_at_last);
          RuntimeFetches& f = runtime.fetches;
          own_function(handle, "cudaGetDriverEntryPoint", &f.entry_point);
          own_function(handle, "cudaGetDriverEntryPoint_ptsz", &f.entry_point_ptsz);
          own_function(handle, "cudaGetDriverEntryPointByVersion", &f.entry_point_by_version);
          own_function(handle, "cudaGetDriverEntryPointByVersion_ptsz", &f.entry_point_by_version_ptsz);
          own_function(handle, "cudaRuntimeGetVersion", &f.get_version);
        }
      }
      dlclose(handle);
    }
  }
  if (library.found && known_reserved.load(std::memory_order_relaxed) < kKnownLibraries) {
    const int slot = known_reserved.fetch_add(1, std::memory_order_relaxed);
    if (slot < kKnownLibraries) {
      known[slot].begin = library.begin;
      known[slot].end = library.end;
      known[slot].runtime = runtime;
      known[slot].ready.store(true, std::memory_order_release);
    }
  }
  return runtime;
}

}  // namespace

std::mutex& caller_lookups_mutex() {
  static std::mutex mutex;
  return mutex;
}

cudaError_t& thread_error(int runtime) {
  thread_local cudaError_t errors[kMaxRuntimes] = {};
  return errors[runtime];
}

cudaError_t fail(cudaError_t error) {
  thread_error(caller_runtime().number) = error;
  return error;
}

void set_caller_lookup(const void* (*caller)()) { caller_lookup.store(caller, std::memory_order_release); }

CallerRuntime caller_runtime() {
  const void* (*lookup)() = caller_lookup.load(std::memory_order_acquire);
  const std::uintptr_t address = lookup != nullptr ? reinterpret_cast<std::uintptr_t>(lookup()) : 0;
  if (address == 0) return {0, real_errors(), real_fetches()};
  const int reserved = std::min(known_reserved.load(std::memory_order_relaxed), kKnownLibraries);
  for (int i = 0; i < reserved; ++i) {
    if (known[i].ready.load(std::memory_order_acquire) && address >= known[i].begin && address < known[i].end) {
      return known[i].runtime;
    }
  }
  // Code outside every library (generated at run time) has no range to
  // remember: its last call site is, so that a loop there walks the list once.
  thread_local std::uintptr_t outside_libraries = 0;
  if (address == outside_libraries) return {0, real_errors(), real_fetches()};
  return resolve(address, &outside_libraries);
}

void give_error_to_caller(cudaError_t err) {
  if (err == cudaSuccess || err == cudaErrorNotReady) return;  // NotReady is never a last error
  const int runtime = caller_runtime().number;
  const RealCuda& r = real();
  if (runtime == 0 || r.cudaPeekAtLastError == nullptr || r.cudaPeekAtLastError() != err) return;
  r.cudaGetLastError();
  thread_error(runtime) = err;
}

}  // namespace gpupool::shim
