/* For test-runtime-by-name: a library linked against the runtime that looks
   a function up past itself, as an interposer does. */
#define _GNU_SOURCE
#include <dlfcn.h>

__attribute__((visibility("default"))) void* runtime_next(const char* name) {
  void* volatile found = dlsym(RTLD_NEXT, name); /* not a tail call: the caller must be this library */
  return found;
}
