/* A program that links no CUDA runtime and opens one itself, fetching its
   calls with dlsym(handle, name), as Python's ctypes and the cudart stubs of
   XLA and TensorFlow do.

     runtime_by_name RUNTIME NEXT OTHER
       RUNTIME  the runtime's file name (libcudart.so.13), opened RTLD_LOCAL
       NEXT     a library linked against it (runtime_next.c), opened
                RTLD_GLOBAL at the end, whose runtime_next(name) asks
                dlsym(RTLD_NEXT, name), as an interposer finds the function
                past itself
       OTHER    another library that defines cudaMalloc (a second runtime)
     Makes 32 rounds of two cudaMalloc blocks and two cudaMallocAsync blocks
     (on a stream it made), four sizes, each block filled with its own byte
     and checked while the others are held, then freed. Prints
     {"from_runtime": [the fetched names whose function lies in RUNTIME],
      "next_from_runtime": 1 where NEXT's RTLD_NEXT lookup found RUNTIME's
      cudaMalloc, "other_own": 1 where OTHER's cudaMalloc fetched by name is
      OTHER's own, "blocks": the blocks made}; exits 0 when every call
     succeeded and every block held its bytes, 1 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

typedef int cuda_error; /* cudaError_t, without the runtime's headers */

static const char* const kFetched[] = {"cudaMalloc",       "cudaFree",          "cudaMallocAsync",
                                       "cudaFreeAsync",    "cudaStreamCreate",  "cudaStreamDestroy",
                                       "cudaGetLastError", "cudaStreamSynchronize"};
enum { kNames = sizeof kFetched / sizeof kFetched[0] };

static void* fetched[kNames];

/* 1 where `f` lies in the library `handle` names. */
static int lies_in(void* handle, void* f) {
  struct link_map* map = NULL;
  Dl_info where;
  if (f == NULL || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || dladdr(f, &where) == 0) return 0;
  return where.dli_fname != NULL && strcmp(where.dli_fname, map->l_name) == 0;
}

/* Every 64th byte and the last: a block overlapping another holds the other's
   byte in some cache line of it (and the whole check stays quick under TSan). */
static int filled(const unsigned char* block, size_t size, unsigned char byte) {
  for (size_t i = 0; i < size; i += 64) {
    if (block[i] != byte) return 0;
  }
  return block[size - 1] == byte;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: runtime_by_name RUNTIME NEXT OTHER\n");
    return 2;
  }
  void* runtime = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* other = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
  if (runtime == NULL || other == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  for (int i = 0; i < kNames; ++i) {
    fetched[i] = dlsym(runtime, kFetched[i]);
    if (fetched[i] == NULL) {
      fprintf(stderr, "%s: %s\n", kFetched[i], dlerror());
      return 1;
    }
  }
  cuda_error (*malloc_fn)(void**, size_t);
  cuda_error (*free_fn)(void*);
  cuda_error (*malloc_async_fn)(void**, size_t, void*);
  cuda_error (*free_async_fn)(void*, void*);
  cuda_error (*stream_create_fn)(void**);
  cuda_error (*stream_destroy_fn)(void*);
  cuda_error (*get_last_fn)(void);
  cuda_error (*synchronize_fn)(void*);
  memcpy(&malloc_fn, &fetched[0], sizeof fetched[0]);
  memcpy(&free_fn, &fetched[1], sizeof fetched[1]);
  memcpy(&malloc_async_fn, &fetched[2], sizeof fetched[2]);
  memcpy(&free_async_fn, &fetched[3], sizeof fetched[3]);
  memcpy(&stream_create_fn, &fetched[4], sizeof fetched[4]);
  memcpy(&stream_destroy_fn, &fetched[5], sizeof fetched[5]);
  memcpy(&get_last_fn, &fetched[6], sizeof fetched[6]);
  memcpy(&synchronize_fn, &fetched[7], sizeof fetched[7]);

  const int other_own = lies_in(other, dlsym(other, "cudaMalloc"));

  int ok = 1;
  int blocks = 0;
  void* stream = NULL;
  ok = ok && stream_create_fn(&stream) == 0;
  static const size_t kSizes[] = {512, 100000, 3u << 20, 12u << 20};
  for (int round = 0; round < 32 && ok; ++round) {
    const size_t size = kSizes[round % 4];
    void* held[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4 && ok; ++i) {
      ok = (i < 2 ? malloc_fn(&held[i], size) : malloc_async_fn(&held[i], size, stream)) == 0;
      if (!ok) break;
      ++blocks;
      ok = synchronize_fn(stream) == 0;
      memset(held[i], round * 4 + i, size);
    }
    for (int i = 0; i < 4 && ok; ++i) ok = filled(held[i], size, (unsigned char)(round * 4 + i));
    for (int i = 0; i < 4; ++i) {
      if (held[i] != NULL && (i < 2 ? free_fn(held[i]) : free_async_fn(held[i], stream)) != 0) ok = 0;
    }
  }
  ok = ok && synchronize_fn(stream) == 0 && stream_destroy_fn(stream) == 0 && get_last_fn() == 0;

  /* Now global, with the runtime (its dependency): RTLD_NEXT from
     gpupool's library too would find the runtime's cudaMalloc there. */
  void* next = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
  void* (*runtime_next)(const char*) = NULL;
  void* f = next != NULL ? dlsym(next, "runtime_next") : NULL;
  memcpy(&runtime_next, &f, sizeof f);
  const int next_from_runtime = runtime_next != NULL && lies_in(runtime, runtime_next("cudaMalloc"));

  printf("{\"from_runtime\": [");
  const char* separator = "";
  for (int i = 0; i < kNames; ++i) {
    if (!lies_in(runtime, fetched[i])) continue;
    printf("%s\"%s\"", separator, kFetched[i]);
    separator = ", ";
  }
  printf("], \"next_from_runtime\": %d, \"other_own\": %d, \"blocks\": %d}\n", next_from_runtime, other_own, blocks);
  return ok ? 0 : 1;
}
