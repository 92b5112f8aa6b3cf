/* Stands in for libgpupool-core.so (copied beside libgpupool.so under that
   name): loading it takes half a second, and it is no gpupool core, so the
   calls then go straight to the runtime. For test-lifecycle
   fork-while-loading: a fork and an exit while a thread loads the core. */
#include <time.h>

__attribute__((constructor)) static void load_slowly(void) {
  const struct timespec half_second = {0, 500000000};
  nanosleep(&half_second, NULL);
}
