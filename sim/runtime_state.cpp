// The simulated runtime's shared state and injected failures
// (runtime_state.hpp).
#include "sim/runtime_state.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>

#include "sim/counters.hpp"
#include "sim/driver_caller.hpp"
#include "sim/vmm.hpp"

namespace simcuda {
namespace {

// True, at `rate`, for a call made by gpupool's core (seeded by
// SIMCUDA_FAIL_SEED). The program's own calls never fail, so that a test
// program's ordering of its own work stays as it wrote it.
bool injected_core_failure(const void* caller, double rate) {
  if (rate <= 0) return false;
  if (simcuda::t_driver_caller != nullptr) caller = simcuda::t_driver_caller;  // through a driver entry point
  Dl_info info;
  if (dladdr(caller, &info) == 0 || info.dli_fname == nullptr ||
      std::strstr(info.dli_fname, "/libgpupool-core.so") == nullptr) {
    return false;
  }
  static std::mutex mu;
  static const char* const seed = std::getenv("SIMCUDA_FAIL_SEED");
  static std::mt19937_64 rng(seed != nullptr ? std::strtoull(seed, nullptr, 10) : 1);
  std::lock_guard<std::mutex> lock(mu);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < rate;
}

double rate_from(const char* variable) {
  const char* text = std::getenv(variable);
  return text != nullptr ? std::atof(text) : 0;
}

}  // namespace

namespace rt {

std::mutex& events_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_set<Event*>& events() {
  static auto* all = new std::unordered_set<Event*>;
  return *all;
}
std::unordered_set<Event*>& reset_events() {
  static auto* all = new std::unordered_set<Event*>;
  return *all;
}

Event* usable_event(cudaEvent_t e) {
  auto* ev = reinterpret_cast<Event*>(e);
  if (ev != nullptr && ev->reset) {
    counters().stale_event_uses++;
    return nullptr;
  }
  return ev;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

cudaError_t result(cudaError_t err) {
  if (err != cudaSuccess) t_last_error = err;
  return err;
}

namespace {
constexpr int kFaultDevices = 64;
std::atomic<int> g_fault[kFaultDevices];
}  // namespace

cudaError_t fault_of(int device) {
  return device >= 0 && device < kFaultDevices ? static_cast<cudaError_t>(g_fault[device].load()) : cudaSuccess;
}
void set_fault(int device, int error) {
  if (device >= 0 && device < kFaultDevices) g_fault[device].store(error);
}
cudaError_t checked(int device, cudaError_t err) {
  const cudaError_t fault = fault_of(device);
  return result(fault != cudaSuccess ? fault : err);
}

bool injected_event_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_EVENT_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().event_failures++;
  return true;
}

bool injected_event_query_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_EVENT_QUERY_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().event_query_failures++;
  return true;
}

bool injected_host_wait_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_HOST_WAIT_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().host_wait_failures++;
  return true;
}

Stream* stream_of(cudaStream_t s, bool per_thread) { return Engine::instance().resolve(s, per_thread, t_device); }

}  // namespace rt

cudaError_t current_device_fault() { return rt::fault_of(rt::t_device); }

// SIMCUDA_UNMAP_FAIL_RATE: the chance that a cuMemUnmap made by gpupool's
// core is refused, as by a driver whose context a fault broke.
bool injected_unmap_failure(const void* caller) {
  static const double rate = rate_from("SIMCUDA_UNMAP_FAIL_RATE");
  if (!injected_core_failure(caller, rate)) return false;
  counters().unmap_failures++;
  return true;
}

Counters& counters() {
  static Counters* c = new Counters();
  return *c;
}
}  // namespace simcuda
