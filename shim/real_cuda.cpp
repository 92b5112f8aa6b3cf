#include "shim/real_cuda.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "shim/driver_runtime.hpp"
#include "shim/library_opening.hpp"

namespace gpupool::shim {

namespace {

// The path of a loaded libcudart.so.*, if any: also under the name a wheel's
// repair tool gives the copy it bundles (libcudart-1a2b3c4d.so.11.0).
int find_cudart(struct dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (name == nullptr || *name == '\0') return 0;
  const char* base = std::strrchr(name, '/');
  base = base != nullptr ? base + 1 : name;
  if (std::strncmp(base, "libcudart.so", 12) != 0 && std::strncmp(base, "libcudart-", 10) != 0) return 0;
  *static_cast<const char**>(data) = name;
  return 1;
}

void* loaded_cudart() {
  const char* path = nullptr;
  dl_iterate_phdr(find_cudart, &path);
  return path != nullptr ? open_loaded_library(path) : nullptr;
}

std::atomic<void* (*)(const char*)> symbol_lookup{nullptr};
std::atomic<gpupool_driver_lookup_fn> driver_lookup{nullptr};

void* lookup(void* cudart, const char* name) {
  void* (*next)(const char*) = symbol_lookup.load(std::memory_order_acquire);
  void* f = next != nullptr ? next(name) : dlsym(RTLD_NEXT, name);
  if (f == nullptr && cudart != nullptr) f = dlsym(cudart, name);
  return f;
}

}  // namespace

void set_symbol_lookup(void* (*lookup_function)(const char* name)) {
  symbol_lookup.store(lookup_function, std::memory_order_release);
}

void set_driver_lookup(gpupool_driver_lookup_fn lookup) { driver_lookup.store(lookup, std::memory_order_release); }

void* preload_library_base() {
  void* (*next)(const char*) = symbol_lookup.load(std::memory_order_acquire);
  Dl_info info;
  if (next == nullptr || dladdr(reinterpret_cast<void*>(next), &info) == 0) return nullptr;
  return info.dli_fbase;
}

void resolve_real_where_runtime_loaded() {
  const char* path = nullptr;
  dl_iterate_phdr(find_cudart, &path);
  if (path != nullptr) real();
}

const RealCuda& real() {
  // Every intercepted call asks: one acquire load once resolved (call_once
  // alone costs a thread-local lookup per call in a dlopen'ed library).
  static std::atomic<const RealCuda*> resolved{nullptr};
  if (const RealCuda* t = resolved.load(std::memory_order_acquire)) return *t;
  static RealCuda table;
  static std::once_flag once;
  std::call_once(once, [] {
    void* cudart = loaded_cudart();
    // No shared runtime loaded (a simulated one answering as the driver may
    // still be found by name): the driver serves.
    if (cudart == nullptr && fill_from_driver(table, driver_lookup.load(std::memory_order_acquire))) {
      resolved.store(&table, std::memory_order_release);
      return;
    }
#define GPUPOOL_RESOLVE(name, signature) \
  table.name = reinterpret_cast<std::add_pointer_t<signature>>(lookup(cudart, #name));
    GPUPOOL_REAL_FUNCTIONS(GPUPOOL_RESOLVE)
#undef GPUPOOL_RESOLVE
    resolved.store(&table, std::memory_order_release);
  });
  return table;
}

}  // namespace gpupool::shim
