/* How a program built with nvcc's default static runtime reaches gpupool. Its
   runtime has no cudaMalloc symbol to interpose: it opens the driver, asks
   dlsym for cuGetProcAddress_v2 and fetches every driver entry point through
   it (about 440 at start-up with CUDA 13). So this library exports dlsym; for
   that one name, asked from the program itself, it hands out its own
   cuGetProcAddress, which lets the core swap in its allocation entry points
   (driver_entry_points.cpp; only with static_runtime:1). Asked from another
   library, one that only swaps in the calls the core watches (its stream
   destroy, reset, frees, IPC handle, captures), unless static_runtime_libraries
   names the library. A library that
   fetches each driver function with dlsym by its exported name instead
   (XLA's CUDA stubs) gets the core's for those names. And a program that
   fetches the shared runtime's calls by name from the runtime (ctypes)
   gets this library's entry points, as a program linked to it does.

   dlsym(RTLD_NEXT, ...) resolves relative to its caller, found from the
   return address. So the exported dlsym is a few instructions that ask the
   hook and otherwise *jump* to the real dlsym with the stack and the link
   register as the caller left them: the real one sees the caller's return
   address, not ours. x86-64 and AArch64 (Grace) only; elsewhere nothing is
   exported and such programs stay unpooled. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

#include "shim/core_interface.h"

#if (defined(__x86_64__) || defined(__aarch64__)) && defined(__GLIBC__)

/* The driver's signatures, without cuda.h (it renames cuGetProcAddress). */
typedef int (*get_proc_address_v1_fn)(const char*, void**, int, unsigned long long);
typedef int (*get_proc_address_v2_fn)(const char*, void**, int, unsigned long long, int*);
enum { kDriverNotInitialized = 3, kDriverNotFound = 500 };

const struct gpupool_core* gpupool_preload_core(void);
void* gpupool_export(const char* name);
int gpupool_in_core(const void* address);

/* The hook's answers: NULL, the real dlsym answers; NOT_FOUND, the lookup
   returns NULL (dlerror set by a lookup the hook made); else its answer. */
#define NOT_FOUND ((void*)1)

/* Read by the jump below; set before the hook returns. */
__attribute__((visibility("hidden"))) void* gpupool_real_dlsym;
__attribute__((visibility("hidden"))) void* gpupool_dlsym_hook(void* handle, const char* name, void* caller);

static get_proc_address_v1_fn real_v1; /* read and written with __atomic builtins */
static get_proc_address_v2_fn real_v2;

#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    "dlsym:\n"
    "  .cfi_startproc\n"
    "  pushq %rdi\n"
    "  .cfi_adjust_cfa_offset 8\n"
    "  pushq %rsi\n"
    "  .cfi_adjust_cfa_offset 8\n"
    "  subq $8, %rsp\n" /* 16-byte aligned for the call */
    "  .cfi_adjust_cfa_offset 8\n"
    "  movq 24(%rsp), %rdx\n" /* the caller's return address */
    "  call gpupool_dlsym_hook\n"
    "  addq $8, %rsp\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  popq %rsi\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  popq %rdi\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  testq %rax, %rax\n"
    "  jz 1f\n"
    "  cmpq $1, %rax\n" /* NOT_FOUND: the lookup finds nothing */
    "  jne 2f\n"
    "  xorl %eax, %eax\n"
    "2:\n"
    "  ret\n"
    "1:\n"
    "  jmpq *gpupool_real_dlsym(%rip)\n"
    "  .cfi_endproc\n"
    ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
/* `hint #34` is BTI's landing pad (a no-op without BTI): dlsym is reached by
   an indirect branch from the caller's PLT. x16, the register PLTs and
   veneers use, carries the hook's answer and the jump. */
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, %function\n"
    ".p2align 2\n"
    "dlsym:\n"
    "  .cfi_startproc\n"
    "  hint #34\n"
    "  stp x29, x30, [sp, #-32]!\n"
    "  .cfi_def_cfa_offset 32\n"
    "  .cfi_offset 29, -32\n"
    "  .cfi_offset 30, -24\n"
    "  mov x29, sp\n"
    "  stp x0, x1, [sp, #16]\n"
    "  mov x2, x30\n" /* the caller's return address */
    "  bl gpupool_dlsym_hook\n"
    "  mov x16, x0\n"
    "  ldp x0, x1, [sp, #16]\n"
    "  ldp x29, x30, [sp], #32\n"
    "  .cfi_restore 29\n"
    "  .cfi_restore 30\n"
    "  .cfi_def_cfa_offset 0\n"
    "  cbz x16, 1f\n"
    "  cmp x16, #1\n" /* NOT_FOUND: the lookup finds nothing */
    "  csel x0, xzr, x16, eq\n"
    "  ret\n"
    "1:\n"
    "  adrp x16, gpupool_real_dlsym\n"
    "  ldr x16, [x16, :lo12:gpupool_real_dlsym]\n"
    "  br x16\n"
    "  .cfi_endproc\n"
    ".size dlsym, .-dlsym\n");
#endif

/* The hook runs at the first dlsym of the process, which may come before a
   sanitizer's runtime has started (sanitizer builds preload it first): nothing
   on that path may be instrumented or call an intercepted function. */
#define EARLY __attribute__((no_sanitize("address", "thread", "undefined")))

/* Function and object pointers are the same size here; ISO C has no cast
   between them. */
union Pointer {
  void* object;
  void (*function)(void);
  void* (*lookup)(void*, const char*);
  get_proc_address_v1_fn v1;
  get_proc_address_v2_fn v2;
};
#define AS_OBJECT(f) as_object((void (*)(void))(f))
EARLY static void* as_object(void (*f)(void)) {
  union Pointer p = {.function = f};
  return p.object;
}
EARLY static get_proc_address_v1_fn as_v1(void* object) {
  union Pointer p = {.object = object};
  return p.v1;
}
EARLY static get_proc_address_v2_fn as_v2(void* object) {
  union Pointer p = {.object = object};
  return p.v2;
}
EARLY static int same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}
EARLY static int starts_with(const char* s, const char* prefix) {
  while (*prefix != '\0' && *s == *prefix) ++s, ++prefix;
  return *prefix == '\0';
}

/* The driver entry points the core may swap for its own (the allocation,
   memory pool, stream, capture, IPC, reset and peer-access calls), by their
   names' starts. */
EARLY static int swappable(const char* name) {
  return starts_with(name, "cuMem") || starts_with(name, "cuStream") || starts_with(name, "cuIpc") ||
         starts_with(name, "cuDevicePrimaryCtx") || starts_with(name, "cuDeviceSetMemPool") ||
         same(name, "cuCtxEnablePeerAccess") || same(name, "cuCtxDisablePeerAccess");
}

/* Where no real dlsym can be found (no glibc symbol versions): nothing found. */
static void* no_dlsym(void* handle, const char* name) {
  (void)handle;
  (void)name;
  return NULL;
}

EARLY static void resolve_real_dlsym(void) {
  void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (f == NULL) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"); /* x86-64 before glibc 2.34 */
  if (f == NULL) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");  /* AArch64 before glibc 2.34 */
  if (f == NULL) f = AS_OBJECT(no_dlsym);
  __atomic_store_n(&gpupool_real_dlsym, f, __ATOMIC_RELEASE);
}

EARLY static void* real_dlsym(void* handle, const char* name) {
  union Pointer p = {.object = __atomic_load_n(&gpupool_real_dlsym, __ATOMIC_ACQUIRE)};
  return p.lookup(handle, name);
}

/* Whose static runtime asks: the program's (its object comes first in the
   link map), or a library's that static_runtime_libraries names (1). Any
   other library's own cuGetProcAddress only watches (2; see
   substitute_watched), and NCCL's and libcudart's are left alone (0): NCCL's
   memory may be shared over IPC. Only lookups of driver functions get here,
   never during a sanitizer's start, so loading the core is safe. */
EARLY static int taken_over(void* caller, const char* name) {
  Dl_info info;
  struct link_map* map = NULL;
  if (dladdr1(caller, &info, (void**)&map, RTLD_DL_LINKMAP) == 0 || map == NULL) return 0;
  if (map->l_prev == NULL) return 1;
  const struct gpupool_core* core = gpupool_preload_core();
  return core->driver_library_accepted != NULL ? core->driver_library_accepted(map->l_name, name) : 0;
}

/* For the core: the real driver's entry point `symbol` at `version`. */
static int lookup_driver(const char* symbol, void** pfn, int version, unsigned long long flags) {
  get_proc_address_v2_fn v2 = __atomic_load_n(&real_v2, __ATOMIC_ACQUIRE);
  if (v2 != NULL) return v2(symbol, pfn, version, flags, NULL);
  get_proc_address_v1_fn v1 = __atomic_load_n(&real_v1, __ATOMIC_ACQUIRE);
  if (v1 != NULL) return v1(symbol, pfn, version, flags);
  return kDriverNotInitialized;
}

static int hooked_v1(const char* symbol, void** pfn, int version, unsigned long long flags);
static int hooked_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status);
static int watching_v1(const char* symbol, void** pfn, int version, unsigned long long flags);
static int watching_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status);

/* What a lookup through gpupool's cuGetProcAddress gets for an entry point
   the driver found: through the program's (hooked_v1, _v2), what the core's
   driver_entry gives; through a library's (watching_v1, _v2), gpupool's
   function for a watched call (stream destroy, reset, frees, IPC handle,
   captures) only, never one that takes a call over. cuGetProcAddress fetched
   through either is the same kind again: later lookups through the fetched
   copy must come here too. */
static void substitute(const char* symbol, void** pfn, int version, unsigned long long flags, int watching_only) {
  if (symbol == NULL || pfn == NULL || *pfn == NULL) return;
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      __atomic_store_n(&real_v2, as_v2(*pfn), __ATOMIC_RELEASE);
      *pfn = watching_only ? AS_OBJECT(watching_v2) : AS_OBJECT(hooked_v2);
    } else {
      __atomic_store_n(&real_v1, as_v1(*pfn), __ATOMIC_RELEASE);
      *pfn = watching_only ? AS_OBJECT(watching_v1) : AS_OBJECT(hooked_v1);
    }
    return;
  }
  if (!swappable(symbol)) return;
  const struct gpupool_core* core = gpupool_preload_core();
  if (watching_only) {
    if (core->watched_driver_entry != NULL) *pfn = core->watched_driver_entry(symbol, version, flags, *pfn);
  } else if (core->driver_entry != NULL) {
    *pfn = core->driver_entry(symbol, version, flags, *pfn, lookup_driver);
  }
}

static int through_v1(const char* symbol, void** pfn, int version, unsigned long long flags, int watching_only) {
  get_proc_address_v1_fn real = __atomic_load_n(&real_v1, __ATOMIC_ACQUIRE);
  if (real == NULL) return kDriverNotFound;
  const int result = real(symbol, pfn, version, flags);
  if (result == 0) substitute(symbol, pfn, version, flags, watching_only);
  return result;
}

static int through_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status,
                      int watching_only) {
  get_proc_address_v2_fn real = __atomic_load_n(&real_v2, __ATOMIC_ACQUIRE);
  if (real == NULL) return kDriverNotFound;
  const int result = real(symbol, pfn, version, flags, status);
  if (result == 0) substitute(symbol, pfn, version, flags, watching_only);
  return result;
}

static int hooked_v1(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return through_v1(symbol, pfn, version, flags, 0);
}
static int hooked_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  return through_v2(symbol, pfn, version, flags, status, 0);
}
static int watching_v1(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return through_v1(symbol, pfn, version, flags, 1);
}
static int watching_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  return through_v2(symbol, pfn, version, flags, status, 1);
}

/* A driver function fetched by its exported name, as XLA's CUDA stubs fetch
   each one: the core's instead, if it is one the core swaps. The core makes
   its own driver calls through the real cuGetProcAddress, found here. */
static void* by_name(void* handle, const char* name, void* real) {
  if (__atomic_load_n(&real_v2, __ATOMIC_ACQUIRE) == NULL && __atomic_load_n(&real_v1, __ATOMIC_ACQUIRE) == NULL) {
    void* get = real_dlsym(handle, "cuGetProcAddress_v2");
    if (get == NULL) return real;
    __atomic_store_n(&real_v2, as_v2(get), __ATOMIC_RELEASE);
  }
  const struct gpupool_core* core = gpupool_preload_core();
  return core->driver_symbol != NULL ? core->driver_symbol(name, real, lookup_driver) : real;
}

/* A lookup that found this library's export `name` (the global scope's
   first) stands for it where there is a function behind it (`behind`): the
   runtime's call gpupool passes on, the driver's stream destroy. Where there
   is none (no runtime or driver loaded yet, a runtime older than the call),
   it answers as the scope past this library does: nothing, mostly. So a
   program that probes for CUDA or for one of its calls is not misled, and
   does not call gpupool with no runtime to pass the call on to. */
static void* export_found(const char* name, int behind) {
  if (behind) return NULL;
  void* past = real_dlsym(RTLD_NEXT, name); /* where nothing, dlerror says so */
  return past != NULL ? past : NOT_FOUND;
}

/* A runtime call looked up by name. Found in the runtime gpupool passes calls
   on to (ctypes' CDLL("libcudart.so.12").cudaMalloc, the cudart stubs of XLA
   and TensorFlow, any program that opens the runtime itself): this library's
   entry point, which a program linked against the runtime reaches. Found as
   this library's own: see export_found. Left as found: the core's own
   lookups, RTLD_NEXT (an interposer's way past itself), and a function of
   that name in any other library (a second runtime, a wrapper), which gpupool
   does not pass calls on to. Only names starting "cuda" come here, never
   during a sanitizer's start. */
static void* runtime_by_name(void* handle, const char* name, void* caller) {
  void* ours = gpupool_export(name);
  if (ours == NULL || handle == RTLD_NEXT || gpupool_in_core(caller)) return NULL;
  void* found = real_dlsym(handle, name);
  if (found == NULL) return NULL;
  const struct gpupool_core* core = gpupool_preload_core();
  if (core->real_function == NULL) return NULL;
  const void* real = core->real_function(name);
  if (found == ours) return export_found(name, real != NULL);
  return found == real ? ours : NULL;
}

/* The driver's watched calls (stream destroy, device reset, frees, IPC
   handle), which this library exports (they keep gpupool's books
   themselves), looked up where this library's come first (the global
   scope): 1. The answer is then as in
   export_found, with the scope's driver behind it: this library's, never
   watched again (its books would be kept twice). */
static int own_driver_export_first(void* handle, const char* name) {
  void* ours = gpupool_export(name); /* of the driver's names, only the watched calls */
  return ours != NULL && handle != RTLD_NEXT && real_dlsym(handle, name) == ours;
}

EARLY void* gpupool_dlsym_hook(void* handle, const char* name, void* caller) {
  if (__atomic_load_n(&gpupool_real_dlsym, __ATOMIC_ACQUIRE) == NULL) resolve_real_dlsym();
  /* Every name not of CUDA: straight on (two comparisons). */
  if (name == NULL || name[0] != 'c' || name[1] != 'u') return NULL;
  if (name[2] == 'd' && name[3] == 'a') return runtime_by_name(handle, name, caller);
  const int v2 = same(name, "cuGetProcAddress_v2");
  const int get_proc_address = v2 || same(name, "cuGetProcAddress");
  if (!get_proc_address && !swappable(name)) return NULL;
  if (own_driver_export_first(handle, name)) {
    return real_dlsym(RTLD_NEXT, name) != NULL ? NULL : NOT_FOUND; /* where nothing, dlerror says so */
  }
  const int accepted = handle == RTLD_NEXT ? 0 : taken_over(caller, name);
  if (!accepted) return NULL;
  void* real = real_dlsym(handle, name);
  if (real == NULL) return NULL;
  if (!get_proc_address) return by_name(handle, name, real);
  const int watching_only = accepted == 2;
  if (v2) {
    __atomic_store_n(&real_v2, as_v2(real), __ATOMIC_RELEASE);
    return watching_only ? AS_OBJECT(watching_v2) : AS_OBJECT(hooked_v2);
  }
  __atomic_store_n(&real_v1, as_v1(real), __ATOMIC_RELEASE);
  return watching_only ? AS_OBJECT(watching_v1) : AS_OBJECT(hooked_v1);
}

#endif
