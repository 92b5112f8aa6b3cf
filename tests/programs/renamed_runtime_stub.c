/* Only its name matters: test-hidden-runtime-user links against it, so that
   its dependency reads libsimrt-1a2b.so; the tests put a copy of the
   simulated runtime by that name where the loader looks first. */
typedef int renamed_runtime_stub;
