// gpupool opens libraries already loaded (to look up functions in their own
// scope) at a thread's first calls. Never once the process is exiting: glibc's
// _dl_fini marks each library finalized before running its destructors,
// outside the loader's lock, and a dlopen in another thread then runs the
// constructors of every finalized library it depends on again (the sanitizer
// runtimes abort on that; other libraries start over in the middle of their
// teardown). The exit handler closes the opening, before _dl_fini runs.
#pragma once

namespace gpupool::shim {

// dlopen(path, RTLD_LAZY | RTLD_NOLOAD), or null once the opening is closed.
void* open_loaded_library(const char* path);

// No library is opened from now on; returns once those being opened are
// (waiting a second at most: the exit must go on, whatever happens).
void close_library_opening();

// In a fork's child: the threads that were opening libraries are not there.
void forget_library_openers();

}  // namespace gpupool::shim
