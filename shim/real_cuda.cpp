#include "shim/real_cuda.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

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

int list_loaded(struct dl_phdr_info* info, size_t, void* data) {
  if (info->dlpi_name != nullptr && *info->dlpi_name != '\0') {
    static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
  }
  return 0;
}

// The first loaded library (in load order) that defines the runtime's
// cudaMalloc, cudaFree and cudaGetLastError itself, gpupool's own aside: a
// runtime under any file name, which only a library's own scope may reach
// (a renamed copy needed by an extension module that Python loaded
// RTLD_LOCAL). Opened, or null.
void* runtime_by_definition() {
  std::vector<std::string> paths;
  dl_iterate_phdr(list_loaded, &paths);
  const void* preload = preload_library_base();
  for (const std::string& path : paths) {
    void* handle = open_loaded_library(path.c_str());
    if (handle == nullptr) continue;
    bool defines = true;
    for (const char* name : {"cudaMalloc", "cudaFree", "cudaGetLastError"}) {
      void* f = dlsym(handle, name);
      Dl_info where;
      defines = defines && f != nullptr && dladdr(f, &where) != 0 && where.dli_fbase != preload &&
                where.dli_fname != nullptr && path == where.dli_fname;
    }
    if (defines) return handle;
    dlclose(handle);
  }
  return nullptr;
}

int count_loaded(struct dl_phdr_info* info, size_t size, void* data) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds) {
    *static_cast<unsigned long long*>(data) = info->dlpi_adds;
  }
  return 1;
}

// How many libraries the process has loaded so far.
unsigned long long libraries_loaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(count_loaded, &adds);
  return adds;
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

namespace {

void resolve_from(RealCuda& table, void* cudart) {
#define GPUPOOL_RESOLVE(name, signature) \
  table.name = reinterpret_cast<std::add_pointer_t<signature>>(lookup(cudart, #name));
  GPUPOOL_REAL_FUNCTIONS(GPUPOOL_RESOLVE)
#undef GPUPOOL_RESOLVE
}

// Looks for the runtime, and again at a later call whenever a library was
// loaded or the static runtime's driver lookup came since a look that found
// none; until one is found, callers see every function null (and pass nothing
// on). The loader is asked with no lock of gpupool's held: a library's
// constructor may call CUDA while the loader holds its own lock, and must not
// wait for a thread that waits for the loader. So threads that come while
// another looks make their own look (they find the same runtime); the first
// one found is kept.
// Out of line: inlined, its frame's set-up would come before real()'s check.
[[gnu::noinline, gnu::cold]] const RealCuda& resolve(std::atomic<const RealCuda*>& resolved) {
  static RealCuda table;  // published once it has the runtime's cudaMalloc
  static const RealCuda kNothing;
  static std::mutex mutex;  // for the fields below and `table`
  static int looking = 0;
  static bool found_none = false;  // by the last look, with these:
  static unsigned long long none_with_loaded = 0;
  static gpupool_driver_lookup_fn none_with_driver = nullptr;
  const unsigned long long loaded = libraries_loaded();
  const gpupool_driver_lookup_fn driver = driver_lookup.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const RealCuda* t = resolved.load(std::memory_order_acquire)) return *t;
    if (looking == 0 && found_none && loaded == none_with_loaded && driver == none_with_driver) return kNothing;
    ++looking;
  }
  RealCuda found;
  void* cudart = loaded_cudart();
  // No shared runtime loaded (a simulated one answering as the driver may
  // still be found by name): the driver serves. Its functions' shared state
  // is filled one thread at a time.
  bool from_driver = false;
  if (cudart == nullptr && driver != nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    from_driver = resolved.load(std::memory_order_acquire) == nullptr && fill_from_driver(found, driver);
  }
  if (!from_driver) {
    resolve_from(found, cudart);
    if (found.cudaMalloc == nullptr && cudart == nullptr) {
      if (void* defining = runtime_by_definition()) resolve_from(found, defining);
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  --looking;
  if (const RealCuda* t = resolved.load(std::memory_order_acquire)) return *t;
  if (found.cudaMalloc == nullptr) {
    found_none = true;
    none_with_loaded = loaded;
    none_with_driver = driver;
    return kNothing;
  }
  table = found;
  resolved.store(&table, std::memory_order_release);
  return table;
}

}  // namespace

const RealCuda& real() {
  // Every intercepted call asks: one acquire load once resolved (a lock or
  // call_once costs more, a thread-local lookup per call in a dlopen'ed
  // library).
  static std::atomic<const RealCuda*> resolved{nullptr};
  if (const RealCuda* t = resolved.load(std::memory_order_acquire)) return *t;
  return resolve(resolved);
}

const void* real_function(const char* name) {
  const RealCuda& r = real();
#define GPUPOOL_ENTRY(entry, params, args) \
  if (std::strcmp(name, #entry) == 0) return reinterpret_cast<const void*>(r.entry);
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
  return nullptr;
}

}  // namespace gpupool::shim
