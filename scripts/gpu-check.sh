#!/usr/bin/env bash
# gpu-check.sh: every GPU test, one summary. Needs a GPU, nvcc and a built
# gpupool (build/, made here with `cmake --build --preset default` or carried
# over); finishes in a few minutes on an H200. Exit 0: all passed; 1: a check
# failed; 77: no GPU here (nothing was run).
#
#   scripts/gpu-check.sh [OUTDIR]      (reports and logs go to OUTDIR, default build/gpu-check)
#   scripts/gpu-check.sh --build-only OUTDIR   only builds the programs it
#                      compiles with nvcc (no GPU needed; the tests do, so
#                      that a lent GPU's minutes are not lost to a build
#                      error). 77: no nvcc here.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
out=${1:-build/gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "$build_only" = 1 ] && [ ! -x "$nvcc" ]; then
  echo "gpu-check: no nvcc here; nothing built"
  exit 77
fi
# The toolkit's headers, for the programs built with cc. The nvcc on PATH may
# be a wrapper script outside the toolkit (/usr/local/bin/nvcc execs the real
# one on some images), so nvcc itself says where its toolkit is.
cuda_top=$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
cuda_include=${cuda_top:-$(dirname "$nvcc")/..}/include
if [ "$build_only" = 0 ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU here; nothing run"
  exit 77
fi
cudalib=""
for d in ${cuda_top:+"$cuda_top/lib64"} /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -e "$d/libcudart.so.13" ] && cudalib=$d && break; done
if [ -z "$cudalib" ]; then
  cudalib=$(python3 -c "import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))" 2>/dev/null || true)
fi
export LD_LIBRARY_PATH="${cudalib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ "$build_only" = 0 ] && [ ! -f build/lib/libgpupool.so ]; then
  echo "gpu-check: building gpupool"
  cmake --preset default >/dev/null && cmake --build --preset default >/dev/null || { echo "gpu-check: build failed"; exit 1; }
fi
lib=$root/build/lib/libgpupool.so

results=()
failed=0
record() {  # name status detail
  results+=("$(printf '%-58s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=1
  printf '%-58s %-5s %s\n' "$1" "$2" "$3"
}
# run NAME EXPECTED-EXITS ENV... -- COMMAND...   (EXPECTED-EXITS: one code, or several, "0 2")
run() {
  local name=$1 expect=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local log
  log="$out/$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
  local start=$SECONDS
  # A hang must not eat the GPU lease: each program gets $GPU_CHECK_TIMEOUT s.
  timeout --kill-after=5 "${GPU_CHECK_TIMEOUT:-120}" env "${envs[@]}" "$@" >"$log" 2>&1
  local code=$?
  local took=$((SECONDS - start))s
  if [[ " $expect " == *" $code "* ]]; then record "$name" PASS "$took (exit $code)"
  elif [ "$code" = 124 ] || [ "$code" = 137 ]; then record "$name" FAIL "timed out after $took ($log)"
  else record "$name" FAIL "exit $code, expected $expect ($log)"; fi
  return 0
}

echo "== building the GPU test programs"
arch=-arch=native
"$nvcc" $arch -O2 -cudart shared -o "$out/hazards_gpu" tests/gpu/hazards_gpu.cu -ldl -lcuda 2>"$out/nvcc.log" ||
  { arch=-arch=sm_90; "$nvcc" $arch -O2 -cudart shared -o "$out/hazards_gpu" tests/gpu/hazards_gpu.cu -ldl -lcuda 2>>"$out/nvcc.log"; } ||
  { echo "gpu-check: nvcc failed ($out/nvcc.log)"; exit 1; }
"$nvcc" $arch -O2 -cudart shared -o "$out/user_program" tests/gpu/user_program.cu 2>>"$out/nvcc.log" ||
  { echo "gpu-check: nvcc failed ($out/nvcc.log)"; exit 1; }
# nvcc's default: the CUDA runtime linked in, out of the preload's reach.
"$nvcc" $arch -O2 -o "$out/user_program_static" tests/gpu/user_program.cu 2>>"$out/nvcc.log" ||
  { echo "gpu-check: nvcc failed ($out/nvcc.log)"; exit 1; }
"$nvcc" $arch -O2 -o "$out/hazards_gpu_static" tests/gpu/hazards_gpu.cu -ldl -lcuda 2>>"$out/nvcc.log" ||
  { echo "gpu-check: nvcc failed ($out/nvcc.log)"; exit 1; }
# Integration programs with the static runtime, for static_runtime:1 (built
# side by side: nvcc takes a while for each). Some call the driver directly.
pids=()
for program in lifecycle capture patterns pitched threads stress devices meminfo; do
  "$nvcc" $arch -O2 -std=c++20 -I. -x cu -o "$out/${program}_static" "tests/programs/$program.cpp" -lcuda \
    2>"$out/nvcc-$program.log" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "gpu-check: nvcc failed ($out/nvcc-*.log)"; exit 1; }; done
# The same user program inside a library with its own static runtime (what
# CMake builds by default), loaded by a program that knows no CUDA.
printf '%s\n' '#define main user_main' "#include \"$root/tests/gpu/user_program.cu\"" '#undef main' \
  'extern "C" int user_program_main() { return user_main(); }' >"$out/user_library.cu"
"$nvcc" $arch -O2 -shared -Xcompiler -fPIC -o "$out/libuser_static.so" "$out/user_library.cu" \
  2>>"$out/nvcc.log" || { echo "gpu-check: nvcc failed ($out/nvcc.log)"; exit 1; }
printf '%s\n' '#include <dlfcn.h>' '#include <stdio.h>' \
  'int main(int argc, char** argv) {' \
  '  void* lib = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : 0;' \
  '  int (*run)(void) = lib ? (int (*)(void))dlsym(lib, "user_program_main") : 0;' \
  '  if (!run) { fprintf(stderr, "load_user: %s\n", dlerror()); return 2; }' \
  '  return run();' '}' >"$out/load_user.c"
cc -O2 -o "$out/load_user" "$out/load_user.c" -ldl || { echo "gpu-check: cc failed"; exit 1; }
# A library that fetches the driver's calls itself (tests/programs), built
# here so that only build/lib and build/bin need be carried.
cc -O2 -shared -fPIC -fno-optimize-sibling-calls -I"$cuda_include" \
  -o "$out/libtest-driver-lookup.so" tests/programs/driver_lookup_module.c -ldl ||
  { echo "gpu-check: cc failed (driver_lookup_module.c)"; exit 1; }
if [ "$build_only" = 1 ]; then
  echo "gpu-check: the GPU test programs built in $out"
  exit 0
fi

# all_pooled NAME REPORT N: the program's N allocations all in gpupool's report.
all_pooled() {
  local allocated
  allocated=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
print(d['devices']['0']['stats']['allocation.all.allocated'])" "$2" 2>/dev/null || echo none)
  if [ "$allocated" = "$3" ]; then record "$1" PASS "$3 of $3 in the report"
  else record "$1" FAIL "$allocated of $3 in the report ($2)"; fi
}

# reserved_2_mib NAME REPORT: device 0 reserves one 2 MiB page at exit.
reserved_2_mib() {
  local reserved
  reserved=$(python3 -c "import json, sys
print(json.load(open(sys.argv[1]))['devices']['0']['stats']['reserved_bytes.all.current'])" "$2" 2>/dev/null ||
    echo none)
  if [ "$reserved" = 2097152 ]; then record "$1" PASS "2 MiB"
  else record "$1" FAIL "$reserved bytes ($2)"; fi
}

pool=(LD_PRELOAD="$lib" GPUPOOL_LOG="$out/report-%e-%p.json" GPUPOOL_LOG_FORMAT=json)
# Room for two 16 MiB blocks (hazards_gpu's kBytes), as the simulated runtime's
# tests give test-hazards' 1 MiB blocks 2M: one held, the other the cached
# block a request on another stream must take (after a device-side wait for
# its old work) instead of growing.
pressure=(GPUPOOL_MEMORY_LIMIT=32M)

echo "== the CUDA rule the device barrier rests on (no gpupool)"
run "legacy stream event orders blocking streams" 0 -- "$out/hazards_gpu" legacy-barrier-rule
echo "== the capture modes the simulated runtime keeps: a cudaMalloc during a capture (no gpupool)"
run "capture modes: which captures an unsafe call invalidates" 0 -- build/bin/test-capture-rules rules
echo "== a capture ends with its stream, its thread and its device's reset (no gpupool; gpupool's books assume it)"
run "capture gone: an unsafe call after it is not refused" 0 -- build/bin/test-capture-rules gone-rules
echo "== a thread-local capture's device reset by another thread: the beginning thread's host waits after it (no gpupool; gpupool's waits are relaxed)"
run "capture reset elsewhere: host waits after it" 0 -- build/bin/test-capture-rules reset-elsewhere-rules
echo "== a thread-local capture's end on another thread: refused, and the capture ended (no gpupool; the simulated runtime's default)"
run "capture end elsewhere: its answer and the capture's status after it" 0 -- build/bin/test-capture-rules wrong-thread-rules
echo "== cudaFree(NULL) as the first call, under gpupool: a current context, as without it"
run "cudaFree(NULL) creates the context" 0 "${pool[@]}" -- "$out/hazards_gpu" null-free-creates-context

echo "== cudaFree's wait for the device, read on the host through mapped memory"
run "cudaFree returns after earlier work (no gpupool)" 0 -- "$out/hazards_gpu" cudafree-host-sync
run "so does gpupool's with free_synchronizes:1" 0 "${pool[@]}" GPUPOOL_FREE_SYNCHRONIZES=1 \
  -- "$out/hazards_gpu" cudafree-host-sync
run "gpupool's returns at once by default (the host reads early)" 1 "${pool[@]}" -- "$out/hazards_gpu" cudafree-host-sync

echo "== a kernel's illegal address: reported, and the process ends on its own"
run "cudaFree reports the fault (no gpupool)" 0 -- "$out/hazards_gpu" device-fault
run "gpupool's cudaFree returns success; the sync reports it" 1 "${pool[@]}" -- "$out/hazards_gpu" device-fault
run "gpupool's cudaFree reports it with free_synchronizes:1" 0 "${pool[@]}" GPUPOOL_FREE_SYNCHRONIZES=1 \
  -- "$out/hazards_gpu" device-fault
# After the fault the pool gives an idle 40 MiB segment back (garbage
# collection past 32 MiB of a 64 MiB limit, fixed segments): CUDA's answer to
# that cudaFree was never measured. Either answer passes if the report's
# books follow it: refused, the 40 MiB stay reserved; taken, they go.
fault_report="$out/report-fault-release.json"
run "after the fault, the request is refused (no gpupool)" 0 -- "$out/hazards_gpu" device-fault-release
run "after the fault, gpupool's request is refused too" 0 "${pool[@]}" GPUPOOL_LOG="$fault_report" \
  GPUPOOL_EXPANDABLE_SEGMENTS=0 GPUPOOL_MEMORY_LIMIT=64M GPUPOOL_GARBAGE_COLLECTION_THRESHOLD=0.5 \
  -- "$out/hazards_gpu" device-fault-release
freed=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['devices']['0']
u, reserved = d['upstream'], d['stats']['reserved_bytes.all.current']
refused = u['cuda_free_failures'] >= 1 and u['cuda_free_failures'] == u['cuda_free_calls'] and reserved == 40 << 20
taken = u['cuda_free_failures'] == 0 and u['cuda_free_calls'] >= 1 and reserved == 0
print('refused' if refused else 'taken' if taken else 'neither', u['cuda_free_calls'], u['cuda_free_failures'], reserved)" \
  "$fault_report" 2>/dev/null || echo unknown)
case "$freed" in
  refused*) record "  its cudaFree of the idle segment: refused, and the books keep it" PASS "$freed" ;;
  taken*) record "  its cudaFree of the idle segment: taken after the fault, and the books let it go" PASS "$freed" ;;
  *) record "  its cudaFree of the idle segment: the books follow CUDA's answer" FAIL \
       "answer, calls, refused, reserved bytes: $freed ($fault_report)" ;;
esac

echo "== reuse hazards with real kernels (0: ordered; 1 without ordering: the hazard)"
for mode in 1 0; do
  for case in cudafree-blocking cudafree-nonblocking cudafree-idle-streams cudafree-after-destroy-idle-streams \
              cudafree-covered same-stream cross-stream-completed cross-stream-pending destroyed-stream per-thread \
              ended-thread; do
    limit=("${pressure[@]}")
    [ "$case" = cudafree-covered ] && limit=(GPUPOOL_MEMORY_LIMIT=unlimited)  # a block of each pool
    run "hazard $case (expandable=$mode)" 0 "${pool[@]}" "${limit[@]}" GPUPOOL_EXPANDABLE_SEGMENTS=$mode \
      -- "$out/hazards_gpu" "$case"
    case $case in
      same-stream|cross-stream-completed) ;;  # no ordering step to remove
      cudafree-covered) ;;  # ordered by an earlier barrier; without ordering it lands elsewhere
      ended-thread) ;;  # the runtime may give the new thread the ended one's stream: stream order hides it
      *) run "hazard $case shows without ordering (expandable=$mode)" 1 "${pool[@]}" "${pressure[@]}" \
           GPUPOOL_EXPANDABLE_SEGMENTS=$mode GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 -- "$out/hazards_gpu" "$case" ;;
    esac
  done
  # With room to grow as well: the new thread's per-thread stream follows the
  # completion fence's legacy event, and a destroyed stream's block goes to
  # the next stream through the barrier the look records, so each takes the
  # block at once (exit 2: it took new memory instead).
  for case in per-thread ended-thread destroyed-stream stream-per-task; do
    run "hazard $case with room to grow (expandable=$mode)" 0 "${pool[@]}" GPUPOOL_MEMORY_LIMIT=unlimited \
      GPUPOOL_EXPANDABLE_SEGMENTS=$mode -- "$out/hazards_gpu" "$case"
  done
  # A stream made for each task beside a stream kept busy with slow kernels:
  # no task's stream may wait behind that stream (exit 4); under completed
  # and never a task takes new memory rather than wait for the last (exit 2).
  run "stream-per-task beside a busy stream (expandable=$mode)" 0 "${pool[@]}" GPUPOOL_MEMORY_LIMIT=unlimited \
    GPUPOOL_EXPANDABLE_SEGMENTS=$mode -- "$out/hazards_gpu" stream-per-task-beside-busy
  for policy in completed never; do
    run "stream-per-task beside a busy stream, $policy (expandable=$mode)" "0 2" "${pool[@]}" \
      GPUPOOL_MEMORY_LIMIT=unlimited GPUPOOL_CROSS_STREAM_REUSE=$policy GPUPOOL_EXPANDABLE_SEGMENTS=$mode \
      -- "$out/hazards_gpu" stream-per-task-beside-busy
  done
  # The same with each task's stream destroyed after the next task took
  # memory (a fence pending on it then): tasks may take new memory.
  for policy in auto completed never; do
    run "overlapping tasks beside a busy stream, $policy (expandable=$mode)" 0 "${pool[@]}" \
      GPUPOOL_MEMORY_LIMIT=unlimited GPUPOOL_CROSS_STREAM_REUSE=$policy GPUPOOL_EXPANDABLE_SEGMENTS=$mode \
      -- "$out/hazards_gpu" overlapping-tasks-beside-busy
  done
done

echo "== a destroyed stream's handle given to a new stream (unseen-: destroyed through the driver, past gpupool)"
# Shows something only where CUDA gives the handle again at once (exit 2 and
# "not reused" in the log where it does not): the old stream's block must
# still wait for its kernel, in the pool and in a thread's cache (-threads).
# CUDA 13 on an H200 gave the handle again, yet showed no hazard even without
# ordering (exit 0 there too): the new stream did not overtake the old one's
# kernel. The simulated runtime's new stream does, and its tests show it.
for case in handle-given-again handle-given-again-threads unseen-destroy unseen-destroy-threads; do
  run "hazard $case" "0 2" "${pool[@]}" "${pressure[@]}" -- "$out/hazards_gpu" "$case"
  run "hazard $case without ordering (CUDA 13 showed none)" "0 1 2" "${pool[@]}" "${pressure[@]}" \
    GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 -- "$out/hazards_gpu" "$case"
done

# A stream destroyed through the driver's cuStreamDestroy_v2 that the program
# fetched with dlsym or called linked with the driver, or that a library
# fetched with dlsym, which gpupool watches: seen as cudaStreamDestroy is.
for case in driver-destroy linked-driver-destroy library-driver-destroy; do
  library=(HAZARDS_DRIVER_LIBRARY="$out/libtest-driver-lookup.so")
  run "hazard $case" 0 "${pool[@]}" "${pressure[@]}" "${library[@]}" -- "$out/hazards_gpu" "$case"
  run "hazard $case shows without ordering" 1 "${pool[@]}" "${pressure[@]}" "${library[@]}" \
    GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 -- "$out/hazards_gpu" "$case"
done

# A handle no new stream gets: gpupool's one call that names it is undefined
# on CUDA (the simulated runtime refuses it as an invalid handle, and gpupool
# then names it no more). 0: ordered; 2: the request took new memory. On
# CUDA 13 (H200, at 933631c) the ordered run crashed (SIGSEGV) and the run
# without ordering did not: an open fault for a destroy gpupool cannot see
# (these cases fetch it through libc's own dlsym, past gpupool's).
run "hazard gone-stream" "0 2" "${pool[@]}" "${pressure[@]}" -- "$out/hazards_gpu" gone-stream
run "hazard gone-stream shows without ordering" "1 2" "${pool[@]}" "${pressure[@]}" GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 \
  -- "$out/hazards_gpu" gone-stream
# Then a stream made through the driver gets the handle (where CUDA gives it
# again at once; 2 where not): a new stream to gpupool.
run "hazard gone-handle-after-barrier" "0 2" "${pool[@]}" "${pressure[@]}" -- "$out/hazards_gpu" gone-handle-after-barrier
run "hazard gone-handle-after-barrier shows without ordering" "1 2" "${pool[@]}" "${pressure[@]}" \
  GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 -- "$out/hazards_gpu" gone-handle-after-barrier

echo "== the integration programs on the real runtime"
for mode in 1 0; do
  m=("GPUPOOL_EXPANDABLE_SEGMENTS=$mode")
  run "patterns (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-patterns 6000 7
  run "repeat (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-repeat 200
  run "threads (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-threads 4 500
  run "capture (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-capture
  run "capture while other streams allocate (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-capture others
  run "capture into a graph (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-capture to-graph
  # The same captures begun and ended with the driver's calls, fetched by name,
  # through cuGetProcAddress (the program's, a library's) and through the
  # runtime's cudaGetDriverEntryPoint (not linked: build/bin's programs link
  # the simulated driver's names).
  for how in driver-dlsym driver-proc-address driver-library-proc-address runtime-entry-point \
    runtime-entry-point-by-version; do
    for variant in "" to-graph; do
      run "capture through the driver, $how ${variant:-begin} (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
        -- build/bin/test-capture driver "$how" "$out/libtest-driver-lookup.so" $variant
    done
  done
  # A capture that goes without an end leaves gpupool's books: the cache, the
  # only room under the limit, goes back for the next request.
  for how in stream thread reset stream-elsewhere reset-elsewhere; do
    run "capture gone with its $how (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" GPUPOOL_MEMORY_LIMIT=64M \
      -- build/bin/test-capture gone "$how"
  done
  run "capture end refused on another thread (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" GPUPOOL_MEMORY_LIMIT=64M \
    -- build/bin/test-capture wrong-thread-end
  run "fidelity (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-fidelity
  pitched_report="$out/report-pitched-$mode.json"
  run "pitched 2D/3D arrays (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" GPUPOOL_LOG="$pitched_report" \
    -- build/bin/test-pitched 4
  all_pooled "cudaMallocPitch/cudaMalloc3D pooled (expandable=$mode)" "$pitched_report" 53
  run "lifecycle fork (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-lifecycle fork
  reset_report="$out/report-reset-$mode.json"
  run "lifecycle device reset (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" GPUPOOL_LOG="$reset_report" \
    -- build/bin/test-lifecycle reset
  # Six allocations, one still held at the reset: the report covers them all.
  seen=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['devices']['0']
print(d['device_resets']['count'], d['device_resets']['blocks_freed_by_reset'], d['stats']['allocation.all.allocated'])" \
    "$reset_report" 2>/dev/null || echo unknown)
  if [ "$seen" = "1 1 6" ]; then
    record "report covers the run across the reset (expandable=$mode)" PASS "1 reset, 1 block freed by it, 6 allocations"
  else
    record "report covers the run across the reset (expandable=$mode)" FAIL "$seen: resets, blocks freed by them, allocations ($reset_report)"
  fi
  # 64 MiB freed into a thread's cache, then the default pool trimmed to 0:
  # only the page of the one block allocated after the trim stays reserved.
  trim_report="$out/report-trim-$mode.json"
  run "cudaMemPoolTrimTo gives back the cache (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
    GPUPOOL_LOG="$trim_report" -- build/bin/test-lifecycle trim 0
  reserved_2_mib "  reserved after the trim (expandable=$mode)" "$trim_report"
  # The default pool's figures (cudaMemPoolGetAttribute) follow the program's
  # blocks with gpupool's added; a pool of the program's own serves its calls.
  run "memory pool figures include gpupool's (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
    -- build/bin/test-meminfo pool
  run "  the same with threads' caches (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
    -- build/bin/test-meminfo pool threads
  own_pool_report="$out/report-own-pool-$mode.json"
  run "a pool of the program's own made current serves its calls (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
    GPUPOOL_LOG="$own_pool_report" -- build/bin/test-meminfo own-pool
  all_pooled "  only the default pool's blocks pooled (expandable=$mode)" "$own_pool_report" 3
  own_pool_report="$out/report-own-pool-by-location-$mode.json"
  run "  the same made current with CUDA 13's cudaMemSetMemPool (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" \
    GPUPOOL_LOG="$own_pool_report" -- build/bin/test-meminfo own-pool by-location
  all_pooled "  only the default pool's blocks pooled (cudaMemSetMemPool, expandable=$mode)" "$own_pool_report" 3
  run "demo (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/gpupool-demo --steps 10
  run "stress, threads and every kind of stream (expandable=$mode)" 0 "${pool[@]}" "${m[@]}" -- build/bin/test-stress 3 10 200 1
done
repeat_log="$out/$(echo "repeat (expandable=1)" | tr -c 'A-Za-z0-9_.-' '_').log"
if [ ! -f "$repeat_log" ] || grep -q "needs the driver's virtual memory calls" "$repeat_log"; then
  record "expandable segments on this driver" FAIL "fell back to fixed segments, or no log ($repeat_log)"
else
  record "expandable segments on this driver" PASS ""
fi

echo "== gpupool's own host allocations failing (std::bad_alloc inside it): the program never notices"
cc -O2 -shared -fPIC -o "$out/libtest-failing-malloc.so" tests/programs/failing_malloc.c ||
  { echo "gpu-check: cc failed (failing_malloc.c)"; exit 1; }
faults=(LD_PRELOAD="$out/libtest-failing-malloc.so:$lib")  # ahead of gpupool
for first in 1 40 300; do
  run "gpupool's host allocation $first failing" 0 "${pool[@]}" "${faults[@]}" -- build/bin/test-host-oom "$first" 0
done
run "gpupool's host allocations failing from the 20th on" 0 "${pool[@]}" "${faults[@]}" -- build/bin/test-host-oom 20 1
run "once stepped aside: blocks kept, IPC refused, a reset" 0 "${pool[@]}" "${faults[@]}" GPUPOOL_EXPANDABLE_SEGMENTS=0 \
  -- build/bin/test-host-oom after-reset
run "gpupool's host allocations failing from a fork on" 0 "${pool[@]}" "${faults[@]}" -- build/bin/test-host-oom fork
run "memory pool figures, the runtime's alone (no gpupool)" 0 -- build/bin/test-meminfo pool
run "a pool of the program's own made current (no gpupool)" 0 -- build/bin/test-meminfo own-pool
run "  the same with CUDA 13's cudaMemSetMemPool (no gpupool)" 0 -- build/bin/test-meminfo own-pool by-location
run "unchanged nvcc -cudart shared program" 0 "${pool[@]}" -- "$out/user_program"
run "pitched 2D/3D arrays without gpupool (the program's own checks)" 0 -- build/bin/test-pitched 4
# Any pitch that meets the alignments is right; gpupool pads rows to 512 bytes
# as the runtime has on the GPUs we know of. INFO when this one differs.
pitch_of() { timeout 60 env "$@" build/bin/test-pitched 1 2>/dev/null | python3 -c "import json, sys
print(json.loads(sys.stdin.read().splitlines()[-1])['pitch_of_a_1_byte_row'])" 2>/dev/null || echo none; }
runtime_pitch=$(pitch_of)
pooled_pitch=$(pitch_of "${pool[@]}")
if [ "$runtime_pitch" = "$pooled_pitch" ]; then record "pitch of a 1-byte row as the runtime's" PASS "$pooled_pitch bytes"
else record "pitch of a 1-byte row as the runtime's" INFO "gpupool $pooled_pitch, runtime $runtime_pitch bytes"; fi
# A CUDA IPC handle names a whole allocation: only a block that starts a fixed
# segment may be exported; any other is refused, not handed out to map other bytes.
for mode in 1 0; do
  ipc_log="$out/ipc-$mode.out"
  timeout 60 env "${pool[@]}" GPUPOOL_EXPANDABLE_SEGMENTS=$mode build/bin/test-lifecycle ipc >"$ipc_log" 2>&1
  first=cudaSuccess
  [ "$mode" = 1 ] && first=cudaErrorInvalidValue
  refused="cudaIpcGetMemHandle: cudaErrorInvalidValue, then cudaErrorInvalidValue"
  # The two blocks, then a pointer inside each.
  expected="cudaIpcGetMemHandle: $first, then $first
$refused
cudaIpcGetMemHandle: $first, then $first
$refused"
  if [ "$(grep '^cudaIpcGetMemHandle' "$ipc_log")" = "$expected" ]; then
    record "IPC handle only for a block that starts its segment (expandable=$mode)" PASS ""
  else
    record "IPC handle only for a block that starts its segment (expandable=$mode)" FAIL "($ipc_log)"
  fi
  # The driver's cuIpcGetMemHandle alike, which leaves the runtime's last error alone.
  driver_first=CUDA_SUCCESS
  [ "$mode" = 1 ] && driver_first=CUDA_ERROR_INVALID_VALUE
  driver_refused="cuIpcGetMemHandle: CUDA_ERROR_INVALID_VALUE, then cudaSuccess"
  expected="cuIpcGetMemHandle: $driver_first, then cudaSuccess
$driver_refused
cuIpcGetMemHandle: $driver_first, then cudaSuccess
$driver_refused"
  for how in driver-dlsym driver-proc-address driver-library-proc-address runtime-entry-point \
    runtime-entry-point-by-version; do
    ipc_log="$out/ipc-$how-$mode.out"
    timeout 60 env "${pool[@]}" GPUPOOL_EXPANDABLE_SEGMENTS=$mode \
      build/bin/test-lifecycle ipc "$how" "$out/libtest-driver-lookup.so" >"$ipc_log" 2>&1
    if [ "$(grep '^cuIpcGetMemHandle' "$ipc_log")" = "$expected" ]; then
      record "driver's IPC handle only for a block that starts its segment ($how, expandable=$mode)" PASS ""
    else
      record "driver's IPC handle only for a block that starts its segment ($how, expandable=$mode)" FAIL "($ipc_log)"
    fi
  done
done
# Two CUDA runtimes in one process: the program's (the real one) and a
# stand-in CUDA 12 runtime of a library built against it (tests/programs).
# Each caller reads its own runtime's last error, with gpupool as without, and
# a driver function the library fetches is its own runtime's.
mkdir -p "$out/cuda12"
cc -O2 -shared -fPIC -I"$cuda_include" -Wl,-soname,libcudart.so.12 \
  -Wl,--version-script=tests/programs/second_runtime.map -o "$out/cuda12/libcudart.so.12" \
  tests/programs/second_runtime.c &&
  cc -O2 -shared -fPIC -fno-optimize-sibling-calls -I"$cuda_include" \
    -o "$out/cuda12/libtest-cuda12-user.so" tests/programs/cuda12_user.c "$out/cuda12/libcudart.so.12" \
    -Wl,-rpath,"$out/cuda12" ||
  { echo "gpu-check: cc failed (second_runtime.c, cuda12_user.c)"; exit 1; }
two_runtimes() { timeout 60 env "$@" build/bin/test-two-runtimes "$out/cuda12/libtest-cuda12-user.so" 2>/dev/null | tail -1; }
runtimes_alone=$(two_runtimes)
runtimes_pooled=$(two_runtimes "${pool[@]}")
# The one difference gpupool makes: the driver's free and stream destroy the
# library fetched through its own runtime are gpupool's, watched.
watched='"driver_free12_watched": 1'
unwatched='"driver_free12_watched": 0'
destroy_watched='"driver_destroy12_watched": 1'
destroy_unwatched='"driver_destroy12_watched": 0'
runtimes_unwatched=${runtimes_pooled/"$watched"/"$unwatched"}
if [ -n "$runtimes_alone" ] && [[ "$runtimes_pooled" == *"$watched"* ]] &&
  [[ "$runtimes_pooled" == *"$destroy_watched"* ]] &&
  [ "$runtimes_alone" = "${runtimes_unwatched/"$destroy_watched"/"$destroy_unwatched"}" ]; then
  record "two runtimes: each one's callers read their own last error" PASS ""
else
  record "two runtimes: each one's callers read their own last error" FAIL \
    "without gpupool: $runtimes_alone; with: $runtimes_pooled"
fi
unseen="nvcc static-runtime program runs unpooled"
run "$unseen" 0 "${pool[@]}" -- "$out/user_program_static"
unseen_log="$out/$(echo "$unseen" | tr -c 'A-Za-z0-9_.-' '_').log"
if [ "$(grep -c "so gpupool pooled nothing" "$unseen_log")" = 1 ]; then
  record "nvcc static-runtime program is told why nothing was pooled" PASS "one line at exit"
else
  record "nvcc static-runtime program is told why nothing was pooled" FAIL "no such line, or more than one ($unseen_log)"
fi
# With static_runtime:1 the same binaries are pooled through the driver hook:
# every allocation in the report, and each hazard case ordered (and shown to
# break without ordering, which only a pooled run can).
static_report="$out/report-static.json"
run "nvcc static-runtime program, static_runtime:1" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 \
  GPUPOOL_LOG="$static_report" -- "$out/user_program_static"
all_pooled "static_runtime:1 pools every allocation" "$static_report" 600
static=("${pool[@]}" GPUPOOL_STATIC_RUNTIME=1)
run "static runtime: patterns" 0 "${static[@]}" -- "$out/patterns_static" 6000 7
pitched_static_report="$out/report-pitched-static.json"
run "static runtime: pitched 2D/3D arrays" 0 "${static[@]}" GPUPOOL_LOG="$pitched_static_report" \
  -- "$out/pitched_static" 4
# The static runtime asks the driver for the volume CUDA wraps, if it grants it.
wrapped=$(grep -ho '"too_deep_granted": 1' "$out"/static_runtime__pitched_2D_3D_arrays_.log | wc -l)
all_pooled "static runtime: cudaMallocPitch/cudaMalloc3D pooled" "$pitched_static_report" $((53 + wrapped))
run "static runtime: threads" 0 "${static[@]}" -- "$out/threads_static" 4 500
run "static runtime: capture" 0 "${static[@]}" -- "$out/capture_static"
run "static runtime: capture while other streams allocate" 0 "${static[@]}" -- "$out/capture_static" others
run "static runtime: capture into a program's graph" 0 "${static[@]}" -- "$out/capture_static" to-graph
# The per-thread entry points a --default-stream per-thread build's static
# runtime fetches, played against the driver (no nvcc build of that kind here).
for mode in capture-per-thread capture-to-graph-per-thread; do
  run "static runtime (played): $mode" 0 "${static[@]}" -- build/bin/test-static-runtime "$mode"
done
run "static runtime: device reset" 0 "${static[@]}" -- "$out/lifecycle_static" reset
static_trim_report="$out/report-trim-static.json"
run "static runtime: cudaMemPoolTrimTo gives back the cache" 0 "${static[@]}" GPUPOOL_LOG="$static_trim_report" \
  -- "$out/lifecycle_static" trim 0
reserved_2_mib "  reserved after the static runtime's trim" "$static_trim_report"
run "static runtime: memory pool figures include gpupool's" 0 "${static[@]}" -- "$out/meminfo_static" pool
static_own_pool_report="$out/report-own-pool-static.json"
run "static runtime: a pool of the program's own made current" 0 "${static[@]}" \
  GPUPOOL_LOG="$static_own_pool_report" -- "$out/meminfo_static" own-pool
all_pooled "  only the default pool's blocks pooled (static runtime)" "$static_own_pool_report" 3
static_own_pool_report="$out/report-own-pool-by-location-static.json"
run "static runtime: the same made current with cudaMemSetMemPool" 0 "${static[@]}" \
  GPUPOOL_LOG="$static_own_pool_report" -- "$out/meminfo_static" own-pool by-location
all_pooled "  only the default pool's blocks pooled (static runtime, cudaMemSetMemPool)" "$static_own_pool_report" 3
run "static runtime: stress, threads and every kind of stream" 0 "${static[@]}" -- "$out/stress_static" 3 10 200 1
library_report="$out/report-static-library.json"
run "static runtime in a library, static_runtime_libraries names it" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 \
  GPUPOOL_STATIC_RUNTIME_LIBRARIES=libuser_static.so GPUPOOL_LOG="$library_report" \
  -- "$out/load_user" "$out/libuser_static.so"
all_pooled "static_runtime_libraries pools a library's allocations" "$library_report" 600
# A library that fetches each driver call with dlsym by name, as XLA's CUDA
# stubs do: 20 plain, 42 stream-ordered and 20 pitched pairs, each block checked
# (and one block of a pool of its own, the runtime's).
by_name_report="$out/report-driver-by-name.json"
run "driver calls fetched by name, the library named" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 \
  GPUPOOL_STATIC_RUNTIME_LIBRARIES=libtest-driver-lookup.so GPUPOOL_LOG="$by_name_report" \
  -- build/bin/test-static-runtime library-by-name "$out/libtest-driver-lookup.so" 20
all_pooled "static_runtime_libraries pools driver calls fetched by name" "$by_name_report" 82
run "a device reset fetched by name leaves nothing from before it" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 \
  GPUPOOL_STATIC_RUNTIME_LIBRARIES=libtest-driver-lookup.so \
  -- build/bin/test-static-runtime library-reset "$out/libtest-driver-lookup.so" cuDevicePrimaryCtxReset_v2
for case in cudafree-nonblocking cudafree-idle-streams cross-stream-pending destroyed-stream; do
  run "static runtime: hazard $case" 0 "${pool[@]}" "${pressure[@]}" GPUPOOL_STATIC_RUNTIME=1 \
    -- "$out/hazards_gpu_static" "$case"
  run "static runtime: hazard $case shows without ordering" 1 "${pool[@]}" "${pressure[@]}" \
    GPUPOOL_STATIC_RUNTIME=1 GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1 -- "$out/hazards_gpu_static" "$case"
done

# A loop of pairs whose working set needs a page more than the pool's peak:
# on this runtime recycling once remapped pages on almost every pair (29 us a
# pair on an H200). After warm-up its pages must stay mapped.
for mode in async plain; do
  loop_report="$out/report-loop-$mode.json"
  run "allocation loop ($mode) runs" 0 "${pool[@]}" GPUPOOL_LOG="$loop_report" \
    -- build/bin/gpupool-bench-api "$mode" 1 20000 64
  maps=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
print(sum(v['upstream']['page_maps'] for v in d['devices'].values()))" "$loop_report" 2>/dev/null || echo unknown)
  # No maps at all: the driver gave no virtual memory calls and the pool fell
  # back to fixed segments (the shim warns; an H200's driver has them).
  if [ "$maps" != unknown ] && [ "$maps" -ge 1 ] && [ "$maps" -le 64 ]; then
    record "allocation loop ($mode) keeps its pages mapped" PASS "$maps page maps over 40000 pairs (20000 timed one by one)"
  else
    record "allocation loop ($mode) keeps its pages mapped" FAIL "$maps page maps over 40000 pairs ($loop_report)"
  fi
done
# A stream made for each task, 10 ms between tasks (the device idle): each
# look finds the last task's block pending and must take the one before it,
# also where both are merged in one expandable page (before ae032ad: a page
# more every task or two on the simulated runtime).
for mode in 1 0; do
  tasks_report="$out/report-tasks-$mode.json"
  run "stream-per-task on an idle device runs (expandable=$mode)" 0 "${pool[@]}" GPUPOOL_LOG="$tasks_report" \
    GPUPOOL_EXPANDABLE_SEGMENTS=$mode -- build/bin/gpupool-bench-api tasks 30 10000
  peak=$(python3 -c "import json, sys
print(json.load(open(sys.argv[1]))['devices']['0']['stats']['reserved_bytes.all.peak'])" "$tasks_report" 2>/dev/null ||
    echo unknown)
  if [ "$peak" != unknown ] && [ "$peak" -le $((4 << 20)) ]; then
    record "stream-per-task on an idle device keeps one block (expandable=$mode)" PASS "$peak bytes at the peak"
  else
    record "stream-per-task on an idle device keeps one block (expandable=$mode)" FAIL "$peak bytes at the peak ($tasks_report)"
  fi
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  run "two devices, switching between calls" 0 "${pool[@]}" GPUPOOL_MEMORY_LIMIT=20M -- build/bin/test-devices cross 20
  run "two devices, a thread each" 0 "${pool[@]}" GPUPOOL_MEMORY_LIMIT=20M -- build/bin/test-devices threads 50
  run "two devices, peer access" 0 "${pool[@]}" -- build/bin/test-device-access peer
  # A stream of device 1 writes device 0's stream-ordered blocks after the
  # grant: a fault where gpupool left them closed (a third device adds a pool
  # opened before its device was used).
  for expandable in 1 0; do
    run "default pools opened with cudaMemPoolSetAccess (expandable=$expandable)" 0 "${pool[@]}" \
      GPUPOOL_EXPANDABLE_SEGMENTS=$expandable -- build/bin/test-device-access pool-access
    # Peer and pool access taken away again: the driver closes pooled pages
    # (a line in the log where it refuses), and every call still succeeds.
    run "access taken away closes pooled pages (expandable=$expandable)" 0 "${pool[@]}" \
      GPUPOOL_EXPANDABLE_SEGMENTS=$expandable -- build/bin/test-device-access access-revoked
    # Either device's reset ends peer access; enabling it again must not
    # answer "already enabled" (what the real driver does is checked here).
    run "a reset ends peer access (expandable=$expandable)" 0 "${pool[@]}" \
      GPUPOOL_EXPANDABLE_SEGMENTS=$expandable -- build/bin/test-device-access peer-reset
    # A default pool opened for reading alone (cudaMemAccessFlagsProtRead):
    # whether CUDA takes it for a pool, and, in the log, whether the driver
    # maps gpupool's pages for reading alone (a line where it refuses).
    run "a pool opened for reading alone (expandable=$expandable)" 0 "${pool[@]}" \
      GPUPOOL_EXPANDABLE_SEGMENTS=$expandable -- build/bin/test-device-access pool-read
    run "access changed while another thread maps pages (expandable=$expandable)" 0 "${pool[@]}" \
      GPUPOOL_EXPANDABLE_SEGMENTS=$expandable -- build/bin/test-device-access access-churn
  done
  run "two devices, a block freed on the other's stream" 0 "${pool[@]}" GPUPOOL_MEMORY_LIMIT=20M -- build/bin/test-devices foreign 20
  run "two devices, such a free inside a capture" 0 "${pool[@]}" -- build/bin/test-devices foreign-capture
  # Device 0's cache is the only room under the limit while device 1 captures:
  # it goes back only where the capture allows this thread a cudaFree, and the
  # capture stays valid either way.
  for capture in global thread-local relaxed; do
    for thread in same-thread other-thread; do
      run "two devices, a request that needs the cache during a $capture capture ($thread)" 0 "${pool[@]}" \
        GPUPOOL_MEMORY_LIMIT=64M -- build/bin/test-capture other-device "$capture" "$thread"
    done
  done
  run "two devices: cudaFree of device 1's memory waits for device 1 (no gpupool)" 0 \
    -- "$out/hazards_gpu" cudafree-host-sync-other-device
  run "so does gpupool's with free_synchronizes:1" 0 "${pool[@]}" GPUPOOL_FREE_SYNCHRONIZES=1 \
    -- "$out/hazards_gpu" cudafree-host-sync-other-device
  run "static runtime: two devices, switching between calls" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 \
    GPUPOOL_MEMORY_LIMIT=20M -- "$out/devices_static" cross 20
  run "static runtime: two devices, peer access" 0 "${pool[@]}" GPUPOOL_STATIC_RUNTIME=1 -- "$out/devices_static" peer
else
  record "two devices" SKIP "one GPU here"
fi

if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "== PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under gpupool"
  run "pytorch training steps" 0 "${pool[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 tests/gpu/torch_smoke.py
else
  record "pytorch training steps" SKIP "no PyTorch with CUDA here"
fi

echo
echo "== summary ($out, ${SECONDS} s in all)"
printf '%s\n' "${results[@]}"
exit $failed
