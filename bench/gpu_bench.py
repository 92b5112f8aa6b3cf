#!/usr/bin/env python3
"""The benchmarks that need a GPU (scripts/gpu-bench.sh calls this with the
real libcudart on LD_LIBRARY_PATH). Writes bench/GPU.md, which the next
scripts/bench.sh copies into BENCHMARKS.md, or $OUT/GPU.md where OUT is set
(a device call's folder that comes back: scripts/gpu-session).

  gpu_bench.py [--quick]   --quick: a twentieth of the pairs and at most 2 runs
                           each, to check the script itself (the tests run it
                           so on the simulated runtime); no figures to keep
  BUILD_DIR: the build (default build); CUDACXX: the compiler for the
  static-runtime program (default nvcc); GPU_BENCH_TORCH_STEPS: a stand-in
  for bench/torch_steps.py that needs no PyTorch (the tests').

1. Allocation pairs through the real CUDA runtime: cudaMalloc/cudaFree and
   cudaMallocAsync/cudaFreeAsync (CUDA's own stream-ordered pool), without
   and with gpupool, sizes from the traces (a fixed mix when TRACES_DIR has none);
   plain pairs also beside 128 idle non-blocking streams (PyTorch's stream pool)
   and of one size over and over (a scratch buffer per call), and the same program built with nvcc's default static runtime, under
   GPUPOOL_STATIC_RUNTIME=1.
2. PyTorch training steps, when PyTorch with CUDA is installed: its own
   caching allocator; PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a
   cudaMalloc); the same under gpupool; and the first and last again with
   each step's input made on a side stream (which creates PyTorch's stream
   pool), under gpupool also with GPUPOOL_PLAIN_REUSE_SEARCH=0 (the default,
   auto, searches there for memory that needs no new device barrier, each of
   which that pool's streams wait for). Step time and peak reserved memory.
"""
import datetime
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_runs import machine  # the CPU benchmark's own line: OS, cores, CPU model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD_DIR") or os.path.join(ROOT, "build")
BIN = os.path.join(BUILD, "bin")
LIB = os.path.join(BUILD, "lib", "libgpupool.so")
QUICK = "--quick" in sys.argv[1:]
TORCH_STEPS = os.environ.get("GPU_BENCH_TORCH_STEPS") or os.path.join(ROOT, "bench", "torch_steps.py")


def run_json(cmd, env, runs):
    results = []
    for _ in range(runs):
        # The timeout keeps a hang from eating the GPU lease.
        proc = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            sys.exit(f"gpu_bench: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        out = proc.stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def api_pairs(mode, threads, pairs, working_set, preload, runs=5, extra_env=None, idle_streams=0,
              binary=os.path.join(BIN, "gpupool-bench-api"), singles=None):
    """Medians over runs of ns per pair and pairs per second; with one thread,
    `singles` (a dict) gets the medians of the single-pair percentiles too."""
    if QUICK:
        pairs, runs = max(pairs // 20, 100), min(runs, 2)
    env = {"GPUPOOL_REPORT": "0"}
    if preload:
        env["LD_PRELOAD"] = LIB
    env.update(extra_env or {})
    cmd = [binary, mode, str(threads), str(pairs), str(working_set), str(idle_streams)]
    results = run_json(cmd, env, runs)
    if singles is not None:
        for key in ("single_p50_ns", "single_p99_ns", "clock_ns"):
            singles[key] = statistics.median(r.get(key, 0) for r in results)
    return statistics.median(r["ns_per_pair"] for r in results), statistics.median(r["pairs_per_second"] for r in results)


def code_commit():
    """', on the code of commit X' where git can tell (the tree may be a copy without .git)."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f", on the code of commit {rev}" if rev else ""


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU"


def torch_available():
    if os.environ.get("GPU_BENCH_TORCH_STEPS"):
        return True
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True, timeout=120)
    return probe.returncode == 0


def barrier_figures(report):
    """Device barriers, the waits they made non-blocking streams do and the idle queries they made of them, per
    allocation, from a JSON report."""
    allocations = barriers = waits = queries = 0
    for device in report["devices"].values():
        allocations += device["stats"]["allocation.all.allocated"]
        for s in device["streams"]:
            waits += s["barrier_waits"]
            queries += s.get("idle_queries", 0)
            if s["stream"] == "cudaMalloc/cudaFree":
                barriers += s["fences_recorded"]
    allocations = max(allocations, 1)
    return {"gpupool_barriers_per_allocation": barriers / allocations,
            "gpupool_barrier_waits_per_allocation": waits / allocations,
            "gpupool_idle_queries_per_allocation": queries / allocations}


def torch_steps(env, report_dir=None, runs=3, side_stream=False):
    runs = 1 if QUICK else runs
    cmd = [sys.executable, TORCH_STEPS, "60"] + (["--side-stream"] if side_stream else [])
    results = []
    for i in range(runs):
        e = dict(env)
        report = None
        if report_dir:
            report = os.path.join(report_dir, f"report-{len(os.listdir(report_dir))}.json")
            e.update(LD_PRELOAD=LIB, GPUPOOL_LOG=report, GPUPOOL_LOG_FORMAT="json")
        r = run_json(cmd, e, 1)[0]
        if report:
            with open(report) as f:
                data = json.load(f)
            r["gpupool_reserved_peak"] = sum(d["stats"]["reserved_bytes.all.peak"] for d in data["devices"].values())
            r["gpupool_allocated_peak"] = sum(d["stats"]["allocated_bytes.all.peak"] for d in data["devices"].values())
            r.update(barrier_figures(data))
        results.append(r)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def size_mix():
    traces = os.environ.get("TRACES_DIR", os.path.join(ROOT, "..", "shared", "traces"))
    if glob.glob(os.path.join(traces, "*.csv")):
        return "the real traces' sizes up to 64 MiB"
    return "a fixed mix of 512 B to 64 MiB (no traces in TRACES_DIR on this machine)"


def host_cpu_on_simulated_runtime():
    """The CPU benchmark's single-thread loops, run here on the simulated runtime (build/sim: host memory, no GPU)
    under gpupool: this CPU beside the CPU benchmark's machine (BENCHMARKS.md), and, beside the real runtime's
    figures above, what the real runtime adds. Lines for GPU.md; none where the pack has no simulated runtime."""
    sim = os.path.join(BUILD, "sim")
    if not os.path.exists(os.path.join(sim, "libcudart.so.13")):
        return []
    env = {"LD_LIBRARY_PATH": sim + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}
    figures = {}
    try:  # a failure here must not cost the rest
        for mode in ("plain", "async"):
            one = {}
            mean, _ = api_pairs(mode, 1, 200000, 64, True, runs=3, extra_env=env, singles=one)
            figures[mode] = f"{mean:.0f} ns a pair (single pairs' median {one['single_p50_ns']:.0f} ns)"
        scaling = {1: [], 2: []}  # as the threads figure below, alternated
        for _ in range(3):
            for threads in scaling:
                scaling[threads].append(api_pairs("async", threads, 400000, 64, True, runs=1, extra_env=env)[1])
        ratio = statistics.median(scaling[2]) / statistics.median(scaling[1])
    except (SystemExit, subprocess.TimeoutExpired) as failure:
        print(failure, file=sys.stderr)
        return ["The CPU benchmark's loops on the simulated runtime failed here (see the log).", ""]
    lines = ["The same single-thread loops under gpupool on the simulated runtime (`build/sim`: host memory, no GPU; "
             "medians of 3), as the CPU benchmark runs them (BENCHMARKS.md), on this machine's CPU: "
             f"`cudaMalloc`+`cudaFree` {figures['plain']}, `cudaMallocAsync`+`cudaFreeAsync` {figures['async']}; "
             f"two threads of the latter (64 sizes each, medians of 3 alternated rounds) {ratio:.2f}x one thread's "
             "pairs per second. Where the real runtime's figures are well above these, or its two threads' gain "
             "well below, the difference is the real runtime's (its calls, its libraries in the process), not this "
             "CPU's.", ""]
    print(lines[0], flush=True)
    return lines


def publish(lines, verdicts, finished):
    """Writes what has been measured so far to bench/GPU.md, or $OUT/GPU.md where OUT is set: a run cut short
    by the GPU lease's limit still leaves its figures where they come back."""
    body = list(lines)
    if not finished:
        body += ["The run stopped before the rest of the benchmarks (these figures are all it measured).", ""]
    body += ["| GPU target | verdict | measured |", "|---|---|---|"]
    body += [f"| {t} | {v} | {m} |" for t, v, m in verdicts]
    body.append("")
    text = "\n".join(body)
    out = os.environ.get("OUT")
    with open(os.path.join(out, "GPU.md") if out else os.path.join(ROOT, "bench", "GPU.md"), "w") as f:
        f.write(text + "\n")
    return text


def main():
    lines = ["## GPU", "",
             f"Measured by `scripts/gpu-bench.sh` on {gpu_name()}, host {machine()}, "
             f"{datetime.date.today().isoformat()}{code_commit()}. "
             "Medians of 5 runs (PyTorch: 3 runs), measured side by side in one session.", ""]
    if QUICK:
        lines += ["**A quick run (`--quick`: a twentieth of the pairs, at most 2 runs each), to check the script: "
                  "not figures to keep.**", ""]
    lines += ["### Allocation pairs through the real CUDA runtime", "",
              "`build/bin/gpupool-bench-api MODE THREADS PAIRS WORKING_SET`, with and without "
              f"`LD_PRELOAD=build/lib/libgpupool.so`; sizes: {size_mix()}. `async` without gpupool is CUDA's own "
              "stream-ordered pool.", "",
              "| calls | threads | working set | without gpupool, ns | with gpupool, ns | speed-up |",
              "|---|---:|---:|---:|---:|---:|"]
    speedup = {}
    verdicts = []
    singles = {}  # single-thread runs' single-pair percentiles, by (mode, with gpupool)
    for mode, threads, ws in (("plain", 1, 64), ("async", 1, 64), ("plain", 2, 4), ("async", 2, 4)):
        raw_pairs = 2000 if mode == "plain" else 50000
        if threads == 1:
            singles[(mode, False)], singles[(mode, True)] = {}, {}
        raw, _ = api_pairs(mode, threads, raw_pairs, ws, False, singles=singles[(mode, False)] if threads == 1 else None)
        pooled, _ = api_pairs(mode, threads, 200000, ws, True, singles=singles[(mode, True)] if threads == 1 else None)
        speedup[(mode, threads)] = raw / pooled
        if (mode, threads) == ("plain", 1):
            raw_pooled_plain = pooled
        name = "`cudaMalloc`+`cudaFree`" if mode == "plain" else "`cudaMallocAsync`+`cudaFreeAsync`"
        lines.append(f"| {name} | {threads} | {ws} | {raw:.0f} | {pooled:.0f} | {raw / pooled:.1f}x |")
        print(lines[-1], flush=True)  # partial results survive a later failure
        if (mode, threads) == ("plain", 1):
            verdicts = [("gpupool >= 100x faster than raw cudaMalloc/cudaFree",
                         "met" if speedup[("plain", 1)] >= 100 else "not met", f"{speedup[('plain', 1)]:.0f}x")]
            publish(lines + [""], verdicts, False)
    # PyTorch's stream pool: 128 idle non-blocking streams, each of which every
    # device barrier orders (fewer pairs: a barrier costs calls per stream).
    raw, _ = api_pairs("plain", 1, 2000, 64, False, idle_streams=128)
    pooled, _ = api_pairs("plain", 1, 20000, 64, True, idle_streams=128)
    lines.append(f"| `cudaMalloc`+`cudaFree`, 128 idle non-blocking streams | 1 | 64 | {raw:.0f} | {pooled:.0f} | "
                 f"{raw / pooled:.1f}x |")
    print(lines[-1], flush=True)
    # One size over and over (a scratch buffer taken and freed at every call):
    # a barrier per sweep through its segment's room (BENCHMARKS.md).
    raw, _ = api_pairs("plain", 1, 2000, 1, False)
    pooled, _ = api_pairs("plain", 1, 200000, 1, True)
    lines.append(f"| `cudaMalloc`+`cudaFree`, one size | 1 | 1 | {raw:.0f} | {pooled:.0f} | {raw / pooled:.1f}x |")
    print(lines[-1], flush=True)
    # The same loop built with nvcc's default static runtime: pooled only
    # with GPUPOOL_STATIC_RUNTIME=1, through the driver hook.
    with tempfile.TemporaryDirectory() as build:
        static = os.path.join(build, "bench_api_static")
        nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        made = subprocess.run([nvcc, "-O2", "-std=c++20", "-I", ROOT, f'-DGPUPOOL_SOURCE_DIR="{ROOT}"', "-x", "cu",
                               "-o", static, os.path.join(ROOT, "bench", "bench_api.cpp"),
                               os.path.join(ROOT, "tools", "trace.cpp")], capture_output=True, text=True)
        if made.returncode == 0:
            try:  # not yet checked on a GPU: a failure here must not cost the rest
                raw, _ = api_pairs("plain", 1, 2000, 64, False, binary=static)
                pooled, _ = api_pairs("plain", 1, 200000, 64, True, binary=static,
                                      extra_env={"GPUPOOL_STATIC_RUNTIME": "1"})
                lines.append(f"| `cudaMalloc`+`cudaFree`, static runtime, `GPUPOOL_STATIC_RUNTIME=1` | 1 | 64 | "
                             f"{raw:.0f} | {pooled:.0f} | {raw / pooled:.1f}x |")
            except (SystemExit, subprocess.TimeoutExpired) as failure:
                print(failure, file=sys.stderr)
                lines.append("| `cudaMalloc`+`cudaFree`, static runtime, `GPUPOOL_STATIC_RUNTIME=1` | 1 | 64 | "
                             "failed (see the log) | | |")
        else:
            lines.append("| `cudaMalloc`+`cudaFree`, static runtime | 1 | 64 | nvcc failed | | |")
        print(lines[-1], flush=True)
    lines.append("")
    def single(mode, pooled):
        one = singles[(mode, pooled)]
        return f"median {one['single_p50_ns']:.0f} ns, 99th percentile {one['single_p99_ns']:.0f} ns"
    lines += ["Single-thread pairs timed one by one after each loop (up to 100,000 of them; each figure includes two "
              f"clock reads, {singles[('plain', True)]['clock_ns']:.0f} ns together): `cudaMalloc`+`cudaFree` "
              f"under gpupool {single('plain', True)} (without: {single('plain', False)}); `cudaMallocAsync`+"
              f"`cudaFreeAsync` under gpupool {single('async', True)} (CUDA's pool: {single('async', False)}). "
              "The loops' figures above are means, in which the pairs that record a device barrier count in "
              "every pair.", ""]
    publish(lines, verdicts, False)

    # Where a plain pair's time goes: the same loop with the device barrier
    # (cudaFree's ordering, one event on the legacy stream) skipped. Unsafe,
    # for measuring only; and the barriers per pair from a report.
    unordered, _ = api_pairs("plain", 1, 200000, 64, True,
                             extra_env={"GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING": "1"})
    # And the pool's own share of each pair, from the report's sampled
    # estimate (one operation in 64 timed; barriers' records included): the
    # rest is the shim's and the runtime's, which tells this machine's CPU
    # apart from what gpupool adds around the pool.
    in_pool = {}
    with tempfile.TemporaryDirectory() as reports:
        for mode in ("plain", "async"):
            report = os.path.join(reports, f"{mode}.json")
            api_pairs(mode, 1, 200000, 64, True, runs=1,
                      extra_env={"GPUPOOL_REPORT": "1", "GPUPOOL_LOG": report, "GPUPOOL_LOG_FORMAT": "json"})
            with open(report) as f:
                data = json.load(f)
            if mode == "plain":
                barriers = barrier_figures(data)["gpupool_barriers_per_allocation"]
            upstream = data["devices"]["0"]["upstream"]
            in_pool[mode] = 2 * upstream["pool_ns_estimated"] / max(upstream["pool_operations"], 1)
    ordered = raw_pooled_plain
    lines += ["Where the single-thread `cudaMalloc`+`cudaFree` pair's time goes: the same loop with "
              "`GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1` (no device barrier; unsafe, for measuring only) took "
              f"{unordered:.0f} ns; with the barriers, {ordered:.0f} ns, at {barriers:.2f} barriers (one "
              "`cudaEventRecord` on the legacy stream each) per pair"
              + (f", so one barrier costs about {(ordered - unordered) / barriers:.0f} ns here." if barriers > 0
                 else "."),
              "",
              "Inside the pool, by gpupool's report of one more run of each loop (its sampled estimate: one "
              f"operation in 64 timed, with its two clock reads, barriers included): {in_pool['plain']:.0f} ns of each plain pair and "
              f"{in_pool['async']:.0f} ns of each stream-ordered pair; the rest of a pair is the shim's and the "
              "runtime's. The CPU benchmark's simulated runtime gives the same estimate for comparison.", ""]
    lines += host_cpu_on_simulated_runtime()
    publish(lines, verdicts, False)
    # The CPU benchmark's threads target on this machine's cores: stream-ordered
    # pairs under gpupool cycling through 64 sizes each (more than a thread's
    # cache holds), one thread and two, alternated.
    scaling = {1: [], 2: []}
    for _ in range(5):
        for threads in scaling:
            scaling[threads].append(api_pairs("async", threads, 400000, 64, True, runs=1)[1])
    ratio = statistics.median(scaling[2]) / statistics.median(scaling[1])
    lines += [f"Two threads of `cudaMallocAsync`+`cudaFreeAsync` pairs under gpupool, 64 sizes each "
              f"(`gpupool-bench-api async T 400000 64`, 1 and 2 threads alternated, medians of 5; "
              f"{os.cpu_count()} cores): {ratio:.2f}x one thread's pairs per second.", ""]
    print(lines[-2], flush=True)
    publish(lines, verdicts, False)

    if torch_available():
        with tempfile.TemporaryDirectory() as reports:
            caching = torch_steps({})
            no_caching = torch_steps({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
            pooled = torch_steps({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, report_dir=reports)
        gib = 2**30
        if os.environ.get("GPU_BENCH_TORCH_STEPS"):
            lines += [f"**The steps below are {TORCH_STEPS}'s (`GPU_BENCH_TORCH_STEPS`), not PyTorch's.**", ""]
        lines += ["### PyTorch training steps", "",
                  "`python3 bench/torch_steps.py 60`: an 8-layer transformer encoder, sequence length changing "
                  "every step; median step time after 5 warm-up steps.", "",
                  "| allocator | ms per step | peak reserved | peak allocated |", "|---|---:|---:|---:|",
                  f"| PyTorch's caching allocator | {caching['ms_per_step']:.1f} | "
                  f"{caching['torch_reserved_peak'] / gib:.2f} GiB | {caching['torch_allocated_peak'] / gib:.2f} GiB |",
                  f"| `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (raw cudaMalloc) | {no_caching['ms_per_step']:.1f} | "
                  "not tracked | not tracked |",  # PyTorch keeps no statistics without its cache
                  f"| `PYTORCH_NO_CUDA_MEMORY_CACHING=1` under gpupool | {pooled['ms_per_step']:.1f} | "
                  f"{pooled['gpupool_reserved_peak'] / gib:.2f} GiB | {pooled['gpupool_allocated_peak'] / gib:.2f} GiB |",
                  ""]
        time_ratio = pooled["ms_per_step"] / caching["ms_per_step"]
        memory_ratio = pooled["gpupool_reserved_peak"] / caching["torch_reserved_peak"]
        verdicts.append(("PyTorch under gpupool within 5% of its own allocator in step time",
                         "met" if time_ratio <= 1.05 else "not met", f"{time_ratio:.3f}x"))
        verdicts.append(("PyTorch under gpupool not above its own allocator in peak memory",
                         "met" if memory_ratio <= 1.0 else "not met", f"{memory_ratio:.3f}x"))
        publish(lines, verdicts, False)
        with tempfile.TemporaryDirectory() as reports:
            caching_side = torch_steps({}, side_stream=True)
            pooled_side = torch_steps({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, report_dir=reports, side_stream=True)
            unsearched_side = torch_steps({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUPOOL_PLAIN_REUSE_SEARCH": "0"},
                                          report_dir=reports, side_stream=True)
        lines += ["With each step's input made on a side stream (`--side-stream`); asking for one makes PyTorch "
                  "create its stream pool (32 non-blocking streams per priority level), and every gpupool device "
                  "barrier orders each of them:", "",
                  "| allocator, input on a side stream | ms per step | peak reserved | peak allocated |",
                  "|---|---:|---:|---:|",
                  f"| PyTorch's caching allocator | {caching_side['ms_per_step']:.1f} | "
                  f"{caching_side['torch_reserved_peak'] / gib:.2f} GiB | "
                  f"{caching_side['torch_allocated_peak'] / gib:.2f} GiB |",
                  f"| `PYTORCH_NO_CUDA_MEMORY_CACHING=1` under gpupool | "
                  f"{pooled_side['ms_per_step']:.1f} | {pooled_side['gpupool_reserved_peak'] / gib:.2f} GiB | "
                  f"{pooled_side['gpupool_allocated_peak'] / gib:.2f} GiB |",
                  f"| the same with `GPUPOOL_PLAIN_REUSE_SEARCH=0` (no search) | "
                  f"{unsearched_side['ms_per_step']:.1f} | {unsearched_side['gpupool_reserved_peak'] / gib:.2f} GiB | "
                  f"{unsearched_side['gpupool_allocated_peak'] / gib:.2f} GiB |",
                  "",
                  "Per allocation under gpupool (from its reports): "
                  f"{pooled['gpupool_barriers_per_allocation']:.3f} barriers and "
                  f"{pooled['gpupool_barrier_waits_per_allocation']:.1f} barrier waits without the side stream, "
                  f"{pooled_side['gpupool_barriers_per_allocation']:.3f} barriers, "
                  f"{pooled_side['gpupool_barrier_waits_per_allocation']:.1f} barrier waits and "
                  f"{pooled_side['gpupool_idle_queries_per_allocation']:.1f} idle queries with it, "
                  f"{unsearched_side['gpupool_barriers_per_allocation']:.3f}, "
                  f"{unsearched_side['gpupool_barrier_waits_per_allocation']:.1f} and "
                  f"{unsearched_side['gpupool_idle_queries_per_allocation']:.1f} with it and no search.", ""]
        side_ratio = pooled_side["ms_per_step"] / caching_side["ms_per_step"]
        verdicts.append(("The same with a side stream (PyTorch's stream pool) within 5% in step time",
                         "met" if side_ratio <= 1.05 else "not met", f"{side_ratio:.3f}x"))
    else:
        lines += ["PyTorch with CUDA was not installed on the GPU machine; its comparison was not run.", ""]

    print(publish(lines, verdicts, True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
