// Fault injection (SIMCUDA_EVENT_FAIL_RATE, SIMCUDA_EVENT_QUERY_FAIL_RATE,
// SIMCUDA_HOST_WAIT_FAIL_RATE) fails only the calls gpupool's core makes,
// which it finds by the caller's address. A driver entry point calls the
// runtime function of the same meaning: it names its own caller for that
// call, so that the judgement does not hang on whether the compiler made the
// call a tail call (ASan's builds do not).
#pragma once

namespace simcuda {

inline thread_local const void* t_driver_caller = nullptr;

class DriverCaller {
 public:
  explicit DriverCaller(const void* caller) : outer_(t_driver_caller) {
    if (outer_ == nullptr) t_driver_caller = caller;
  }
  ~DriverCaller() { t_driver_caller = outer_; }
  DriverCaller(const DriverCaller&) = delete;
  DriverCaller& operator=(const DriverCaller&) = delete;

 private:
  const void* outer_;
};

}  // namespace simcuda
