// A reader that has gone away (a closed pipe or FIFO that GPUPOOL_LOG or
// GPUPOOL_TRACE names, or stderr piped to a reader that has exited) makes
// write() raise SIGPIPE, whose default action ends the process: gpupool's
// own writes must not end the program. While one
// of these is alive, SIGPIPE is blocked in the calling thread; a SIGPIPE the
// writes raised is taken back before it is unblocked (one already pending
// stays the program's), so that the write fails with EPIPE instead.
#pragma once

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace gpupool::shim {

class SigpipeHeld {
 public:
  SigpipeHeld() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    already_pending_ = pending();
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &before_);
  }
  ~SigpipeHeld() {
    if (!already_pending_ && pending()) {
      const timespec none{};
      while (sigtimedwait(&sigpipe_, nullptr, &none) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  SigpipeHeld(const SigpipeHeld&) = delete;
  SigpipeHeld& operator=(const SigpipeHeld&) = delete;

 private:
  static bool pending() {
    sigset_t set;
    sigemptyset(&set);
    return sigpending(&set) == 0 && sigismember(&set, SIGPIPE) == 1;
  }
  sigset_t sigpipe_;
  sigset_t before_;
  bool already_pending_ = false;
};

}  // namespace gpupool::shim
