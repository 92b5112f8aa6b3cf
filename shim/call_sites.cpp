#include "shim/call_sites.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "shim/real_cuda.hpp"

namespace gpupool::shim {

namespace {

constexpr int kMaxFrames = 24;
constexpr int kFramesKept = 12;

// The load address of this library, to skip our own frames.
void* own_base() {
  Dl_info info;
  static int anchor;
  return dladdr(&anchor, &info) != 0 ? info.dli_fbase : nullptr;
}

}  // namespace

void CallSites::enable() {
  void* frames[2];
  backtrace(frames, 2);  // the first call loads the unwinder: not on the hot path later
  enabled_ = true;
}

std::uint32_t CallSites::capture_stack() {
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  static void* const self = own_base();
  static void* const preload = preload_library_base();
  // Skip everything up to and including our own frames, the preload
  // library's among them (a sanitizer's backtrace interceptor may come first).
  int first = 0;
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) != 0 && (info.dli_fbase == self || info.dli_fbase == preload)) {
      first = i + 1;
    } else if (first > 0) {
      break;
    }
  }
  std::vector<void*> kept(frames + first, frames + std::min(n, first + kFramesKept));
  std::uint64_t hash = 1469598103934665603ull;
  for (void* f : kept) hash = (hash ^ reinterpret_cast<std::uintptr_t>(f)) * 1099511628211ull;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = by_hash_.try_emplace(hash, static_cast<std::uint32_t>(stacks_.size() + 1));
  if (added) stacks_.push_back(std::move(kept));
  return it->second;
}

std::vector<std::string> CallSites::symbolize(std::uint32_t site) {
  std::vector<void*> frames;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (site == 0 || site > stacks_.size()) return {};
    frames = stacks_[site - 1];
  }
  std::vector<std::string> out;
  for (void* f : frames) {
    Dl_info info{};
    char line[512];
    if (dladdr(f, &info) == 0) {
      std::snprintf(line, sizeof line, "%p", f);
    } else {
      const char* lib = info.dli_fname != nullptr ? info.dli_fname : "?";
      if (info.dli_sname != nullptr) {
        int status = 0;
        char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        const char* name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
        std::snprintf(line, sizeof line, "%s+%#zx (%s)", name,
                      static_cast<std::size_t>(static_cast<char*>(f) - static_cast<char*>(info.dli_saddr)), lib);
        std::free(demangled);
      } else {
        std::snprintf(line, sizeof line, "%s+%#zx", lib,
                      static_cast<std::size_t>(static_cast<char*>(f) - static_cast<char*>(info.dli_fbase)));
      }
    }
    out.emplace_back(line);
  }
  return out;
}

}  // namespace gpupool::shim
