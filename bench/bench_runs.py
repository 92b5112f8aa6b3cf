"""What bench/run_benchmarks.py's sections run and read: the build's paths,
the quick run's counts, the benchmarks and replays run and their output
parsed, gpupool's own instructions counted with callgrind, and held memory
measured as threads and streams come and go. bench/gpu_bench.py takes its
machine line from here too."""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build-bench"))
BIN = os.path.join(BUILD, "bin")
LIB = os.path.join(BUILD, "lib", "libgpupool.so")
SIM = os.path.join(BUILD, "sim")
TRACES = os.environ.get("TRACES_DIR", os.path.join(ROOT, "..", "shared", "traces"))
QUICK = sys.argv[1:] == ["--quick"]


def count(full, quick):
    """How many runs, rounds or pairs: `quick` in a quick run, whose figures
    mean nothing (it shows that every section still runs)."""
    return quick if QUICK else full

def sh(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, check=True).stdout


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.system()} {platform.release()}, {os.cpu_count()} cores, {cpu}"


def code_version():
    """The commit measured, and whether the tree held changes beyond it (an
    earlier run's BENCHMARKS.md is not one: it changes nothing measured)."""
    try:
        commit = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
        changed = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)BENCHMARKS.md"]).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {commit}" + (", with uncommitted changes" if changed else "")


def google_benchmark(filter_, repetitions=5):
    out = sh([os.path.join(BIN, "gpupool-bench"), f"--benchmark_filter={filter_}", "--benchmark_format=json",
              f"--benchmark_repetitions={count(repetitions, 2)}", "--benchmark_report_aggregates_only=true",
              f"--benchmark_min_time={count(0.3, 0.001)}"], env={"TRACES_DIR": TRACES})
    medians = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            medians[b["run_name"]] = b["real_time"]
    return medians


def bench_api(mode, threads, pairs, preload, working_set=64, reserved=False, extra_env=None, runner=()):
    """One run of gpupool-bench-api (under `runner`, a command and its
    arguments, if given): its JSON line, with the pool's peak reserved bytes
    from gpupool's report as "reserved" when asked for."""
    env = {"LD_LIBRARY_PATH": SIM, "TRACES_DIR": TRACES, "GPUPOOL_REPORT": "0", **(extra_env or {})}
    if preload:
        env["LD_PRELOAD"] = LIB
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        if reserved:
            env.update(GPUPOOL_REPORT="1", GPUPOOL_LOG=report, GPUPOOL_LOG_FORMAT="json", GPUPOOL_LOG_LEVEL="error")
        result = json.loads(sh([*runner, os.path.join(BIN, "gpupool-bench-api"), mode, str(threads), str(pairs),
                                str(working_set)], env=env))
        if reserved:
            with open(report) as f:
                devices = list(json.load(f)["devices"].values())
            result["reserved"] = sum(d["stats"]["reserved_bytes.all.peak"] for d in devices)
            result["hit_ratio"] = devices[0]["cache"]["hit_ratio"]
            result["stream_rows"] = len(devices[0]["streams"])
            upstream = devices[0]["upstream"]
            # The report's sampled estimate of the time inside the pool.
            result["pool_ns_per_op"] = upstream["pool_ns_estimated"] / max(upstream["pool_operations"], 1)
    return result


def api_pairs(mode, threads, pairs, preload, runs=5, working_set=64):
    """Medians over runs of ns per pair and pairs per second."""
    results = [bench_api(mode, threads, pairs, preload, working_set) for _ in range(runs)]
    return (statistics.median(r["ns_per_pair"] for r in results),
            statistics.median(r["pairs_per_second"] for r in results))


# The pairs whose instructions are counted: mode, environment, label. The
# plain pair without ordering (unsafe: a block may be reused while work on it
# still runs) is there to show what ordering costs the plain pair.
INSTRUCTION_PAIRS = (("plain", {}, "plain pair"), ("async", {}, "stream-ordered pair"),
                     ("plain", {"GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING": "1"}, "plain pair without ordering"))


def own_instructions_per_pair(mode, extra_env=None):
    """gpupool's own instructions per API pair, counted by callgrind: those of
    its two libraries (the simulated runtime, libc, libstdc++ and the
    benchmark not counted), per pair made, from the difference of two runs, so that
    start-up and warm-up cancel; the median of three such differences (how
    often a plain pair records a barrier moves a little with the simulated
    device's timing). Unlike a time, the same for a build on any machine, and
    in any state of it."""
    return statistics.median(own_instructions_difference(mode, extra_env) for _ in range(count(3, 1)))


def own_instructions_difference(mode, extra_env):
    runs = []
    for pairs in (count(10000, 200), count(20000, 400)):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "callgrind.out")
            result = bench_api(mode, 1, pairs, True, extra_env=extra_env,
                               runner=("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"))
            own = instructions_of_objects(out, ("/libgpupool.so", "/libgpupool-core.so"))
        runs.append((result["pairs_made"], own))
    (pairs_a, own_a), (pairs_b, own_b) = runs
    return (own_b - own_a) / (pairs_b - pairs_a)


def instructions_of_objects(path, suffixes):
    """The instructions callgrind counted in the objects whose paths end with
    `suffixes`, read from its own file. (callgrind_annotate adds up functions
    of one name across objects and names one of them: the benchmark's clock
    reads, libstdc++'s steady_clock::now, came out as the core's, which
    carries a copy of that function of its own.) Each cost line belongs to
    the last object an `ob=` named; the line after a `calls=` is the call's
    inclusive cost, counted where the callee is."""
    names, current, total, after_call = {}, None, 0, False
    with open(path) as f:
        for line in f:
            if after_call:
                after_call = False
            elif line.startswith(("ob=", "cob=")):
                key, _, spec = line.rstrip("\n").partition("=")
                # Compressed: "(id) name" the first time, "(id)" after.
                number, _, name = spec.partition(" ") if spec.startswith("(") else ("", "", spec)
                if number and name:
                    names[number] = name
                if key == "ob":
                    current = names.get(number, name)
            elif line.startswith("calls="):
                after_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                fields = line.split()
                if len(fields) > 1 and current is not None and current.endswith(suffixes):
                    total += int(fields[1])
    return total


def held_memory_rows(mode, threads_or_tasks, pauses_us, per_key, last_cell=None, busy=0, extra_env=None, zero_pause=True):
    """Table rows for gpupool-bench-api churn or tasks: expandable and fixed
    segments, without a pause (unless zero_pause is false) and with each of
    pauses_us; 3 runs each, their peak reserved (median, lowest-highest),
    cache hits and time per thread or task. busy: tasks' busy-stream
    operations per task."""
    rows = []
    pauses = (0, *pauses_us) if zero_pause else tuple(pauses_us)
    for name, expandable, pause in [(name, expandable, pause) for pause in pauses
                                    for name, expandable in (("expandable (default)", "1"), ("fixed", "0"))]:
        env = {"GPUPOOL_EXPANDABLE_SEGMENTS": expandable, **(extra_env or {})}
        # (gpupool-bench-api's fourth argument is the busy stream's operations for tasks.)
        runs = [bench_api(mode, threads_or_tasks, pause, True, working_set=busy, reserved=True, extra_env=env)
                for _ in range(count(3, 1))]
        mib = sorted(r["reserved"] / 2**20 for r in runs)
        row = (f"| {name} | {pause} us | {statistics.median(mib):.0f} MiB ({mib[0]:.0f}-{mib[-1]:.0f}) | "
               f"{statistics.median(r['hit_ratio'] for r in runs) * 100:.1f}% | "
               f"{statistics.median(r[per_key] for r in runs):.0f} |")
        rows.append(row + (f" {last_cell(runs)} |" if last_cell else ""))
    return rows


def timed(cmd, env, runs):
    """Median wall time of `runs` runs of cmd."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_ratio(cmd, env_a, env_b, rounds=15, runs=20):
    """Median over rounds of (time with env_a) / (time with env_b), measured in turn."""
    ratios = []
    for _ in range(count(rounds, 1)):
        b = timed(cmd, env_b, count(runs, 1))
        a = timed(cmd, env_a, count(runs, 1))
        ratios.append(a / b)
    return statistics.median(ratios)


def replay(args):
    out = sh([os.path.join(BIN, "gpupool-replay"), "--json"] + args)
    return [json.loads(line) for line in out.splitlines()]


def ordering_calls(r):
    """The event and stream calls a replay's ordering made (its text table's sync/alloc, times allocations)."""
    return r["events_recorded"] + r["event_queries"] + r["stream_waits"] + r["stream_queries"]


def counted_plain_loop(*args):
    """One run of `gpupool-bench-api plain 1 ARGS...` under gpupool: its JSON
    line and the simulated runtime's call counters (SIMCUDA_COUNTERS_FILE)."""
    counters = os.path.join(BUILD, "bench-counters.json")
    loop = json.loads(sh([os.path.join(BIN, "gpupool-bench-api"), "plain", "1", *map(str, args)],
                         env={"LD_LIBRARY_PATH": SIM, "TRACES_DIR": TRACES, "GPUPOOL_REPORT": "0",
                              "LD_PRELOAD": LIB, "SIMCUDA_COUNTERS_FILE": counters}))
    with open(counters) as f:
        calls = json.load(f)
    os.remove(counters)
    return loop, calls
