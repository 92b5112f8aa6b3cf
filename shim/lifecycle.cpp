// The runtime's part in the process's life after the lazy start
// (Runtime::get): a report on a signal or on request, the report at exit
// (no CUDA call from then on), and fork (the handlers hold every lock the
// child could take, so it inherits none held by another thread; the child
// starts with empty pools and traces to its own file or not at all).
#include <link.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "shim/messages.hpp"
#include "shim/report_file.hpp"
#include "shim/runtime.hpp"
#include "shim/step_aside.hpp"

namespace gpupool::shim {

bool cuda_driver_loaded() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "/libcuda.so") != nullptr) {
          *static_cast<bool*>(out) = true;
        }
        return 0;
      },
      &found);
  return found;
}

bool explain_library_not_taken_over(bool nothing_pooled) {
  const std::string library = driver_library_not_taken_over();
  if (library.empty()) return false;
  message(config::LogLevel::Warn,
          std::string(nothing_pooled ? "gpupool: this program used CUDA, but none of its device memory reached "
                                       "gpupool: "
                                     : "gpupool: not all of this program's device memory reached gpupool (nor this "
                                       "report): ") +
              library +
              " takes memory from the driver itself (it fetched the driver's allocation calls by name, as "
              "JAX/XLA's CUDA stubs do); set GPUPOOL_STATIC_RUNTIME=1 GPUPOOL_STATIC_RUNTIME_LIBRARIES=" +
              library + " to pool it");
  return true;
}

void explain_nothing_pooled(bool static_runtime_asked) {
  if (explain_library_not_taken_over(true)) return;
  std::string static_runtime =
      "set GPUPOOL_STATIC_RUNTIME=1 to pool a program built with nvcc's default static runtime (or rebuild it "
      "with -cudart shared)";
#if !defined(__x86_64__) && !defined(__aarch64__)  // where driver_hook.c exports no dlsym
  static_runtime = "a program built with nvcc's default static runtime must be rebuilt with -cudart shared";
#endif
  if (static_runtime_asked) {
    static_runtime =
        "static_runtime:1 found no static runtime asking the driver for cuGetProcAddress in the program itself "
        "(one in a library is taken over when static_runtime_libraries names it; a program may also link the "
        "driver directly)";
  }
  message(config::LogLevel::Warn,
          "gpupool: this program used CUDA, but none of its device memory was asked for with cudaMalloc or "
          "cudaMallocAsync of the shared CUDA runtime, so gpupool pooled nothing; " +
              static_runtime +
              "; a library that fetches the driver's calls itself (by cuGetProcAddress or dlsym, as JAX/XLA does) is "
              "pooled with static_runtime:1 when static_runtime_libraries names it, one linked to the driver is not");
}

void Runtime::on_report_signal(int) { report_requested_.store(true, std::memory_order_relaxed); }

void Runtime::install_report_signal() {
  if (config_.report_signal == 0) return;
  struct sigaction current {};
  if (sigaction(config_.report_signal, nullptr, &current) != 0) return;
  if (current.sa_handler != SIG_DFL) return;  // the program's own: leave it
  struct sigaction ours {};
  ours.sa_handler = &Runtime::on_report_signal;
  ours.sa_flags = SA_RESTART;
  sigemptyset(&ours.sa_mask);
  sigaction(config_.report_signal, &ours, nullptr);
}

void Runtime::write_requested_report() {
  if (!report_requested_.exchange(false)) return;
  write_report("signal");
}

void Runtime::write_report(const char* reason) {
  if (disabled_ || !config_.report || !used_.load()) return;
  if (trace_) trace_->flush();
  // Once stepped aside, the pools are left as they were (see step_aside.hpp).
  if (!stepped_aside()) return_held_blocks();
  const double seconds = static_cast<double>(clock_.now_ns()) / 1e9;
  try {
    std::vector<DeviceState*> states;
    for (int i = 0; i < kMaxDevices; ++i) {
      if (DeviceState* d = existing(i)) states.push_back(d);
    }
    std::vector<std::string> trace_problems = trace_ ? trace_->problems() : std::vector<std::string>{};
    if (!trace_not_opened_.empty()) trace_problems.push_back(trace_not_opened_);
    write_report_file(config_, problems_, config_notes_, trace_problems, states, call_sites_, caches_, reason,
                      seconds);
  } catch (const std::exception& e) {
    // Nothing in the pools changes while a report is made: only the report is lost.
    char line[200];
    std::snprintf(line, sizeof line, "gpupool: cannot make the report: %s", e.what());
    message(config::LogLevel::Error, line);
  }
}

void Runtime::return_held_blocks() {
  // Blocks freed on another device's stream whose work is done are the
  // pool's again, not the program's: a mid-run report shows them freed. (At
  // exit none is left, and no CUDA call is made; a query during a capture
  // could invalidate it.)
  for (int i = 0; i < kMaxDevices && !any_capture(); ++i) {
    DeviceState* d = existing(i);
    if (d == nullptr) continue;
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    if (!d->foreign_frees.empty()) return_foreign_frees(*d, false);
  }
  caches_.flush_all();  // so that the pools' current figures are the program's
}

void Runtime::at_exit() {
  if (exiting_.exchange(true)) return;
  // Frees still waiting on another device's stream were the program's frees:
  // count them so (no CUDA call: the device may be gone; events are leaked).
  for (int i = 0; i < kMaxDevices && !stepped_aside(); ++i) {
    DeviceState* d = existing(i);
    if (d == nullptr) continue;
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    settle_foreign_frees(*d, false);
  }
  write_report("exit");
  // A forked child's CUDA was its parent's, which speaks for it.
  const std::uint64_t own_pool = own_pool_allocations_.load();
  const std::uint64_t opened_pool = opened_pool_allocations_.load();
  auto calls = [](std::uint64_t n) {
    return std::to_string(n) + (n == 1 ? " cudaMallocAsync call" : " cudaMallocAsync calls");
  };
  if (own_pool > 0 && !forked_child_) {
    message(config::LogLevel::Warn,
            "gpupool: " + calls(own_pool) +
                " drew from memory pools this program made current (cudaDeviceSetMemPool, cudaMemSetMemPool); "
                "gpupool leaves those to the runtime, and the report does not count them");
  }
  if (opened_pool > 0 && !forked_child_) {
    const std::string it_or_them = opened_pool == 1 ? "it" : "them";
    message(config::LogLevel::Warn,
            "gpupool: " + calls(opened_pool) +
                " drew from default memory pools this program opened to other devices (cudaMemPoolSetAccess), "
                "which gpupool's fixed segments cannot follow; the runtime served " + it_or_them +
                ", and the report does not count " + it_or_them + " (GPUPOOL_EXPANDABLE_SEGMENTS=1 pools them)");
  }
  if (!disabled_ && !used_.load() && !forked_child_ && own_pool == 0 && opened_pool == 0 && cuda_driver_loaded()) {
    explain_nothing_pooled(config_.static_runtime);
  } else if (!disabled_ && !forked_child_) {
    explain_library_not_taken_over(false);
  }
  if (trace_) {
    trace_->flush();
    if (const std::string mixed = trace_->mixed_devices_line(); !mixed.empty()) {
      message(config::LogLevel::Warn, mixed);
    }
  }
}

// In the order the other paths nest them: the caches' flush lock before a
// pool's (a flush gives blocks back to it), and a pool's before the caches'
// registry and the call sites' (a report reads the caches' traffic and names
// the sites of leaks with it held) and the trace's (a free is traced with it
// held); the messages' lock last.
void Runtime::before_fork() {
  // The child's handler must not allocate: room for the parent's pools is
  // made now. Should there be none, the child loses track of them (they are
  // never used there either way).
  try {
    inherited_.reserve(inherited_.size() + kMaxDevices);
  } catch (const std::bad_alloc&) {
  }
  caches_.flush_mutex().lock();
  devices_mu_.lock();
  streams_mu_.lock();
  for (int i = 0; i < kMaxDevices; ++i) {
    if (DeviceState* d = existing(i)) d->mu.lock();
  }
  caches_.registry_mutex().lock();
  call_sites_.mutex().lock();
  if (trace_) trace_->mutex().lock();
  messages_mutex().lock();
}

void Runtime::after_fork_parent() {
  messages_mutex().unlock();
  if (trace_) trace_->mutex().unlock();
  call_sites_.mutex().unlock();
  caches_.registry_mutex().unlock();
  for (int i = kMaxDevices - 1; i >= 0; --i) {
    if (DeviceState* d = existing(i)) d->mu.unlock();
  }
  streams_mu_.unlock();
  devices_mu_.unlock();
  caches_.flush_mutex().unlock();
}

// The parent's pools, streams and buffered trace lines are the parent's. The
// child starts empty and reports only what it does itself. Nothing here
// allocates or frees: another thread of the parent may have held an
// allocator's lock (ASan's, say) at the fork, and only the allocator's own
// handlers know to reset it.
void Runtime::after_fork_child() {
  after_fork_parent();  // the child is this one thread now
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceState* d = devices_[i].exchange(nullptr);
    if (d != nullptr && inherited_.size() < inherited_.capacity()) inherited_.push_back(d);  // room made before
  }
  device_states_ = 0;
  only_device_.store(-1);
  parents_streams_ = true;
  streams_generation_.fetch_add(1);
  caches_.disable_after_fork();
  used_.store(false);
  forked_child_ = true;
  clock_.restart();  // the report's run length is the child's own
  if (trace_) trace_->after_fork_child();
}

}  // namespace gpupool::shim
