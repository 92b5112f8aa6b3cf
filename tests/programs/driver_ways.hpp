// The ways a program or library reaches one of the driver's functions, for
// the programs that check gpupool watches each way: called directly by a
// program linked with the driver (driver-linked: the caller's own, not here),
// fetched with dlsym from the driver (driver-dlsym) or the global scope
// (driver-global), through the driver's cuGetProcAddress
// (driver-proc-address), or by a library (driver_lookup_module.c's
// lookup_in; driver-library).
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include <cuda.h>

namespace testprog {

// The driver's function `name` (`base` at `version` to its cuGetProcAddress,
// with `flags`) as `how` reaches it; null, said, otherwise.
inline void* driver_function(const std::string& how, const char* name, const char* base, const char* library,
                             cuuint64_t flags = 0, int version = 12000) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void* found = nullptr;
  if (how == "driver-dlsym" && driver != nullptr) found = dlsym(driver, name);
  if (how == "driver-global") found = dlsym(RTLD_DEFAULT, name);
  if (how == "driver-proc-address" && driver != nullptr) {
    using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    auto get = reinterpret_cast<GetProcAddress>(dlsym(driver, "cuGetProcAddress_v2"));
    if (get == nullptr || get(base, &found, version, flags, nullptr) != CUDA_SUCCESS) found = nullptr;
  }
  if (how == "driver-library" && driver != nullptr && library != nullptr) {
    void* module = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    using LookupIn = void* (*)(void*, const char*);
    auto lookup_in = module != nullptr ? reinterpret_cast<LookupIn>(dlsym(module, "lookup_in")) : nullptr;
    if (lookup_in != nullptr) found = lookup_in(driver, name);
  }
  if (found == nullptr) std::fprintf(stderr, "no %s found for %s\n", name, how.c_str());
  return found;
}

}  // namespace testprog
