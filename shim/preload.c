/* libgpupool.so, the library LD_PRELOAD names. Plain C, no C++ runtime: most
   processes that inherit LD_PRELOAD (shells, compilers, data loader workers)
   never touch CUDA, and for them this small library is all that loads. The
   first intercepted call loads the allocator, libgpupool-core.so from the same
   folder, with RTLD_LOCAL (none of its symbols can meet the program's), and
   every call is forwarded to it from then on. If the core cannot be loaded,
   one line says so and the calls go straight to the CUDA runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shim/core_interface.h"
#include "shim/ptsz.h"

#define EXPORT __attribute__((visibility("default")))


static char core_path[PATH_MAX];
static _Atomic(const struct gpupool_core*) core;
static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static struct gpupool_core passthrough;
static pthread_once_t passthrough_once = PTHREAD_ONCE_INIT;
/* Once the exit handler runs, the core is no longer loaded from other
   threads: glibc's _dl_fini comes next, and a dlopen racing it runs the
   constructors of libraries already finalized again (library_opening.hpp).
   Sequentially consistent on both sides: a caller either sees `exiting`, or
   is counted in `core_loaders` when the exit handler looks, and waited for. */
static atomic_int exiting;
static atomic_int core_loaders;
/* Where the core is loaded (its dli_fbase): set before it opens, which
   resolves the runtime's functions with lookups of its own. */
static _Atomic(const void*) core_base;

/* dlsym(RTLD_NEXT) searches past the object that called it, found from the
   return address: never a tail call here, or the core (this function's
   caller) would be taken for the caller, and nothing loaded before it found.
   The runtime's functions were then found only where a libcudart.so* was
   loaded under that name. */
static void* next_symbol(const char* name) {
  void* volatile found = dlsym(RTLD_NEXT, name);
  return found;
}

/* The return address of the intercepted call this thread is in, for the core
   to tell which CUDA runtime the calling library uses (one store per call:
   initial-exec, as the library is loaded with the program). */
static __thread const void* current_caller __attribute__((tls_model("initial-exec")));
static const void* caller_of_current_call(void) { return current_caller; }

/* The file descriptor 2 named when the program started. A program that
   starts without one (`prog 2>&-`), or closes it, gets its next file opened
   there: a checkpoint, a socket. A line of gpupool's written then would land
   in that file. So lines are written only while descriptor 2 is still the
   file it started with, or, where it was open then, a pipe put there since
   (Jupyter's kernel puts one there to show the program's output; a program
   that closed its stderr and opened a file, a socket or a serial port there
   gets none). A program that puts another file there on purpose loses
   gpupool's lines, not its data. */
static struct {
  int open;
  dev_t dev;
  ino_t ino;
} stderr_at_start;

static void note_stderr_at_start(void) {
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return;
  stderr_at_start.dev = st.st_dev;
  stderr_at_start.ino = st.st_ino;
  stderr_at_start.open = 1;
}

static int stderr_takes_lines(void) {
  struct stat now;
  if (!stderr_at_start.open || fstat(STDERR_FILENO, &now) != 0) return 0;
  if (now.st_dev == stderr_at_start.dev && now.st_ino == stderr_at_start.ino) return 1;
  return S_ISFIFO(now.st_mode);
}

/* Pass-through when the core is missing: the real function, or this. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define GPUPOOL_ENTRY(name, params, args) \
  static cudaError_t missing_##name params { return cudaErrorNotSupported; }
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
#pragma GCC diagnostic pop

static void fill_passthrough(void) {
  passthrough.abi = GPUPOOL_CORE_ABI;
#define GPUPOOL_ENTRY(name, params, args)                   \
  {                                                         \
    void* real = next_symbol(#name);                        \
    if (real != NULL) {                                     \
      memcpy(&passthrough.name, &real, sizeof real);        \
    } else {                                                \
      passthrough.name = missing_##name;                    \
    }                                                       \
  }
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
}

static void load_core(void) {
  const struct gpupool_core* loaded = NULL;
  const char* problem = "the file is not a gpupool core of this version";
  void* handle = dlopen(core_path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    problem = dlerror();
  } else {
    void* symbol = dlsym(handle, GPUPOOL_CORE_OPEN);
    gpupool_core_open_fn open_core = NULL;
    Dl_info core_info;
    if (symbol != NULL && dladdr(symbol, &core_info) != 0) atomic_store(&core_base, core_info.dli_fbase);
    if (symbol != NULL) memcpy(&open_core, &symbol, sizeof symbol);
    if (open_core != NULL) {
      loaded = open_core(GPUPOOL_CORE_ABI, next_symbol, caller_of_current_call, stderr_takes_lines);
    }
  }
  if (loaded == NULL) {
    if (stderr_takes_lines()) {
      fprintf(stderr, "gpupool: cannot load %s (%s); CUDA calls go straight to the runtime, unpooled\n", core_path,
              problem != NULL ? problem : "unknown error");
    }
    pthread_once(&passthrough_once, fill_passthrough);
    loaded = &passthrough;
  }
  atomic_store_explicit(&core, loaded, memory_order_release);
}

static const struct gpupool_core* get_core(void) {
  const struct gpupool_core* c = atomic_load_explicit(&core, memory_order_acquire);
  if (c != NULL) return c;
  atomic_fetch_add(&core_loaders, 1);
  if (!atomic_load(&exiting)) pthread_once(&core_once, load_core);
  atomic_fetch_sub(&core_loaders, 1);
  c = atomic_load_explicit(&core, memory_order_acquire);
  if (c != NULL) return c;
  /* The process exits, and gpupool never served it: the runtime serves. */
  pthread_once(&passthrough_once, fill_passthrough);
  return &passthrough;
}

/* For driver_hook.c. */
__attribute__((visibility("hidden"))) const struct gpupool_core* gpupool_preload_core(void) { return get_core(); }

#define GPUPOOL_ENTRY(name, params, args)          \
  EXPORT cudaError_t name params {                 \
    current_caller = __builtin_return_address(0);  \
    return get_core()->name args;                  \
  }
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY

/* ------------------------------------------------- watched driver calls */

/* The driver's calls gpupool watches, called directly by a program or
   library linked with the driver: the driver's own (the same name past this
   library), with gpupool's books kept around it by the core's `watch`.
   cuStreamDestroy: gpupool's barriers stop naming the stream (on CUDA 13 a
   call naming a destroyed stream can crash the program).
   cuDevicePrimaryCtxReset: the pool forgets the memory the reset frees.
   cuMemFree, cuMemFreeAsync: memory gpupool lent goes back to its pool (CUDA
   lets either API free what the other allocated).
   cuIpcGetMemHandle: refused for a block gpupool lent whose handle would
   name other memory (its segment), as cudaIpcGetMemHandle refuses it.
   The destroy's and the reset's first versions do the same as their second.
   No core loaded: no runtime call reached gpupool, which then knows no
   stream and lent no memory. Each is named with its parameters and
   arguments, as in entry_points.def. */
#define WATCHED_DRIVER_CALLS(X)                                                                            \
  X(cuStreamDestroy_v2, (void* stream), (stream), driver_stream_destroy)                                   \
  X(cuStreamDestroy, (void* stream), (stream), driver_stream_destroy)                                      \
  X(cuDevicePrimaryCtxReset_v2, (int device), (device), driver_device_reset)                               \
  X(cuDevicePrimaryCtxReset, (int device), (device), driver_device_reset)                                  \
  X(cuMemFree_v2, (unsigned long long ptr), (ptr), driver_mem_free)                                        \
  X(cuMemFreeAsync, (unsigned long long ptr, void* stream), (ptr, stream), driver_mem_free_async)           \
  X(cuMemFreeAsync_ptsz, (unsigned long long ptr, void* stream), (ptr, stream), driver_mem_free_async_ptsz) \
  X(cuIpcGetMemHandle, (void* handle, unsigned long long ptr), (handle, ptr), driver_ipc_get_mem_handle)

/* The arguments with the driver's own function after them, for `watch`. */
#define WITH_REAL(...) (__VA_ARGS__, real)

/* The driver's capture calls, watched the same way; but a capture loads the
   core, as a runtime call would: one gpupool missed before the program's
   first runtime call would have its stream's requests served from the cache
   (the graph would write memory the pool lends again). */
#define WATCHED_DRIVER_CAPTURES(X)                                                                           \
  X(cuStreamBeginCapture, (void* stream), (stream), driver_begin_capture_v1)                                 \
  X(cuStreamBeginCapture_ptsz, (void* stream), (stream), driver_begin_capture_v1_ptsz)                       \
  X(cuStreamBeginCapture_v2, (void* stream, int mode), (stream, mode), driver_begin_capture)                 \
  X(cuStreamBeginCapture_v2_ptsz, (void* stream, int mode), (stream, mode), driver_begin_capture_ptsz)       \
  X(cuStreamBeginCaptureToGraph, CAPTURE_TO_GRAPH_PARAMS, CAPTURE_TO_GRAPH_ARGS, driver_begin_capture_to_graph) \
  X(cuStreamBeginCaptureToGraph_ptsz, CAPTURE_TO_GRAPH_PARAMS, CAPTURE_TO_GRAPH_ARGS,                         \
    driver_begin_capture_to_graph_ptsz)                                                                      \
  X(cuStreamEndCapture, (void* stream, void** graph), (stream, graph), driver_end_capture)                   \
  X(cuStreamEndCapture_ptsz, (void* stream, void** graph), (stream, graph), driver_end_capture_ptsz)
#define CAPTURE_TO_GRAPH_PARAMS \
  (void* stream, void* graph, const void* deps, const void* data, size_t count, int mode)
#define CAPTURE_TO_GRAPH_ARGS (stream, graph, deps, data, count, mode)

/* Each also under a local name, bound to this definition (see below). The
   core as `core_now` finds it: loaded already, or loaded now. */
#define WATCHED_DRIVER_FUNCTION(name, params, args, watch, core_now)                \
  EXPORT int name params {                                                           \
    int(*real) params = NULL;                                                        \
    void* found = next_symbol(#name);                                                \
    if (found == NULL) return 500; /* CUDA_ERROR_NOT_FOUND: no driver loaded */      \
    memcpy(&real, &found, sizeof found);                                             \
    const struct gpupool_core* c = core_now;                                         \
    if (c == NULL || c->watch == NULL) return real args;                             \
    return c->watch WITH_REAL args;                                                  \
  }                                                                                  \
  static int own_##name params __attribute__((alias(#name)));
#define WATCHED_DRIVER_CALL(name, params, args, watch) \
  WATCHED_DRIVER_FUNCTION(name, params, args, watch, atomic_load_explicit(&core, memory_order_acquire))
#define WATCHED_DRIVER_CAPTURE(name, params, args, watch) \
  WATCHED_DRIVER_FUNCTION(name, params, args, watch, get_core())
WATCHED_DRIVER_CALLS(WATCHED_DRIVER_CALL)
WATCHED_DRIVER_CAPTURES(WATCHED_DRIVER_CAPTURE)
#undef WATCHED_DRIVER_CALL
#undef WATCHED_DRIVER_CAPTURE

/* ----------------------------------------------------- exports looked up */

/* Each export under a local name, bound to this library's definition even
   where another object (a program linked with -rdynamic) exports the same
   name first. */
#define GPUPOOL_ENTRY(name, params, args) static cudaError_t own_##name params __attribute__((alias(#name)));
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY

/* For driver_hook.c: this library's export `name` (an intercepted runtime
   call, a watched driver call), or NULL where it has none. */
__attribute__((visibility("hidden"))) void* gpupool_export(const char* name) {
  void* found = NULL;
#define GPUPOOL_ENTRY(entry, params, args)   \
  if (strcmp(name, #entry) == 0) {           \
    cudaError_t(*f) params = own_##entry;    \
    memcpy(&found, &f, sizeof found);        \
    return found;                            \
  }
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
#define WATCHED_DRIVER_EXPORT(entry, params, args, watch) \
  if (strcmp(name, #entry) == 0) {                        \
    int(*f) params = own_##entry;                         \
    memcpy(&found, &f, sizeof found);                     \
    return found;                                         \
  }
  WATCHED_DRIVER_CALLS(WATCHED_DRIVER_EXPORT)
  WATCHED_DRIVER_CAPTURES(WATCHED_DRIVER_EXPORT)
#undef WATCHED_DRIVER_EXPORT
  return found;
}

/* For driver_hook.c: 1 where `address` lies in the core, whose lookups must
   find the runtime's own functions (a core given its own would call itself;
   this library's lookups of them all go through RTLD_NEXT). */
__attribute__((visibility("hidden"))) int gpupool_in_core(const void* address) {
  const void* core_at = atomic_load(&core_base);
  Dl_info there;
  return core_at != NULL && dladdr(address, &there) != 0 && there.dli_fbase == core_at;
}

/* ------------------------------------------------------------ lifecycle */

/* True when this process loaded the CUDA driver (libcuda), i.e. used CUDA. */
static int find_driver(struct dl_phdr_info* info, size_t size, void* found) {
  (void)size;
  if (info->dlpi_name != NULL && strstr(info->dlpi_name, "/libcuda.so") != NULL) *(int*)found = 1;
  return 0;
}

static int driver_loaded(void) {
  int driver = 0;
  dl_iterate_phdr(find_driver, &driver);
  return driver;
}

/* A forked child inherits the driver its parent loaded; the parent speaks for
   that use of CUDA. Only a child that loads the driver itself (CUDA may be
   used after fork only where the parent had not used it) is told. */
static int driver_at_fork;   /* in the parent, just before fork */
static int inherited_driver; /* in the child */

static void at_exit(void) {
  atomic_store(&exiting, 1);
  /* A second at most: the exit goes on, whatever happens. */
  for (int waited = 0; atomic_load(&core_loaders) != 0 && waited < 1000; ++waited) {
    const struct timespec millisecond = {0, 1000000};
    nanosleep(&millisecond, NULL);
  }
  const struct gpupool_core* c = atomic_load_explicit(&core, memory_order_acquire);
  if (c == NULL) {
    /* No call reached gpupool. If CUDA was used all the same (a program with
       the static runtime, or one allocating through the driver API), the
       core explains; otherwise nothing to do. (Loaded here, before
       _dl_fini: safe.) */
    if (inherited_driver || !driver_loaded()) return;
    pthread_once(&core_once, load_core);
    c = atomic_load_explicit(&core, memory_order_acquire);
  }
  if (c->at_exit != NULL) c->at_exit();
}

static void prepare_fork(void) {
  const struct gpupool_core* c = atomic_load_explicit(&core, memory_order_acquire);
  if (c == NULL) driver_at_fork = driver_loaded();
  if (c != NULL && c->prepare_fork != NULL) c->prepare_fork();
}
static void parent_after_fork(void) {
  const struct gpupool_core* c = atomic_load_explicit(&core, memory_order_acquire);
  if (c != NULL && c->parent_after_fork != NULL) c->parent_after_fork();
}
static void child_after_fork(void) {
  /* A thread loading the core is not in the child (glibc's pthread_once lets
     the child load it anew). */
  atomic_store(&core_loaders, 0);
  const struct gpupool_core* c = atomic_load_explicit(&core, memory_order_acquire);
  inherited_driver = c == NULL && driver_at_fork;
  if (c != NULL && c->child_after_fork != NULL) c->child_after_fork();
}

/* The core's path, fixed now: a relative LD_PRELOAD path would mean another
   file once the program changes its working directory. */
static void find_core_path(void) {
  Dl_info self;
  char folder[PATH_MAX];
  if (dladdr(core_path, &self) == 0 || self.dli_fname == NULL) return;
  const char* path = self.dli_fname;
  if (path[0] != '/' && realpath(self.dli_fname, folder) != NULL) path = folder;
  const char* slash = strrchr(path, '/');
  const int dir_length = slash != NULL ? (int)(slash - path) : 1;
  snprintf(core_path, sizeof core_path, "%.*s/libgpupool-core.so", dir_length, slash != NULL ? path : ".");
}

/* Registered when the library loads, before the program's own static
   constructors: so the exit handler runs after their destructors, and frees
   made there are counted before the report is written. */
__attribute__((constructor)) static void on_load(void) {
  note_stderr_at_start();
  find_core_path();
  atexit(at_exit);
  pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
}
