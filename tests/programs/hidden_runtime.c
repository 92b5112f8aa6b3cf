/* A program that links no CUDA runtime and loads LIB (hidden_runtime_user.c)
   RTLD_LOCAL, whose renamed runtime only LIB's own scope reaches.

     hidden_runtime LIB [probe | probe-next]
       prints {"probe": [...], "step": N, "error": E}; exit 0 when every step
       passed. probe: first calls whatever cudaMalloc, cudaStreamCreate,
       cudaGetLastError, cudaFree and cudaGetLastError again the global
       scope has (dlsym(RTLD_DEFAULT, ...): nothing, with no runtime loaded
       yet), and lists what each returned ([] where there are none).
       probe-next: the same with dlsym(RTLD_NEXT, ...), which finds
       gpupool's exports past the program whatever is loaded. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int cuda_error; /* cudaError_t, without the runtime's headers */

/* A function of the global scope (or of the scope past the program), or NULL. */
static void* scope;
static void* global(const char* name) {
  void* volatile found = dlsym(scope, name); /* not a tail call: the caller must be the program */
  return found;
}

static void probe(void) {
  cuda_error (*malloc_fn)(void**, size_t) = NULL;
  cuda_error (*stream_create_fn)(void**) = NULL;
  cuda_error (*get_last_fn)(void) = NULL;
  cuda_error (*free_fn)(void*) = NULL;
  void* f = global("cudaMalloc");
  memcpy(&malloc_fn, &f, sizeof f);
  f = global("cudaStreamCreate");
  memcpy(&stream_create_fn, &f, sizeof f);
  f = global("cudaGetLastError");
  memcpy(&get_last_fn, &f, sizeof f);
  f = global("cudaFree");
  memcpy(&free_fn, &f, sizeof f);
  printf("\"probe\": [");
  if (malloc_fn != NULL && stream_create_fn != NULL && get_last_fn != NULL && free_fn != NULL) {
    void* block = NULL;
    void* stream = NULL;
    const cuda_error allocated = malloc_fn(&block, 4096);
    const cuda_error created = stream_create_fn(&stream);
    const cuda_error last = get_last_fn();
    const cuda_error freed = free_fn(block);
    const cuda_error last_again = get_last_fn();
    printf("%d, %d, %d, %d, %d", allocated, created, last, freed, last_again);
  }
  printf("], ");
}

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && (strcmp(argv[2], "probe") == 0 || strcmp(argv[2], "probe-next") == 0))) {
    fprintf(stderr, "usage: hidden_runtime LIB [probe | probe-next]\n");
    return 2;
  }
  printf("{");
  scope = argc == 3 && strcmp(argv[2], "probe-next") == 0 ? RTLD_NEXT : RTLD_DEFAULT;
  if (argc == 3) probe();
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  int (*exercise)(cuda_error*) = NULL;
  void* f = dlsym(library, "hidden_runtime_exercise");
  memcpy(&exercise, &f, sizeof f);
  if (exercise == NULL) {
    fprintf(stderr, "hidden_runtime_exercise: %s\n", dlerror());
    return 1;
  }
  cuda_error error = 0;
  const int step = exercise(&error);
  printf("\"step\": %d, \"error\": %d}\n", step, error);
  return step == 0 ? 0 : 1;
}
