/* Only its name matters: a test-hidden-*-user library links against it, so
   that its dependency reads that name (libsimrt-1a2b.so); the tests put a
   copy of the simulated runtime by that name where the loader looks first. */
typedef int renamed_runtime_stub;
