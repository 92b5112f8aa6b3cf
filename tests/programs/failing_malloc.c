/* Makes allocations of libgpupool-core.so fail, for test-host-oom: std::bad_alloc
   and null returns inside gpupool, as when the host runs out of memory, while
   the program, the simulated runtime and the C library allocate as usual.
   Preloaded ahead of libgpupool.so; the program arms it through dlsym. An
   allocation is the core's when it is called from the core's code (its
   operator new is linked in: -static-libstdc++). */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);

static uintptr_t core_begin, core_end;
static atomic_int armed;
static atomic_long counted; /* the core's allocations since arming */
static atomic_long failed;
static long fail_from;      /* the first to fail, counted from 1 */
static int fail_all;        /* 0: that one only; 1: every one from then on */

static int find_core(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  if (info->dlpi_name == NULL || strstr(info->dlpi_name, "/libgpupool-core.so") == NULL) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      core_begin = info->dlpi_addr + ph->p_vaddr;
      core_end = core_begin + ph->p_memsz;
    }
  }
  return 1;
}

/* 0 when the core is not loaded (the program made no intercepted call yet). */
__attribute__((visibility("default"))) int failing_malloc_arm(long first, int all) {
  dl_iterate_phdr(find_core, NULL);
  if (core_begin == 0) return 0;
  fail_from = first;
  fail_all = all;
  atomic_store(&counted, 0);
  atomic_store(&failed, 0);
  atomic_store(&armed, 1);
  return 1;
}

/* Stops failing; the core's allocations counted since arming. */
__attribute__((visibility("default"))) long failing_malloc_disarm(long* failures) {
  atomic_store(&armed, 0);
  *failures = atomic_load(&failed);
  return atomic_load(&counted);
}

static int fails(void* caller) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed)) return 0;
  const uintptr_t at = (uintptr_t)caller;
  if (at < core_begin || at >= core_end) return 0;
  const long n = atomic_fetch_add(&counted, 1) + 1;
  if (fail_from <= 0 || n < fail_from || (n > fail_from && !fail_all)) return 0;
  atomic_fetch_add(&failed, 1);
  errno = ENOMEM;
  return 1;
}

__attribute__((visibility("default"))) void* malloc(size_t n) {
  return fails(__builtin_return_address(0)) ? NULL : __libc_malloc(n);
}
__attribute__((visibility("default"))) void* calloc(size_t count, size_t n) {
  return fails(__builtin_return_address(0)) ? NULL : __libc_calloc(count, n);
}
__attribute__((visibility("default"))) void* realloc(void* p, size_t n) {
  return fails(__builtin_return_address(0)) ? NULL : __libc_realloc(p, n);
}
__attribute__((visibility("default"))) void* aligned_alloc(size_t alignment, size_t n) {
  return fails(__builtin_return_address(0)) ? NULL : __libc_memalign(alignment, n);
}
__attribute__((visibility("default"))) void* memalign(size_t alignment, size_t n) {
  return fails(__builtin_return_address(0)) ? NULL : __libc_memalign(alignment, n);
}
__attribute__((visibility("default"))) int posix_memalign(void** out, size_t alignment, size_t n) {
  if (fails(__builtin_return_address(0))) return ENOMEM;
  void* p = __libc_memalign(alignment, n);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}
