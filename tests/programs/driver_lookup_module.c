/* A library that looks up driver functions itself, as a library carrying its
   own static runtime (NCCL, for one) does: gpupool must leave its lookups alone. */
#define _GNU_SOURCE
#include <dlfcn.h>

void* lookup_in(void* handle, const char* name) { return dlsym(handle, name); }
