/* What dlsym(RTLD_DEFAULT, name) finds, as a program probes for CUDA or for
   one of its calls, for each name gpupool exports (entry_points.def and the
   driver's stream destroys), after opening each RUNTIME in turn with
   RTLD_GLOBAL, probing all after each.

     global_lookups none|RUNTIME...
       prints the last probe: {"found": [the names found], "unexplained":
       [the names not found for which dlerror() said nothing]} */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char* const kNames[] = {
#define GPUPOOL_ENTRY(name, params, args) #name,
#include "shim/entry_points.def"
#undef GPUPOOL_ENTRY
    "cuStreamDestroy", "cuStreamDestroy_v2"};
enum { kCount = sizeof kNames / sizeof kNames[0] };

static void print_list(const char* key, const int* listed) {
  printf("\"%s\": [", key);
  const char* separator = "";
  for (int i = 0; i < kCount; ++i) {
    if (!listed[i]) continue;
    printf("%s\"%s\"", separator, kNames[i]);
    separator = ", ";
  }
  printf("]");
}

static int found[kCount];
static int unexplained[kCount];

static void probe(void) {
  for (int i = 0; i < kCount; ++i) {
    dlerror();
    found[i] = dlsym(RTLD_DEFAULT, kNames[i]) != NULL;
    unexplained[i] = !found[i] && dlerror() == NULL;
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: global_lookups none|RUNTIME...\n");
    return 2;
  }
  probe();
  for (int i = 1; i < argc && strcmp(argv[i], "none") != 0; ++i) {
    if (dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL) == NULL) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    probe();
  }
  printf("{");
  print_list("found", found);
  printf(", ");
  print_list("unexplained", unexplained);
  printf("}\n");
  return 0;
}
