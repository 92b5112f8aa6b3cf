#!/usr/bin/env python3
"""Runs every CPU benchmark and writes BENCHMARKS.md (scripts/bench.sh calls this).

Each figure is measured side by side in one run and reported as a median of
repeated runs, with the command that produced it. Targets are judged here,
in the report, never in a timed test.

  run_benchmarks.py                 every benchmark; rewrites BENCHMARKS.md
  run_benchmarks.py --instructions  gpupool's instructions per pair only
  run_benchmarks.py --quick         every section with a few runs, pairs and
                                    rounds, to show the script works (the
                                    tests run it so); writes $OUT/BENCHMARKS.md
                                    where OUT is set, never the committed one
BUILD_DIR names the build (build-bench), TRACES_DIR the traces.
"""
import datetime
import json
import os
import statistics
import sys

from bench_runs import (BIN, BUILD, INSTRUCTION_PAIRS, LIB, QUICK, ROOT, SIM, TRACES, api_pairs, bench_api,
                        code_version, count, counted_plain_loop, google_benchmark, held_memory_rows,
                        interleaved_ratio, machine, ordering_calls, own_instructions_per_pair, replay, sh)


# PyTorch's own reserved bytes on the same runs (from the traces' README).
PYTORCH_RESERVED = {
    "lora-finetune-1.3b.csv": 6_471_811_072,
    "lm-train-a.csv": 14_180_941_824,
    "multistream-10.csv": 22_519_218_176,
    "gpt-medium-ctx128-train.csv": 7_235_174_400,
    "gpt-medium-ctx512-infer.csv": 1_981_808_640,
}


def cache_hit_latency(traces, verdicts):
    """1. Cache-hit latency: pool pairs, API pairs (loop and single), instructions, replay ns/op."""
    lines = []
    gb = google_benchmark("BM_(MallocFreePair|PoolPair_.*)")
    malloc_ns = gb["BM_MallocFreePair"]
    lines += ["## 1. Cache-hit latency", "",
              "An allocate+free pair served from the cache, sizes cycling through every allocation size of the "
              "traces, one thread. `build-bench/bin/gpupool-bench --benchmark_filter='BM_(MallocFreePair|PoolPair_.*)' "
              "--benchmark_repetitions=5` (pool level, no locking), and `gpupool-bench-api` through the CUDA API "
              "under `LD_PRELOAD` on the simulated runtime.", "",
              "| what | median ns per pair | vs glibc malloc+free |", "|---|---:|---:|",
              f"| glibc `malloc`+`free`, same sizes | {malloc_ns:.0f} | 1.00 |"]
    for name, label in (("BM_PoolPair_Stream/expandable:1", "pool, stream-ordered, expandable segments (default)"),
                        ("BM_PoolPair_Stream/expandable:0", "pool, stream-ordered, fixed segments"),
                        ("BM_PoolPair_Plain/expandable:1", "pool, plain cudaMalloc/cudaFree, expandable segments"),
                        ("BM_PoolPair_Plain/expandable:0", "pool, plain cudaMalloc/cudaFree, fixed segments")):
        lines.append(f"| {label} | {gb[name]:.0f} | {gb[name] / malloc_ns:.2f} |")
    # The four loops' runs interleaved: this machine's processes run fast or
    # about twice as slow in spells, which would otherwise land on one loop.
    loops = {"async": ("async", count(200000, 2000), True), "raw async": ("async", count(200000, 2000), False),
             "plain": ("plain", count(200000, 2000), True), "raw plain": ("plain", count(20000, 500), False)}
    results = {key: [] for key in loops}
    for _ in range(count(5, 1)):
        for key, (mode, pairs, preload) in loops.items():
            results[key].append(bench_api(mode, 1, pairs, preload))
    api = {key: statistics.median(r["ns_per_pair"] for r in rs) for key, rs in results.items()}
    singles = {key: {stat: statistics.median(r[stat] for r in rs)
                     for stat in ("single_p50_ns", "single_p90_ns", "single_p99_ns", "clock_ns")}
               for key, rs in results.items()}
    for mode in ("async", "plain"):
        raw = api["raw " + mode]
        lines.append(f"| `cudaMalloc{'Async' if mode == 'async' else ''}`+free through the shim (simulated runtime) "
                     f"| {api[mode]:.0f} | {api[mode] / malloc_ns:.2f} |")
        lines.append(f"| the same calls without gpupool (simulated runtime) | {raw:.0f} | {raw / malloc_ns:.2f} |")
    lines += ["", "The same API loops, each pair then timed on its own (the next 100,000 pairs of each run, medians "
              "of the 5 runs' percentiles; the four loops' runs interleaved). The loop's figure above is a mean, "
              "which folds the few pairs that record a device barrier into every pair; here they show in the tail. "
              "Each figure includes the two clock reads around the pair, whose own median cost is the last column "
              "(it moves with the machine's spells, as the pairs do).", "",
              "| what | median pair ns | 90th percentile | 99th percentile | loop's mean | clock reads |",
              "|---|---:|---:|---:|---:|---:|"]
    for mode, label in (("async", "`cudaMallocAsync`+free through the shim"),
                        ("raw async", "the same calls without gpupool"),
                        ("plain", "`cudaMalloc`+free through the shim"),
                        ("raw plain", "the same calls without gpupool")):
        one = singles[mode]
        lines.append(f"| {label} | {one['single_p50_ns']:.0f} | {one['single_p90_ns']:.0f} | "
                     f"{one['single_p99_ns']:.0f} | {api[mode]:.0f} | {one['clock_ns']:.0f} |")
    in_pool = {mode: 2 * bench_api(mode, 1, count(200000, 2000), True, reserved=True)["pool_ns_per_op"]
               for mode in ("async", "plain")}
    lines += ["", "Inside the pool, by gpupool's report of one more run of each API loop (its sampled estimate: one "
              f"operation in 64 timed, with its two clock reads, barriers included): {in_pool['plain']:.0f} ns of each plain pair and "
              f"{in_pool['async']:.0f} ns of each stream-ordered pair; the rest of a pair is the shim's and the "
              "simulated runtime's. `scripts/gpu-bench.sh` gives the same estimate on a GPU machine (bench/GPU.md)."]
    plain, stream, unordered = (own_instructions_per_pair(mode, env) for mode, env, _ in INSTRUCTION_PAIRS)
    lines += ["", f"gpupool's own instructions per pair, counted by callgrind (`bench/run_benchmarks.py "
              f"--instructions`; its two libraries only, the simulated runtime's and libc's left out, a barrier's "
              f"included): {plain:.0f} per plain pair and {stream:.0f} per stream-ordered pair; {unordered:.0f} "
              "per plain pair with `GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1` (unsafe), which shows what ordering "
              "costs a plain pair. Unlike the times, these are the same for this build on any machine."]
    lines += ["", "The build alone moves these figures by about a tenth: on 2026-12-03 the same source (commit "
              "308ace4), built in two folders and run alternately (`gpupool-bench "
              "--benchmark_filter=BM_PoolPair_Plain --benchmark_repetitions=5` from each), gave the plain pool pair 99-101 ns in one and 106-111 ns in the "
              "other, though the pair's hot functions were the same instructions at the same addresses (the "
              "folder's path is compiled into the benchmark); the cause was not found."]
    # Judged on the default segments, at pool level (the API's figures are
    # the simulated runtime's), each kind of pair on its own.
    pool_stream, pool_plain = gb["BM_PoolPair_Stream/expandable:1"], gb["BM_PoolPair_Plain/expandable:1"]
    within = [ns <= 100 and ns <= 5 * malloc_ns for ns in (pool_stream, pool_plain)]
    verdict1 = ("met at pool level" if all(within) else
                "met at pool level for stream-ordered pairs, not for plain ones" if within[0] else
                "met at pool level for plain pairs, not for stream-ordered ones" if within[1] else "not met")
    # Through the API a kind of pair counts only where both its loop's mean
    # and its single pairs' median (clock reads included) are within 100 ns.
    api_within = [api[mode] <= 100 and singles[mode]["single_p50_ns"] <= 100 for mode in ("async", "plain")]
    verdict1 += ("; through the API too" if all(api_within) else
                 "; through the API for stream-ordered pairs only" if api_within[0] else
                 "; through the API for plain pairs only" if api_within[1] else "; not through the API")
    verdicts.append(("Cache-hit pair <= 100 ns, within 5x of malloc+free", verdict1,
                     f"pool pair {pool_stream:.0f} ns stream-ordered, {pool_plain:.0f} ns plain (malloc+free "
                     f"{malloc_ns:.0f} ns on these sizes, which glibc serves with mmap); through the API "
                     f"{api['async']:.0f} ns stream-ordered, {api['plain']:.0f} ns plain (a plain reuse may record "
                     "one cudaEventRecord barrier); single pairs through the API, median "
                     f"{singles['async']['single_p50_ns']:.0f} ns stream-ordered and "
                     f"{singles['plain']['single_p50_ns']:.0f} ns plain, clock reads included (their own median: "
                     f"{singles['async']['clock_ns']:.0f} and {singles['plain']['clock_ns']:.0f} ns)"))
    lines += ["", "Replay cost per trace operation (2 passes, default settings):", "",
              "| trace | ns per operation |", "|---|---:|"]
    for r in replay(["--passes", "2"] + traces):
        lines.append(f"| {r['trace']} | {r['ns_per_op']:.0f} |")
    lines.append("")
    return lines


def scale(verdicts):
    """2. Scale: the pair with 1 thousand to 1 million live blocks."""
    lines = []
    # Rounds of the three sizes in turn, each a process of its own:
    # this machine moves between a fast and a slow state (the 1,000-block pair
    # took 66-70 ns in most processes and 113-120 ns in some, on 2026-12-05),
    # and one process running the sizes one after another could put the
    # smallest in one state and the largest in the other (2.41x once, where
    # the sizes measured in one state gave 1.36-1.48x). The growth is the
    # median of the rounds' ratios.
    live_counts = ("1000", "100000", "1000000")
    scale = {n: [] for n in live_counts}
    growths = []
    for _ in range(count(7, 1)):
        for n in live_counts:
            scale[n].append(google_benchmark(f"BM_PoolPairWithLive/live:{n}$", repetitions=3)
                            [f"BM_PoolPairWithLive/live:{n}"])
        growths.append(scale["1000000"][-1] / scale["1000"][-1])
    growth = statistics.median(growths)
    lines += ["## 2. Scale", "",
              "The same pair with many blocks live. `gpupool-bench --benchmark_filter=BM_PoolPairWithLive/live:N$ "
              "--benchmark_repetitions=3` for each N in turn, 7 rounds; each figure is the median of the rounds' "
              "medians, and the growth the median of the rounds' ratios (1,000,000 against 1,000 live blocks, "
              f"measured within a few seconds of each other): {growth:.2f}x, the rounds ranging "
              f"{min(growths):.2f}-{max(growths):.2f}x.", "",
              "| live blocks | median ns per pair |", "|---:|---:|"]
    for n in live_counts:
        lines.append(f"| {int(n):,} | {statistics.median(scale[n]):.0f} |")
    verdicts.append(("Growth <= 2x from 1 thousand to 1 million live blocks",
                     "met" if growth <= 2 else "not met", f"{growth:.2f}x (rounds {min(growths):.2f}-{max(growths):.2f}x)"))
    lines.append("")
    return lines


def threads(verdicts):
    """3. Threads: stream-ordered pairs with per-thread caches; plain pairs under one lock."""
    lines = []
    lines += ["## 3. Threads", "",
              "Pairs of `cudaMallocAsync`/`cudaFreeAsync`, each thread on its own stream cycling through its own "
              "WORKING_SET trace sizes (up to 64 MiB each), through the shim on the simulated runtime: "
              "`LD_PRELOAD=build-bench/lib/libgpupool.so build-bench/bin/gpupool-bench-api async THREADS PAIRS "
              "WORKING_SET`. A thread's freed blocks stay in its own cache (at most 64 blocks and 256 MiB; "
              "a block serves requests up to a quarter smaller than itself; a full cache keeps the smaller "
              "blocks, but lets a block go for one of its stream up to a quarter larger, and keeps the last block "
              "that did not fit, if at most 64 MiB, until the thread's next allocation the cache cannot serve, "
              "which returns it under the lock it takes anyway); the rest go through the device pool, which one "
              "lock guards. The traces have 60 distinct sizes up to 64 MiB (519 MiB together), so with 64 sizes "
              "per thread each thread cycles through all 60, which blocks of 224 MiB together serve. The caches "
              "switch on only with "
              "a second thread, so one thread's pairs go through the pool: a ratio above 2 on 2 cores means the "
              "caches serve a pair faster than the pool does. Only the pair loops are timed: each thread first "
              "makes one pair of each of its sizes (the pool takes its memory from the device then), and the "
              "clock runs from when every thread has done so to when the last one finishes. The thread counts' runs are interleaved (1, 2, 4, "
              "1, 2, 4, ...) and each figure is the median of 9; the last column gives the lowest and highest "
              "of the 9 rounds' ratios (each round's runs side by side), which shows how much a single run can "
              "stray on this machine. The last column is what the caches cost in memory: the pool's peak reserved "
              "memory (the report's `reserved_bytes.all.peak`, median of the 9), where one thread's pairs, each "
              "freed before the next, need a block at a time. Blocks a thread keeps serve only that thread, and "
              "the pool grows beside them until it takes them back.", "",
              "| working set per thread | threads | median ns per pair | pairs per second, all threads | vs 1 thread "
              "| rounds' range | peak reserved |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    scaling = {}
    for ws in (4, 64):
        # Interleaved, so that a slow spell of the machine does not land on one thread count.
        runs = {t: [] for t in (1, 2, 4)}
        for _ in range(count(9, 1)):
            for t in runs:
                r = bench_api("async", t, count(400000, 2000), True, ws, reserved=True)  # pairs per thread
                runs[t].append((r["ns_per_pair"], r["pairs_per_second"], r["reserved"]))
        one = None
        for t, results in runs.items():
            ns = statistics.median(r[0] for r in results)
            pps = statistics.median(r[1] for r in results)
            one = one or pps
            scaling[(ws, t)] = pps / one
            rounds = [r[1] / single[1] for r, single in zip(results, runs[1])]
            reserved = statistics.median(r[2] for r in results) / 2**20
            lines.append(f"| {ws} | {t} | {ns:.0f} | {pps:,.0f} | {pps / one:.2f} "
                         f"| {min(rounds):.2f}-{max(rounds):.2f} | {reserved:.0f} MiB |")
    two_small, two_large = scaling[(4, 2)], scaling[(64, 2)]
    verdicts.append(("2 threads >= 1.5x one thread",
                     "met" if min(two_small, two_large) >= 1.5 else
                     ("met only for working sets that fit the per-thread cache" if two_small >= 1.5 else "not met"),
                     f"{two_small:.2f}x with 4 sizes per thread, {two_large:.2f}x with 64 sizes per thread"))
    lines += ["", "Plain `cudaMalloc`/`cudaFree` pairs (`gpupool-bench-api plain THREADS PAIRS 64`, the same runs "
              "interleaved) have no per-thread cache: every pair takes the device's lock twice, and a reuse may "
              "record a device barrier under it. Waiters spin for up to 10 us before they sleep, reading the lock "
              "word after pauses that double up to 128 `pause` instructions (each read takes the word's cache line "
              "from the holder). "
              "No target; the ratio shows what the lock costs when threads share it.", "",
              "| threads | median ns per pair | pairs per second, all threads | vs 1 thread |",
              "|---:|---:|---:|---:|"]
    runs = {t: [] for t in (1, 2, 4)}
    for _ in range(count(5, 1)):
        for t in runs:
            runs[t].append(api_pairs("plain", t, count(200000, 2000), True, runs=1))  # per thread
    one = None
    for t, results in runs.items():
        ns = statistics.median(r[0] for r in results)
        pps = statistics.median(r[1] for r in results)
        one = one or pps
        lines.append(f"| {t} | {ns:.0f} | {pps:,.0f} | {pps / one:.2f} |")
    lines.append("")
    return lines


def preload_cost(verdicts):
    """4. Preload cost where CUDA is never used."""
    lines = []
    plain = dict(os.environ)
    preload = dict(os.environ, LD_PRELOAD=LIB)
    fork_script = ["sh", "-c", "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done"]
    true_ratio = interleaved_ratio(["/bin/true"], preload, plain)
    fork_ratio = interleaved_ratio(fork_script, preload, plain, rounds=7, runs=3)
    lines += ["## 4. Preload cost where CUDA is never used", "",
              "Wall time with `LD_PRELOAD=build-bench/lib/libgpupool.so` over without, runs interleaved "
              "(`bench/run_benchmarks.py`, `interleaved_ratio`).", "",
              "| command | with / without |", "|---|---:|",
              f"| `/bin/true` | {true_ratio:.3f} |",
              f"| a shell script starting 100 `/bin/true` | {fork_ratio:.3f} |", ""]
    verdicts.append(("Preload cost <= 1.2x", "met" if max(true_ratio, fork_ratio) <= 1.2 else "not met",
                     f"/bin/true {true_ratio:.3f}x, 100 children {fork_ratio:.3f}x"))
    return lines


def memory(traces, verdicts):
    """5. Memory: every trace replayed against PyTorch's reservation, and held memory as threads and streams come and go. Returns the lines and the default replay's rows by trace."""
    lines = []
    default = {r["trace"]: r for r in replay(["--passes", "2"] + traces)}
    sweep = ["--passes", "2", "--tune"]
    best = {}

    def rank(r):  # as the replay ranks them: the lowest peak, then the fewest ordering calls
        return r["peak_reserved_bytes"], ordering_calls(r)

    for r in replay(sweep + traces):
        if r["ooms"] == 0 and (r["trace"] not in best or rank(r) < rank(best[r["trace"]])):
            best[r["trace"]] = r
    lines += ["## 5. Memory", "",
              "Every trace replayed twice back to back through the pool (`build-bench/bin/gpupool-replay --passes 2 "
              "TRACE`), against PyTorch's own reservation on the same run. The best configuration comes from "
              "`gpupool-replay " + " ".join(sweep) + " TRACE`.", "",
              "| trace | peak live | PyTorch reserved (ratio) | gpupool default reserved (ratio) | vs PyTorch "
              "| best swept (ratio) | best GPUPOOL_CONF |", "|---|---:|---:|---:|---:|---:|---|"]
    all_default_ok = all_best_ok = True
    for name in sorted(default):
        d, b = default[name], best[name]
        live = d["peak_live_bytes"]
        torch = PYTORCH_RESERVED.get(name)
        torch_cell = f"{torch / 2**30:.2f} GiB ({torch / live:.4f})" if torch else "n/a"
        vs = f"{d['peak_reserved_bytes'] / torch:.4f}" if torch else "n/a"
        if torch and d["peak_reserved_bytes"] > torch:
            all_default_ok = False
        if b["peak_reserved_to_peak_live"] > 1.03:
            all_best_ok = False
        lines.append(f"| {name} | {live / 2**30:.2f} GiB | {torch_cell} | {d['peak_reserved_bytes'] / 2**30:.2f} GiB "
                     f"({d['peak_reserved_to_peak_live']:.4f}) | {vs} | {b['peak_reserved_to_peak_live']:.4f} | "
                     f"`{b['conf']}` |")
    # Threads that come and go: each one's block must serve the next.
    churn = ["gpupool-bench-api", "churn", "2000", "PAUSE"]
    lines += ["", "Threads that come and go: 2000 threads one after another, each making one 1 MiB "
              "`cudaMallocAsync`/`cudaFreeAsync` pair on its per-thread default stream and ending "
              f"(`LD_PRELOAD=build-bench/lib/libgpupool.so build-bench/bin/{' '.join(churn)}` on the simulated "
              "runtime, 3 runs each; one thread's pair needs 1 MiB, in a 2 MiB segment or page; PAUSE "
              "microseconds between one thread's end and the next one's start). A block freed on an ended "
              "thread's stream is taken by the next thread once a completion fence is recorded after the free: "
              "its event on the legacy stream follows the ended thread's work, and the next thread's per-thread "
              "stream follows the legacy stream, so the block's new work waits for its old work on the device "
              "and the pool need not grow while the device is behind. The report keeps a row for the first "
              "63 ended threads' streams and one for the rest.", "",
              "| segments | pause | peak reserved, median (lowest-highest) | from cache | us per thread | stream "
              "rows in the report |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += held_memory_rows("churn", count(2000, 20), (100,), "us_per_thread", lambda runs: max(r["stream_rows"] for r in runs))
    # A stream made for each task: each task's block must serve the next.
    lines += ["", "A stream for each task: one thread makes 300 tasks one after another, each a non-blocking stream, "
              "a 1 MiB `cudaMallocAsync`, a `cudaMemsetAsync` and a `cudaFreeAsync` on it, and the stream "
              "destroyed (`LD_PRELOAD=build-bench/lib/libgpupool.so build-bench/bin/gpupool-bench-api tasks 300 "
              "PAUSE`, 3 runs each). A destroyed stream's blocks get a key of their own and an event recorded "
              "on the stream at the destroy: once it has completed (with a pause, by the next task's look), they "
              "are taken with no call; while the last task's work is in flight, the next task's stream waits for "
              "that event on the device (one `cudaStreamWaitEvent`; a device barrier before stop 60, which made "
              "it wait for every busy stream). Since stop 61 that one event also keeps barriers waiting (a second "
              "served them before), and a completion fence made while it is pending waits for it rather than "
              "being made a barrier: under `GPUPOOL_CROSS_STREAM_REUSE=completed`, which never makes a stream "
              "wait, 100 tasks with no pause and 1 ms simulated operations had made 4,280-4,809 stream waits "
              "through such barriers (5.6-7.3 ms a task, two runs), and make none now (2.1-2.2 ms a task; that "
              "policy takes new memory for the tasks still in flight: 124-160 MiB there). "
              "(Before stop 59 an expandable segment mapped a new page every task or two with pauses: 22 MiB "
              "with 1 ms, 274 MiB with 10 ms.) The last two rows add a long-lived non-blocking stream that the "
              "program keeps fed: 11 `cudaMemsetAsync` calls on it before each task, where each simulated "
              "operation takes 1 ms (`SIMCUDA_OP_DELAY_US=1000`, `gpupool-bench-api tasks 300 10000 11`), so "
              "it falls ever further behind and no completion fence completes (before the destroyed stream's "
              "own event, the pool grew with the tasks there: 36-92 MiB in three runs on expandable segments).", "",
              "| segments | pause | peak reserved, median (lowest-highest) | from cache | us per task |",
              "|---|---:|---:|---:|---:|"]
    lines += held_memory_rows("tasks", count(300, 10), (1000, 10000), "us_per_task")
    busy_rows = held_memory_rows("tasks", count(300, 10), (10000,), "us_per_task", busy=11,
                                 extra_env={"SIMCUDA_OP_DELAY_US": "1000"}, zero_pause=False)
    lines += [row.replace(" | 10000 us |", " | 10000 us, a busy stream |") for row in busy_rows]
    verdicts.append(("Default reserves no more than PyTorch on every trace", "met" if all_default_ok else "not met",
                     "see the table"))
    verdicts.append(("Best swept configuration within 3% of peak live on every trace",
                     "met" if all_best_ok else "not met", "see the table"))
    lines.append("")
    return lines, default


def ordering_call_counts(traces, default):
    """Ordering calls: the event calls each trace would make on a GPU, and those of the API loops."""
    lines = []
    plain = {r["trace"]: r for r in replay(["--passes", "2", "--plain"] + traces)}
    beside = {r["trace"]: r for r in replay(["--passes", "2", "--plain", "--idle-streams", "64",
                                             "--conf", "plain_reuse_search:0"] + traces)}
    searched = {r["trace"]: r for r in replay(["--passes", "2", "--plain", "--idle-streams", "64"] + traces)}
    lines += ["## Ordering calls", "",
              "Event calls the pool would make on a GPU to order reuse, per allocation: every trace replayed twice "
              "as recorded (stream-ordered, `gpupool-replay --passes 2 --json TRACE`) and as plain "
              "`cudaMalloc`/`cudaFree` with no stream (`--plain`: a program under "
              "`PYTORCH_NO_CUDA_MEMORY_CACHING=1`), where each reuse of memory freed since the last device "
              "barrier records a new one (one `cudaEventRecord` on the legacy stream). The replay's device keeps "
              "up, so these are lower bounds for queries. The last column adds 64 non-blocking streams that run "
              "nothing (`--plain --idle-streams 64 --conf plain_reuse_search:0`, as PyTorch's stream pool, with "
              "the search below off): every call the ordering makes, "
              "per allocation, when each barrier finds them idle and the device caught up (one query each, and "
              "the legacy stream's event recorded first and queried once); where that event has not completed "
              "by then, each stream also waits for it, and one found busy costs a record and a wait more. "
              "The last three columns are the same with the default `plain_reuse_search` (auto, "
              "`GPUPOOL_PLAIN_REUSE_SEARCH`), which beside 8 or more non-blocking streams looks at 16 larger "
              "free blocks for covered memory before recording a barrier: fewer barriers, for more memory. "
              "Without such streams (the columns before) it does not search.", "",
              "| trace | stream-ordered: records | queries | plain: barriers | records | queries "
              "| plain peak reserved / live | plain, 64 idle streams, no search: calls "
              "| the same, default (search 16): barriers | calls | peak reserved / live |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(default):
        d, p, b, s = default[name], plain[name], beside[name], searched[name]
        n = d["allocations"]
        lines.append(f"| {name} | {d['events_recorded'] / n:.3f} | {d['event_queries'] / n:.3f} | "
                     f"{p['barriers'] / n:.3f} | {p['events_recorded'] / n:.3f} | {p['event_queries'] / n:.3f} | "
                     f"{p['peak_reserved_to_peak_live']:.4f} | {ordering_calls(b) / n:.1f} | "
                     f"{s['barriers'] / n:.3f} | {ordering_calls(s) / n:.1f} | {s['peak_reserved_to_peak_live']:.4f} |")
    # The API loop of plain pairs that the GPU target times: its barriers, as
    # the simulated runtime counts its event records (no other stream exists,
    # so each barrier is one record on the legacy stream).
    pairs = count(200000, 2000)
    loop, calls = counted_plain_loop(pairs, 64)
    legacy_records = calls["event_records"]
    lines += ["", f"The loop of plain pairs that the GPU target times (`gpupool-bench-api plain 1 {pairs} 64` under "
              f"`LD_PRELOAD` on the simulated runtime, whose `SIMCUDA_COUNTERS_FILE` counts the calls) records "
              f"{legacy_records} events over its {loop['pairs_made']} pairs (warm-up and single pairs included), "
              f"each a barrier's one `cudaEventRecord` on the legacy stream: "
              f"{legacy_records / loop['pairs_made']:.2f} per pair "
              f"({loop['ns_per_pair']:.0f} ns per pair on the simulated runtime). It calls `cudaGetDevice` "
              f"{calls['get_device_calls']} time{'' if calls['get_device_calls'] == 1 else 's'} in all: where the "
              "process sees one device, that "
              "device is always the current one, so neither a `cudaMalloc` (whose memory is the current device's) "
              "nor a barrier's event needs to ask, and a `cudaFree` finds its block in the only device's pool "
              "without asking (with more devices visible, a `cudaMalloc` and a barrier ask once each)."]
    # The same loop beside PyTorch's stream pool: 128 non-blocking streams that
    # run nothing, each of which every barrier orders.
    pairs = count(20000, 200)
    loop, calls = counted_plain_loop(pairs, 64, 128)
    lines += ["", f"With 128 idle non-blocking streams beside it (`gpupool-bench-api plain 1 {pairs} 64 128`; PyTorch "
              "creates 32 per priority level once a program asks for a side stream), every barrier also orders "
              f"each of them: {calls['event_records'] / loop['pairs_made']:.1f} event records and "
              f"{calls['stream_waits'] / loop['pairs_made']:.1f} stream waits per pair ({loop['ns_per_pair']:.0f} ns per pair on "
              "the simulated runtime, whose streams are still busy with the previous barrier's waits when the next "
              "asks: a barrier skips a stream only when it is found idle)."]
    # A loop of one size: a scratch buffer taken and freed at every call.
    pairs = count(20000, 2000)
    loop, calls = counted_plain_loop(pairs, 1)
    lines += ["", f"A loop of one size (`gpupool-bench-api plain 1 {pairs} 1`: one of those sizes over and over, as a "
              f"program that takes and frees a scratch buffer at every call) records {calls['event_records']} events "
              f"over its {loop['pairs_made']} pairs: {calls['event_records'] / loop['pairs_made']:.2f} per pair "
              f"({loop['ns_per_pair']:.0f} ns per pair on the simulated runtime). A block freed and asked for again "
              "at its size goes back to its place after a barrier, unless its free block has room past it for 8 or "
              "more such requests: then the loop sweeps through that room, one barrier per sweep."]
    lines.append("")
    return lines


def tracing_cost():
    """Tracing cost: GPUPOOL_TRACE on a hot loop."""
    lines = []
    env = {"LD_LIBRARY_PATH": SIM, "TRACES_DIR": TRACES, "GPUPOOL_REPORT": "0", "LD_PRELOAD": LIB}
    trace_path = os.path.join(BUILD, "bench-trace.csv")
    loop = [os.path.join(BIN, "gpupool-bench-api"), "async", "1", str(count(200000, 2000))]
    # Alternated, so that a slow spell of the machine does not land on one side.
    pairs_off, pairs_on = [], []
    for _ in range(count(9, 1)):
        pairs_off.append(json.loads(sh(loop, env=env))["ns_per_pair"])
        pairs_on.append(json.loads(sh(loop, env=dict(env, GPUPOOL_TRACE=trace_path)))["ns_per_pair"])
    os.remove(trace_path)
    off, on = statistics.median(pairs_off), statistics.median(pairs_on)
    ratio = statistics.median(b / a for a, b in zip(pairs_off, pairs_on))
    lines += ["## Tracing cost", "",
              "`GPUPOOL_TRACE` on a hot loop of stream-ordered pairs (`gpupool-bench-api async 1 200000`), with and "
              "without the trace, run alternately 9 times each.", "", "| | median ns per pair |", "|---|---:|",
              f"| without `GPUPOOL_TRACE` | {off:.0f} |", f"| with `GPUPOOL_TRACE` | {on:.0f} |", "",
              f"With the trace a pair takes {ratio:.2f}x its time without (the median of the runs' ratios).", ""]
    return lines


def main():
    traces = sorted(os.path.join(TRACES, t) for t in os.listdir(TRACES) if t.endswith(".csv"))
    lines = [
        "# Benchmarks",
        "",
        "Regenerated by `scripts/bench.sh` (which builds the `bench` preset and runs "
        "`bench/run_benchmarks.py`). Figures are medians of repeated runs measured side by side in one "
        "run; the machines are noisy, so compare ratios, not absolute times.",
        "",
        f"- Date: {datetime.date.today().isoformat()}",
        f"- Code: {code_version()}",
        f"- Machine: {machine()}; no GPU (the simulated runtime stands in for the device)",
        ("- Traces: the five real PyTorch traces in `../shared/traces` (read at run time, never committed)"
         if "TRACES_DIR" not in os.environ else f"- Traces: {len(traces)} in `{TRACES}`"),
        "",
    ]
    if QUICK:
        lines[2:2] = ["A quick run (`bench/run_benchmarks.py --quick`): every section with a run or round or two and a "
                      "few hundred pairs where the text below says more. It shows that the script works; its figures "
                      "and verdicts mean nothing.", ""]
    verdicts = []
    lines += cache_hit_latency(traces, verdicts)
    lines += scale(verdicts)
    lines += threads(verdicts)
    lines += preload_cost(verdicts)
    memory_lines, default = memory(traces, verdicts)
    lines += memory_lines
    lines += ordering_call_counts(traces, default)
    lines += tracing_cost()

    lines += ["## Targets", "", "| target | verdict | measured |", "|---|---|---|"]
    for target, verdict, measured in verdicts:
        lines.append(f"| {target} | {verdict} | {measured} |")
    gpu = os.path.join(ROOT, "bench", "GPU.md")
    if os.path.exists(gpu):
        lines += ["", "The GPU benchmarks below come from `scripts/gpu-bench.sh` (bench/GPU.md), run on a machine with "
                  "a GPU.", ""]
        with open(gpu) as f:
            lines += [f.read().rstrip(), ""]
    else:
        lines += ["", "## GPU", "", "Not measured yet: `scripts/gpu-bench.sh` writes bench/GPU.md on a machine with a "
                  "GPU (raw `cudaMalloc`/`cudaFree` against gpupool and `cudaMallocAsync`; PyTorch steps with its own "
                  "allocator, without caching, and without caching under gpupool), and the next `scripts/bench.sh` "
                  "puts it here. Until then the targets that need a GPU (>= 100x faster than raw `cudaMalloc`/`cudaFree`; "
                  "PyTorch under gpupool within 5% of its own allocator's step time, not above its peak memory) are "
                  "unverified.", ""]
    out = os.environ.get("OUT") if QUICK else ROOT
    if out:
        with open(os.path.join(out, "BENCHMARKS.md"), "w") as f:
            f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:] == ["--instructions"]:  # only these, to compare builds; BENCHMARKS.md is left as it is
        for mode, env, label in INSTRUCTION_PAIRS:
            print(f"{label}: {own_instructions_per_pair(mode, env):.0f} gpupool instructions")
        sys.exit(0)
    if sys.argv[1:] not in ([], ["--quick"]):
        sys.exit("usage: run_benchmarks.py [--quick | --instructions]")
    sys.exit(main())
