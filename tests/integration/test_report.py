"""The report against workloads with known numbers: out-of-memory diagnoses,
leaks, its contents and schema, the streams' costs, streams gone and frees
refused."""
import glob
import json
import re
import os
import subprocess
import sys

from harness import GPUPOOL, SMALL_DEVICE, SOURCE, ShimTest, human_bytes, main


FIXED = {"GPUPOOL_EXPANDABLE_SEGMENTS": "0"}


def summary_rows(text):
    """The memory summary's rows of figures, as [label, current, peak, allocated, freed]."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 5 and cells[0] != "Metric":
            rows.append(cells)
    return rows


def schema():
    with open(os.path.join(SOURCE, "docs", "report.schema.json")) as f:
        return json.load(f)


class OutOfMemory(ShimTest):
    def test_fragmentation_is_told_apart_from_a_full_device(self):
        run = self.run_program(["test-oom", "fragmentation"], env=dict(SMALL_DEVICE, **FIXED))
        self.assertSucceeded(run)
        self.assertIn("oom: cudaErrorMemoryAllocation", run.stdout)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["stats"]["num_ooms"], 1)
        oom = device["ooms"][0]
        self.assertEqual(oom["cause"], "fragmentation")
        self.assertEqual(oom["free_in_pool_bytes"], 30 << 20)
        self.assertEqual(oom["largest_free_block_bytes"], 2 << 20)
        self.assertIn("fragmentation: 30.00 MiB free in the pool but the largest block is 2.00 MiB", oom["verdict"])
        self.assertIn("GPUPOOL_EXPANDABLE_SEGMENTS=1", oom["advice"])  # what the next test shows serves it
        self.assertIn("out of memory: fragmentation", run.stderr)  # said at the time, too
        for path in run.reports():
            os.remove(path)
        text = self.run_program(["test-oom", "fragmentation"], env=dict(SMALL_DEVICE, **FIXED), fmt="text").report()
        listed = text[text.index("\nOut of memory: 1 time(s)\n"):].splitlines()[2:4]
        self.assertIn(oom["verdict"], listed[0])
        self.assertEqual(listed[1].strip(), "advice: " + oom["advice"])

    def test_expandable_segments_serve_what_fixed_segments_fragment(self):
        run = self.run_program(["test-oom", "fragmentation"], env=SMALL_DEVICE)
        self.assertSucceeded(run)
        self.assertIn("oom: cudaSuccess", run.stdout)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["stats"]["num_ooms"], 0)
        self.assertGreater(device["upstream"]["page_unmaps"], 0)

    def test_a_fitting_block_still_in_use_during_a_capture_is_not_called_fragmentation(self):
        # 48 MiB free, its work still queued; while a capture is under way no
        # event may be recorded to order it, so a 20 MiB request fails.
        for mode in ({}, FIXED):
            with self.subTest(**mode):
                run = self.run_program(["test-oom", "capture"],
                                       env=dict(SMALL_DEVICE, SIMCUDA_OP_DELAY_US="300000", **mode))
                self.assertSucceeded(run)
                self.assertIn("oom: cudaErrorMemoryAllocation", run.stdout)
                oom = run.report()["devices"]["0"]["ooms"][0]
                self.assertEqual(oom["cause"], "pending_reuse")
                self.assertRegex(oom["stream"], r"^0x[0-9a-f]+$")  # the asking stream, not cudaMalloc's
                self.assertTrue(oom["during_capture"])
                self.assertEqual(oom["largest_fitting_free_block_bytes"], 48 << 20)
                self.assertIn("a free block of 48.00 MiB fits", oom["verdict"])
                self.assertIn("capture", oom["advice"])
                os.remove(run.reports()[0])

    def test_a_full_device_is_called_full(self):
        run = self.run_program(["test-oom", "full"], env=SMALL_DEVICE)
        self.assertSucceeded(run)
        self.assertIn("oom: cudaErrorMemoryAllocation", run.stdout)
        oom = run.report()["devices"]["0"]["ooms"][0]
        self.assertEqual(oom["cause"], "device_full")
        self.assertEqual(oom["free_in_pool_bytes"], 0)
        self.assertIn("the device is full", oom["verdict"])
        self.assertEqual(oom["reserved_bytes"], 60 << 20)
        # It retried after flushing an empty cache, in vain: no advice to flush less.
        device = run.report()["devices"]["0"]
        self.assertEqual((device["stats"]["num_alloc_retries"], device["cache"]["retries_served"]), (1, 0))
        self.assertFalse([a for a in device["advice"] if "retry" in a], device["advice"])

    def test_a_device_that_refuses_is_an_out_of_memory(self):
        # The simulated device fails every allocation (fault injection): the
        # pool releases its cache, retries once and diagnoses an OOM.
        for mode in ({}, FIXED):
            run = self.run_program(["test-oom", "none"], env=dict(mode, SIMCUDA_FAIL_AFTER="0"))
            self.assertSucceeded(run)
            self.assertIn("oom: cudaErrorMemoryAllocation", run.stdout)
            self.assertIn("out of memory", run.stderr)
            device = run.report()["devices"]["0"]
            self.assertEqual(device["stats"]["num_ooms"], 1)
            # It reports all 16 GiB free: not "the device is full".
            self.assertEqual(device["ooms"][0]["cause"], "device_refused")
            self.assertIn("although it reports 16.00 GiB free", device["ooms"][0]["verdict"])
            for path in run.reports():
                os.remove(path)

    def test_a_device_error_reaches_the_program_as_itself(self):
        # A sticky error (700, an illegal address) or a missing driver is not
        # an out-of-memory: the program gets the runtime's own error, with no
        # OOM line or diagnosis, in both segment modes.
        for code, name in ((700, "cudaErrorIllegalAddress"), (100, "cudaErrorNoDevice")):
            for mode in ({}, FIXED):
                env = dict(mode, SIMCUDA_FAIL_AFTER="0", SIMCUDA_FAIL_ERROR=str(code))
                raw = self.run_program(["test-oom", "none"], env=env, preload=False)
                self.assertIn(f"oom: {name}", raw.stdout)
                run = self.run_program(["test-oom", "none"], env=env)
                self.assertSucceeded(run)
                self.assertIn(f"oom: {name}", run.stdout)
                self.assertNotIn("out of memory", run.stderr)
                self.assertEqual(run.report()["devices"]["0"]["stats"]["num_ooms"], 0)
                for path in run.reports():
                    os.remove(path)

    def test_the_memory_limit_refuses_and_says_so(self):
        run = self.run_program(["test-oom", "full"], env={"GPUPOOL_MEMORY_LIMIT": "64M"})
        self.assertSucceeded(run)
        oom = run.report()["devices"]["0"]["ooms"][0]
        self.assertEqual(oom["cause"], "limit_reached")
        self.assertTrue(oom["limit_reached"])
        self.assertEqual(run.counters()["malloc_failures"], 0)  # never asked the device

    def test_mem_get_info_counts_cached_memory_as_free_and_honours_the_limit(self):
        run = self.run_program("test-meminfo", env={"SIMCUDA_MEMORY": "1G"})
        self.assertSucceeded(run)
        info = run.output_json()
        self.assertEqual(info["free_after"], info["free_before"])
        run = self.run_program("test-meminfo", env={"SIMCUDA_MEMORY": "1G", "GPUPOOL_MEM_GET_INFO": "cached_is_used"})
        info = run.output_json()
        self.assertEqual(info["free_before"] - info["free_after"], 100 << 20)
        run = self.run_program("test-meminfo", env={"SIMCUDA_MEMORY": "1G", "GPUPOOL_MEMORY_LIMIT": "512M"})
        info = run.output_json()
        self.assertEqual(info["total"], 512 << 20)
        self.assertEqual(info["free_before"], 512 << 20)

    def test_mem_get_info_counts_a_block_a_thread_keeps_as_cached(self):
        # Freed with cudaFreeAsync while thread caches are on: the freeing
        # thread keeps it, and the pool still counts it allocated.
        for args in (["async"], ["async", "threads"]):
            with self.subTest(args=args):
                env = {"SIMCUDA_MEMORY": "1G"}
                info = self.run_program(["test-meminfo"] + args, env=env).output_json()
                self.assertEqual(info["free_after"], info["free_before"])
                info = self.run_program(["test-meminfo"] + args,
                                        env={**env, "GPUPOOL_MEM_GET_INFO": "cached_is_used"}).output_json()
                self.assertEqual(info["free_before"] - info["free_after"], 100 << 20)
                info = self.run_program(["test-meminfo"] + args,
                                        env={**env, "GPUPOOL_MEMORY_LIMIT": "512M"}).output_json()
                self.assertEqual(info["free_after"], info["free_before"])


class Leaks(ShimTest):
    def test_leaks_are_listed_largest_first(self):
        run = self.run_program(["test-lifecycle", "leak"])
        self.assertSucceeded(run)
        leaks = run.report()["devices"]["0"]["leaks"]
        self.assertEqual(leaks["blocks"], 3)
        self.assertEqual([b["requested_bytes"] for b in leaks["largest"]], [3 << 20, 1 << 20, 5 << 10])
        self.assertEqual(leaks["sites"], [])
        self.assertTrue(any("GPUPOOL_BACKTRACE=1" in a for a in run.report()["devices"]["0"]["advice"]))

    def test_a_stream_ordered_leak_names_its_stream(self):
        run = self.run_program(["test-lifecycle", "leak-async"])
        self.assertSucceeded(run)
        [block] = run.report()["devices"]["0"]["leaks"]["largest"]
        self.assertEqual(block["stream"], run.output_json()["stream"])

    def test_the_text_report_lists_leaks_largest_first(self):
        run = self.run_program(["test-lifecycle", "leak"], fmt="text")
        self.assertSucceeded(run)
        text = run.report()
        lines = text[text.index("\nStill allocated at exit: 3 blocks, "):].splitlines()[2:5]
        asked = [int(re.search(r"\(asked (\d+) bytes\) on cudaMalloc/cudaFree$", line).group(1)) for line in lines]
        self.assertEqual(asked, [3 << 20, 1 << 20, 5 << 10])
        self.assertIn("3 blocks (5.00 MiB) were still allocated at exit: GPUPOOL_BACKTRACE=1", text)

    def test_backtrace_groups_leaks_by_symbolized_call_site(self):
        run = self.run_program(["test-lifecycle", "leak"], env={"GPUPOOL_BACKTRACE": "1"})
        self.assertSucceeded(run)
        sites = run.report()["devices"]["0"]["leaks"]["sites"]
        self.assertEqual(len(sites), 1)
        self.assertEqual(sites[0]["blocks"], 3)
        # Block sizes: at least what was asked (rounding may add a little).
        self.assertGreaterEqual(sites[0]["bytes"], (3 << 20) + (1 << 20) + (5 << 10))
        self.assertLessEqual(sites[0]["bytes"], (3 << 20) + (1 << 20) + (5 << 10) + (2 << 20))
        self.assertIn("leak_here", sites[0]["frames"][0])

    def test_the_text_report_counts_what_a_device_reset_freed_apart_from_leaks(self):
        run = self.run_program(["test-lifecycle", "reset"], fmt="text")
        self.assertSucceeded(run)
        text = run.report()
        self.assertIn("Device resets (cudaDeviceReset, cudaThreadExit or the driver's cuDevicePrimaryCtxReset): 1; "
                      "the figures above cover the whole run", text)
        self.assertIn("still allocated when a reset freed them: 1 blocks, 2.00 MiB", text)
        self.assertNotIn("Still allocated at exit", text)


class Contents(ShimTest):
    def test_reports_validate_against_the_schema(self):
        import jsonschema
        for args, env in ((["test-patterns", "1500", "9"], {}), (["test-oom", "fragmentation"], dict(SMALL_DEVICE, **FIXED)),
                          (["test-lifecycle", "leak"], {"GPUPOOL_BACKTRACE": "1"}), (["test-capture"], {}),
                          (["test-lifecycle", "reset"], {"GPUPOOL_BACKTRACE": "1"}),
                          (["test-hazards", "cross-stream-pending"], {"GPUPOOL_MEMORY_LIMIT": "2M"})):
            with self.subTest(program=" ".join(args)):
                run = self.run_program(args, env=env)
                self.assertSucceeded(run)
                try:
                    jsonschema.validate(run.report(), schema())
                finally:
                    for path in run.reports():
                        os.remove(path)

    def test_text_and_json_carry_the_same_numbers(self):
        # The same deterministic run twice, once per format: every cell of the
        # text's memory summary must be the JSON's figure, and its count rows
        # must balance as the JSON's do.
        as_json = self.run_program(["test-repeat", "7"]).report()
        for path in glob.glob(os.path.join(self.workdir, "report-*")):
            os.remove(path)
        text = self.run_program(["test-repeat", "7"], fmt="text").report()
        stats = as_json["devices"]["0"]["stats"]
        self.assertIn("gpupool memory summary, device 0", text)
        rows = summary_rows(text)
        groups = (("Allocated memory", "allocated_bytes", True), ("Active memory", "active_bytes", True),
                  ("Requested memory", "requested_bytes", True), ("GPU reserved memory", "reserved_bytes", True),
                  ("Non-releasable memory", "inactive_split_bytes", True), ("Allocations", "allocation", False),
                  ("Active allocs", "active", False), ("GPU reserved segments", "segment", False),
                  ("Non-releasable allocs", "inactive_split", False))
        columns = ("current", "peak", "allocated", "freed")
        expected = []
        for label, key, is_bytes in groups:
            for pool, pool_label in (("all", label), ("large_pool", "from large pool"), ("small_pool", "from small pool")):
                cells = [stats[f"{key}.{pool}.{c}"] for c in columns]
                expected.append([pool_label] + [human_bytes(v) if is_bytes else str(v) for v in cells])
        for key, label in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments")):
            expected.append([label] + [str(stats[f"{key}.{c}"]) for c in columns])
        self.assertEqual(rows, expected)
        self.assertTrue(any(v for k, v in stats.items() if "small_pool" in k) and
                        any(v for k, v in stats.items() if "large_pool" in k))  # both pools' rows say something
        for row in rows:
            if not row[1].endswith("B"):
                current, peak, allocated, freed = map(int, row[1:])
                self.assertEqual(allocated - freed, current, row)
                self.assertGreaterEqual(peak, current, row)
        cache = as_json["devices"]["0"]["cache"]
        self.assertIn(f"cudaMalloc calls {stats['num_device_alloc']} (0 failed)", text)
        self.assertIn(f"cache hits {cache['hits']} of {cache['hits'] + cache['misses']} allocations", text)
        self.assertIn(f"peak reserved / peak requested: "
                      f"{as_json['devices']['0']['fragmentation']['peak_reserved_to_peak_requested']:.4f}", text)

    def test_non_default_settings_are_marked(self):
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_CONF": "max_split_size_mb:64"})
        rows = {c["key"]: c for c in run.report()["config"]}
        self.assertTrue(rows["max_split_size_mb"]["non_default"])
        self.assertEqual(rows["max_split_size_mb"]["value"], "64")
        self.assertFalse(rows["large_segment_size"]["non_default"])

    def test_timeline_is_sampled_and_bounded(self):
        run = self.run_program(["test-patterns", "6000", "5"])
        timeline = run.report()["devices"]["0"]["timeline"]
        self.assertGreater(len(timeline["samples"]), 100)
        self.assertLessEqual(len(timeline["samples"]), 1024)
        peak = run.report()["devices"]["0"]["stats"]["reserved_bytes.all.peak"]
        self.assertTrue(all(s[3] <= peak for s in timeline["samples"]))
        # The columns it names: requested <= allocated <= reserved, with room
        # between allocated and reserved somewhere in the run.
        columns = timeline["columns"]
        at = {name: columns.index(name) for name in ("requested_bytes", "allocated_bytes", "reserved_bytes")}
        samples = timeline["samples"]
        self.assertTrue(all(s[at["requested_bytes"]] <= s[at["allocated_bytes"]] <= s[at["reserved_bytes"]]
                            for s in samples))
        self.assertTrue(any(s[at["allocated_bytes"]] < s[at["reserved_bytes"]] for s in samples))

    def test_times_are_seconds_into_the_run(self):
        run = self.run_program(["test-oom", "full"], env={"SIMCUDA_MEMORY": "64M"})
        report = run.report()
        device = report["devices"]["0"]
        times = [s[0] for s in device["timeline"]["samples"]] + [o["time_s"] for o in device["ooms"]]
        self.assertEqual(len(device["ooms"]), 1)
        self.assertTrue(all(0 <= t <= report["wall_seconds"] for t in times), (times, report["wall_seconds"]))
        self.assertEqual(times[:-1], sorted(times[:-1]))  # the timeline in order


class StreamCosts(ShimTest):
    # The plain loop beside 16 non-blocking streams it never uses, as PyTorch
    # makes them for its stream pool: every barrier makes each of them wait,
    # but for those that find the device caught up (the simulated device
    # seldom has: its streams are still busy with the last barrier's waits).
    LOOP = ["gpupool-bench-api", "plain", "1", "2000", "16", "16"]

    def test_unused_streams_barrier_waits_are_counted_and_advised(self):
        run = self.run_program(self.LOOP)
        self.assertSucceeded(run)
        dev = run.report()["devices"]["0"]
        device_row = [s for s in dev["streams"] if s["stream"] == "cudaMalloc/cudaFree"][0]
        barriers = device_row["fences_recorded"]
        self.assertGreater(barriers, 100)
        waits = sum(s["barrier_waits"] for s in dev["streams"])
        self.assertEqual(waits, 16 * (barriers - device_row["caught_up_barriers"]))
        # Each barrier asks each stream whether it is idle, or, for one found
        # busy, every 8th barrier.
        queries = sum(s["idle_queries"] for s in dev["streams"])
        self.assertLessEqual(queries, 16 * barriers)
        self.assertGreaterEqual(queries, 16 * barriers // 8)
        self.assertEqual(device_row["idle_queries"], 0)  # not a stream of its own
        self.assertEqual(sum(s["event_waits"] for s in dev["streams"]), 0)
        self.assertTrue(any("cudaStreamNonBlocking" in a for a in dev["advice"]), dev["advice"])
        self.assertFalse(any("GPUPOOL_CROSS_STREAM_REUSE" in a for a in dev["advice"]), dev["advice"])
        viewed = subprocess.run([sys.executable, GPUPOOL, "report", run.reports()[0]], capture_output=True,
                                text=True, timeout=120)
        self.assertIn(f"16 other streams, no reuse: {waits} barrier waits, {queries} idle queries\n", viewed.stdout)
        # Folded into that line, not listed one by one.
        listed = [line for line in viewed.stdout.splitlines() if line.startswith("  stream ")]
        self.assertEqual(len(listed), len(dev["streams"]) - 16, viewed.stdout)

    def test_the_text_report_shows_unused_streams_as_one_row(self):
        run = self.run_program(self.LOOP, fmt="text")
        self.assertSucceeded(run)
        rows = {line[2:24].strip(): line[24:].split() for line in run.report().splitlines()
                if line.startswith("  ") and len(line) > 24 and line[24:].split()[-1].isdigit()}
        self.assertIn("16 others, no reuse", rows)
        barriers = int(rows["cudaMalloc/cudaFree"][-2])
        self.assertGreater(barriers, 100)
        caught_up = re.search(r"(\d+) of the (\d+) device barriers found the device caught up", run.report())
        if caught_up:
            self.assertEqual(int(caught_up.group(2)), barriers)
        waits = 16 * (barriers - (int(caught_up.group(1)) if caught_up else 0))
        self.assertEqual(int(rows["16 others, no reuse"][-3]), waits)  # the barrier waits column
        asked = re.search(r"device barriers asked the non-blocking streams (\d+) times whether they were idle",
                          run.report())
        self.assertIsNotNone(asked, run.report())
        self.assertLessEqual(int(asked.group(1)), 16 * barriers)
        self.assertGreaterEqual(int(asked.group(1)), 16 * barriers // 8)
        self.assertFalse(any(name.startswith("0x") for name in rows), rows)


class DestroyedStreamWaits(ShimTest):
    # A stream made for each task while the device lags (1 ms a simulated
    # operation, no pause): each task takes the last one's block after a
    # wait for that task's own event.
    TASKS = ["gpupool-bench-api", "tasks", "40", "0", "0"]
    ENV = {"SIMCUDA_OP_DELAY_US": "1000"}

    def test_waits_for_destroyed_streams_are_counted_apart(self):
        run = self.run_program(self.TASKS, env=self.ENV)
        self.assertSucceeded(run)
        streams = run.report()["devices"]["0"]["streams"]
        waits = sum(s["event_waits"] for s in streams)
        self.assertGreater(waits, 20)
        self.assertEqual(sum(s["destroyed_stream_waits"] for s in streams), waits)

    def test_the_text_report_says_how_many_waits_were_for_destroyed_streams(self):
        run = self.run_program(self.TASKS, env=self.ENV, fmt="text")
        self.assertSucceeded(run)
        section = run.report().split("\nStreams ", 1)[1].split("\n\n", 1)[0]
        rows = [line[24:].split() for line in section.splitlines()[1:]
                if len(line) > 24 and all(cell.isdigit() for cell in line[24:].split()[-5:])]
        self.assertGreater(len(rows), 1, section)
        waits = sum(int(row[-4]) for row in rows)  # the event waits column
        line = re.search(r"(\d+) of the (\d+) event waits were for the last work of a stream destroyed",
                         run.report())
        self.assertIsNotNone(line, run.report())
        self.assertEqual(int(line.group(2)), waits)
        self.assertEqual(int(line.group(1)), waits)


class GoneStreams(ShimTest):
    # 100 threads that come and go, each on its own per-thread stream, and the
    # main thread's stream destroyed at the end: 101 gone streams. Those that
    # hold no cache are one row; those that do keep their own.
    THREADS = ["test-threads", "come-and-go", "100"]
    GONE = 101

    def test_the_text_report_shows_gone_streams_without_cache_as_one_row(self):
        run = self.run_program(self.THREADS, fmt="text")
        self.assertSucceeded(run)
        rows = {line[2:24].strip(): line[24:].split() for line in run.report().splitlines()
                if line.startswith("  ") and len(line) > 24 and line[24:].split()[-1].isdigit()}
        [folded] = [name for name in rows if name.endswith(" gone, none cached")]
        self.assertEqual(rows[folded][0], "0")  # the cached blocks column
        one_by_one = [name for name in rows if name.endswith(" (gone)")]
        self.assertTrue(all(rows[name][0] != "0" for name in one_by_one), rows)
        more = [int(name.split()[0]) for name in rows if name.endswith(" more gone")]
        self.assertEqual(int(folded.split()[0]) + len(one_by_one) + sum(more), self.GONE, rows)

    def test_the_viewer_shows_gone_streams_without_cache_as_one_line(self):
        run = self.run_program(self.THREADS)
        self.assertSucceeded(run)
        streams = run.report()["devices"]["0"]["streams"]
        gone = [s for s in streams if not s["alive"] and s["cached_blocks"] == 0]
        self.assertGreaterEqual(len(gone), 2)
        viewed = subprocess.run([sys.executable, GPUPOOL, "report", run.reports()[0]], capture_output=True,
                                text=True, timeout=120)
        reuses = sum(s["cross_stream_reuses"] for s in gone)
        self.assertIn(f"{sum(s['streams'] for s in gone)} gone streams, none cached: "
                      f"{sum(s['same_stream_reuses'] for s in gone)} same-stream and {reuses} cross-stream reuse",
                      viewed.stdout)
        listed = [line for line in viewed.stdout.splitlines() if line.startswith("  stream ")]
        self.assertEqual(len(listed), len(streams) - len(gone), viewed.stdout)
        # Every one of them ended where gpupool saw it.
        self.assertEqual(sum(s["destroyed_unseen"] for s in streams), 0, streams)
        self.assertNotIn("could not see", viewed.stdout)


class RefusedFrees(ShimTest):
    # The viewer says how many of gpupool's cudaFree calls and page unmaps the
    # runtime refused (a context broken by a fault), as the report counts them.
    def view(self, run):
        viewed = subprocess.run([sys.executable, GPUPOOL, "report", run.reports()[0]], capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(viewed.returncode, 0, viewed.stderr)
        return viewed.stdout

    def test_the_viewer_counts_refused_cudafree_calls(self):
        env = {"GPUPOOL_EXPANDABLE_SEGMENTS": "0", "GPUPOOL_GARBAGE_COLLECTION_THRESHOLD": "0.5",
               "SIMCUDA_MEMORY": "64M"}
        run = self.run_program(["test-lifecycle", "fault-release"], env=env)
        self.assertSucceeded(run)
        self.assertIn("1 cudaFree (1 refused) and 0 page unmaps (", self.view(run))

    def test_the_viewer_counts_refused_page_unmaps(self):
        run = self.run_program(["test-patterns", "2000", "3"],
                               env={"SIMCUDA_UNMAP_FAIL_RATE": "0.5", "GPUPOOL_MEMORY_LIMIT": "640M"})
        self.assertSucceeded(run)
        upstream = run.report()["devices"]["0"]["upstream"]
        self.assertGreater(upstream["page_unmap_failures"], 0)
        self.assertIn(f"{upstream['page_unmaps']} page unmaps ({upstream['page_unmap_failures']} refused) (",
                      self.view(run))


if __name__ == "__main__":
    main()
