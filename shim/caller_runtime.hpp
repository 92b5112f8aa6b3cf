// Which CUDA runtime an intercepted call came from.
//
// A process may hold more than one shared CUDA runtime: a library built for
// CUDA 12 beside a program built for CUDA 13 (PyTorch for one major version,
// an extension module for the other). Each keeps its own last error per
// thread, which its callers read with cudaGetLastError. gpupool passes every
// call it does not serve to one of them (real(), runtime 0), so it keeps the
// errors of the calls it intercepts per runtime, and a caller's
// cudaGetLastError reads those of its own runtime and that runtime's own
// (a refused kernel launch, which never passes through gpupool).
//
// A caller's runtime is the one its library's own dependencies resolve
// cudaGetLastError to, found once per library from the call's return address
// (which the preload library records). The program's calls, and those of a
// library that resolves it to real()'s or has none of its own, are runtime
// 0's. A call made as a tail call returns past its library: it counts as made
// by whoever called that library. A library unloaded, and another loaded at
// its addresses, keeps the first one's runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

namespace gpupool::shim {

// Runtimes told apart; the callers of any more count as runtime 0's.
inline constexpr int kMaxRuntimes = 4;

struct RuntimeErrors {
  cudaError_t (*get_last)();
  cudaError_t (*peek_at_last)();
};

// How the preload library tells the return address of the intercepted call
// this thread is in. Set before the first call; without it, every call is
// runtime 0's.
void set_caller_lookup(const void* (*caller)());

// A runtime's own calls that fetch the driver's functions, which fetch at
// that runtime's version: another major version's driver functions may have
// other signatures (CUDA 13's cuMemPrefetchAsync is not CUDA 12's), so a
// caller's fetch goes to its own runtime. Null where that runtime has none.
using EntryPoint = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using EntryPointByVersion = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                            cudaDriverEntryPointQueryResult*);
struct RuntimeFetches {
  EntryPoint entry_point;
  EntryPoint entry_point_ptsz;
  EntryPointByVersion entry_point_by_version;
  EntryPointByVersion entry_point_by_version_ptsz;
  cudaError_t (*get_version)(int*);
};

// The runtime of the intercepted call this thread is in: its number, its
// last-error functions and its fetches (number 0: real()'s). The first call
// from a library asks the dynamic loader: never with a lock of gpupool's held
// (a library's constructor may allocate while the loader holds its own).
struct CallerRuntime {
  int number;
  RuntimeErrors errors;
  RuntimeFetches fetches;
};
CallerRuntime caller_runtime();

// Held while the dynamic loader's list of libraries is walked, and across
// fork(): the loader's lock for that walk is not made new in a child, which
// would wait for good on one taken at the fork.
std::mutex& caller_lookups_mutex();

// An intercepted call (not cudaGetLastError or cudaPeekAtLastError) returned
// `err`. Where the caller's runtime is not real()'s and the error is real()'s
// last error now (the call was passed on there and failed), the error moves
// to the caller's runtime, as it would have been set there without gpupool.
void give_error_to_caller(cudaError_t err);

}  // namespace gpupool::shim
