// The ways a program or library reaches one of the driver's functions, for
// the programs that check gpupool watches each way: called directly by a
// program linked with the driver (driver-linked: the caller's own, not here),
// fetched with dlsym from the driver (driver-dlsym) or the global scope
// (driver-global), through the driver's cuGetProcAddress
// (driver-proc-address), by a library (driver_lookup_module.c's
// lookup_in; driver-library) or through that library's own cuGetProcAddress
// (its proc_address_in; driver-library-proc-address), or through the runtime's
// cudaGetDriverEntryPoint (runtime-entry-point, at the runtime's version) or
// cudaGetDriverEntryPointByVersion (runtime-entry-point-by-version), for
// which the runtime asks the driver itself.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace testprog {

// The driver's function `base` through the runtime (see above), with the
// driver's `flags` said in the runtime's: the default where it means them
// (the per-thread flag in a build with per-thread default streams, whose
// calls are the runtime's _ptsz twins), else the flag itself, so that
// between the two builds every flag is asked for. Null where not found.
inline void* runtime_entry_point(const std::string& how, const char* base, cuuint64_t flags, int version) {
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
  constexpr bool kDefaultIsPerThread = true;
#else
  constexpr bool kDefaultIsPerThread = false;
#endif
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const unsigned long long runtime_flags = per_thread == kDefaultIsPerThread ? cudaEnableDefault
                                           : per_thread                      ? cudaEnablePerThreadDefaultStream
                                                                             : cudaEnableLegacyStream;
  void* found = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaErrorUnknown;
  if (how == "runtime-entry-point") {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    err = cudaGetDriverEntryPoint(base, &found, runtime_flags, &status);
#pragma GCC diagnostic pop
  } else {
    err = cudaGetDriverEntryPointByVersion(base, &found, static_cast<unsigned int>(version), runtime_flags, &status);
  }
  return err == cudaSuccess && status == cudaDriverEntryPointSuccess ? found : nullptr;
}

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
  if (how == "driver-library-proc-address" && driver != nullptr && library != nullptr) {
    void* module = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    using ProcAddressIn = void* (*)(void*, const char*, int, cuuint64_t);
    auto in = module != nullptr ? reinterpret_cast<ProcAddressIn>(dlsym(module, "proc_address_in")) : nullptr;
    if (in != nullptr) found = in(driver, base, version, flags);
  }
  if (how == "runtime-entry-point" || how == "runtime-entry-point-by-version") {
    found = runtime_entry_point(how, base, flags, version);
  }
  if (found == nullptr) std::fprintf(stderr, "no %s found for %s\n", name, how.c_str());
  return found;
}

}  // namespace testprog
