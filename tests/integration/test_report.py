"""The report and the gpupool command, against workloads with known numbers."""
import array
import collections
import ctypes.util
import fcntl
import glob
import json
import re
import os
import subprocess
import sys
import termios
import threading
import time

from harness import BUILD, SOURCE, ShimTest, check_books, main, program


def png_pixels(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG
    without interlacing (what matplotlib writes), decoded with zlib alone."""
    import struct
    import zlib
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows

SMALL_DEVICE = {"SIMCUDA_MEMORY": "64M"}
FIXED = {"GPUPOOL_EXPANDABLE_SEGMENTS": "0"}
GPUPOOL = os.path.join(SOURCE, "scripts", "gpupool")


def human_bytes(b):
    """The report's byte figures, as report/diagnosis.cpp writes them."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    unit, value = 0, abs(float(b))
    while value >= 1024.0 and unit < 5:
        value /= 1024.0
        unit += 1
    sign = "-" if b < 0 else ""
    return f"{sign}{value:.0f} B" if unit == 0 else f"{sign}{value:.2f} {units[unit]}"


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
        self.assertIn("Device resets (cudaDeviceReset): 1; the figures above cover the whole run", text)
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


class Paths(ShimTest):
    def test_default_path_is_in_the_temp_directory_and_announced(self):
        run = self.run_program(["test-repeat", "2"], env={"TMPDIR": self.workdir}, log=False, fmt="text")
        self.assertSucceeded(run)
        files = glob.glob(os.path.join(self.workdir, "gpupool-test-repeat-*.txt"))
        self.assertEqual(len(files), 1, os.listdir(self.workdir))
        self.assertIn(f"gpupool: report written to {files[0]}", run.stderr)

    def test_the_default_path_writes_only_a_file_of_the_users_own(self):
        # The default path is in the temporary folder, under a name anyone
        # can predict: another user may have put a link, a FIFO or a file of
        # theirs there before the program started (planted here in the child,
        # whose pid the program keeps). Each is refused on one line naming
        # GPUPOOL_LOG, and the program runs on; nothing is written through
        # the link, and its target keeps its bytes. A stale report of the
        # user's own is overwritten whole.
        victim = os.path.join(self.workdir, "victim")
        with open(victim, "w") as f:
            f.write("the user's data\n")

        def planting(kind):
            def plant():
                path = os.path.join(self.workdir, f"gpupool-test-repeat-{os.getpid()}.txt")
                if kind == "symbolic link":
                    os.symlink(victim, path)
                elif kind == "hard link":
                    os.link(victim, path)
                elif kind == "FIFO":
                    os.mkfifo(path)
                elif kind == "FIFO with a reader":  # the program inherits the reading end (close_fds off)
                    os.mkfifo(path)
                    os.set_inheritable(os.open(path, os.O_RDWR), True)
                elif kind == "another user's file":
                    with open(path, "w") as f:
                        f.write("theirs\n")
                    os.chown(path, 65534, 65534)
                elif kind == "stale report":
                    with open(path, "w") as f:
                        f.write("x" * 100000)
            return plant

        refusals = {"symbolic link": "a symbolic link", "hard link": "other names", "FIFO": "not a regular file",
                    "FIFO with a reader": "not a regular file", "another user's file": "another user"}
        kinds = list(refusals) + ["stale report"]
        if os.geteuid() != 0:
            kinds.remove("another user's file")  # only root can give a file away
        for kind in kinds:
            with self.subTest(kind=kind):
                for left in glob.glob(os.path.join(self.workdir, "gpupool-test-repeat-*.txt")):
                    os.remove(left)  # by a case that failed
                run = self.run_program(["test-repeat", "2"], env={"TMPDIR": self.workdir}, log=False, fmt="text",
                                       timeout=30, before_exec=planting(kind), close_fds=False)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json()["allocations"], 20)
                planted = glob.glob(os.path.join(self.workdir, "gpupool-test-repeat-*.txt"))
                self.assertEqual(len(planted), 1, planted)
                path = planted[0]
                with open(victim) as f:
                    self.assertEqual(f.read(), "the user's data\n")
                told = [line for line in run.stderr.splitlines() if line.startswith("gpupool: ")]
                if kind == "stale report":
                    self.assertEqual(told, [f"gpupool: report written to {path}"])
                    with open(path) as f:
                        report = f.read()
                    self.assertNotIn("x", report.splitlines()[-1])
                    self.assertIn("gpupool report", report.splitlines()[0])
                else:
                    self.assertEqual(len(told), 1, run.stderr)
                    self.assertTrue(told[0].startswith(f"gpupool: GPUPOOL_LOG: cannot write the report to '{path}': "),
                                    told[0])
                    self.assertIn(refusals[kind], told[0])

    def test_rank_in_the_path(self):
        for var, value in (("RANK", "3"), ("LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_RANK", "7"), ("SLURM_PROCID", "5")):
            with self.subTest(var=var):
                log = os.path.join(self.workdir, "rank-%r-%e.json")
                run = self.run_program(["test-repeat", "2"], env={var: value, "GPUPOOL_LOG": log})
                self.assertSucceeded(run)
                self.assertTrue(os.path.exists(os.path.join(self.workdir, f"rank-{value}-test-repeat.json")),
                                os.listdir(self.workdir))

    def test_report_and_trace_make_the_folders_their_paths_name(self):
        folder = os.path.join(self.workdir, "runs", "%p")
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_LOG": os.path.join(folder, "report.json"),
                                                          "GPUPOOL_TRACE": os.path.join(folder, "trace.csv")})
        self.assertSucceeded(run)
        made = glob.glob(os.path.join(self.workdir, "runs", "*"))
        self.assertEqual(len(made), 1, made)
        with open(os.path.join(made[0], "trace.csv")) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "Thread,Time,Action,Pointer,Size,Stream")
        self.assertEqual(len(lines), 1 + 2 * run.output_json()["allocations"])
        with open(os.path.join(made[0], "report.json")) as f:
            self.assertEqual(json.load(f)["reason"], "exit")

    def test_paths_that_cannot_be_written_are_told_and_the_program_runs_on(self):
        # A file where a folder should be: one line names the variable and
        # the path; the program's own work and exit code are untouched.
        blocker = os.path.join(self.workdir, "a-file")
        with open(blocker, "w") as f:
            f.write("not a folder\n")
        report = os.path.join(blocker, "report.json")
        trace = os.path.join(blocker, "trace.csv")
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_LOG": report, "GPUPOOL_TRACE": trace})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["allocations"], 20)
        lines = run.stderr.splitlines()
        self.assertIn(f"gpupool: GPUPOOL_TRACE: cannot write '{trace}'; not tracing", lines)
        prefix = f"gpupool: GPUPOOL_LOG: cannot write the report to '{report}': "
        told = [line for line in lines if line.startswith(prefix)]
        self.assertEqual(len(told), 1, run.stderr)
        self.assertNotIn("report written", run.stderr)

    def test_a_report_pipe_whose_reader_goes_away_does_not_end_the_program(self):
        # GPUPOOL_LOG names a FIFO whose only reader (this test, holding it
        # open read-write so that no open blocks) shrinks it to one page, lets
        # the report fill it, and closes it: the report's next write raises
        # SIGPIPE, which must not end the program, nor change its exit code.
        fifo = os.path.join(self.workdir, "report.fifo")
        os.mkfifo(fifo)
        held = os.open(fifo, os.O_RDWR)
        fcntl.fcntl(held, fcntl.F_SETPIPE_SZ, 4096)
        closed = threading.Event()

        def close_once_full():
            waiting = array.array("i", [0])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and closed.wait(0.005) is False:
                fcntl.ioctl(held, termios.FIONREAD, waiting)
                if waiting[0] >= 4096:
                    break
            os.close(held)
            closed.set()

        closer = threading.Thread(target=close_once_full)
        closer.start()
        try:
            run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_LOG": fifo})
        finally:
            closed.set()
            closer.join()
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["allocations"], 20)
        self.assertIn(f"gpupool: GPUPOOL_LOG: cannot write the report to '{fifo}': ", run.stderr)

    def test_stderr_piped_to_a_reader_that_has_gone_does_not_end_the_program(self):
        # `prog 2>&1 | head`, head gone: gpupool's line at exit ("report
        # written") must not end the program with SIGPIPE, nor change its
        # exit status.
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            run = self.run_program(["test-repeat", "2"], stderr=write_end)
        finally:
            os.close(write_end)
        self.assertEqual(run.code, 0, run.stdout)
        self.assertEqual(run.output_json()["allocations"], 20)
        self.assertEqual(len(run.reports()), 1)

    def test_a_file_the_program_opened_at_descriptor_2_gets_no_line_of_gpupools(self):
        # A program that closes descriptor 2, or starts without one, gets the
        # next file it opens there. gpupool's lines (here the configuration
        # problem, written as the core loads, and "report written" at exit)
        # must not land in that file, nor its trace, which it opens as it
        # loads (before the program's file, with cuda-first: descriptor 2 is
        # free then where the program started without it). The report and
        # the trace are still written whole.
        for closed_at_start in (False, True):
            for order in ("file-first", "cuda-first"):
                with self.subTest(closed_at_start=closed_at_start, order=order):
                    self.remove_reports()
                    data = os.path.join(self.workdir, f"data-{closed_at_start}-{order}.txt")
                    trace = os.path.join(self.workdir, f"trace-{closed_at_start}-{order}.csv")
                    args = [program("test-lifecycle"), "stderr-reused", data, order]
                    if closed_at_start:
                        args = ["/bin/sh", "-c", 'exec "$0" "$@" 2>&-'] + args
                    run = self.run_program(args, env={"GPUPOOL_CONF": "no_such_key:1", "GPUPOOL_TRACE": trace})
                    self.assertSucceeded(run)
                    self.assertEqual(run.output_json()["fd"], 2)
                    with open(data) as f:
                        self.assertEqual(f.read(), "the program's own line\n")
                    self.assertEqual(len(run.reports()), 1)
                    with open(trace) as f:
                        lines = f.read().splitlines()
                    self.assertEqual(lines[0], "Thread,Time,Action,Pointer,Size,Stream")
                    self.assertEqual([line.split(",")[2] for line in lines[1:]], ["allocate", "free"])
        # A pipe put there since (as Jupyter's kernel does) gets the lines.
        run = self.run_program(["test-lifecycle", "stderr-piped"], env={"GPUPOOL_CONF": "no_such_key:1"})
        self.assertSucceeded(run)
        self.assertTrue(run.output_json()["piped"])
        # The same program with its first stderr in place gets both lines there.
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_CONF": "no_such_key:1"})
        self.assertSucceeded(run)
        self.assertIn("gpupool: GPUPOOL_CONF: unknown key 'no_such_key'", run.stderr)
        self.assertIn("gpupool: report written to ", run.stderr)

    def reports_by_signal(self, mode):
        """Runs test-lifecycle MODE, which asks for a report by signal and
        prints it; returns that report and the one written at exit."""
        target = os.path.join(self.workdir, "report-signal.json")
        run = self.run_program(["test-lifecycle", mode, target], env={"GPUPOOL_LOG": target})
        self.assertSucceeded(run)
        with open(target) as f:
            return json.loads(run.stdout), json.load(f)

    def test_sigusr1_writes_a_report_without_exiting(self):
        during, after = self.reports_by_signal("signal")
        self.assertEqual(during["reason"], "signal")
        self.assertEqual(during["devices"]["0"]["stats"]["allocation.all.current"], 1)
        self.assertEqual(after["reason"], "exit")

    def test_a_report_mid_run_counts_a_block_lent_again_at_its_last_request(self):
        # A thread's cache lent the block again for 3.5 MiB (the pool made it
        # for 4 MiB): the report asked for while it is held counts 3.5 MiB
        # requested, lists the block as asked for 3.5 MiB, and both reports'
        # books balance.
        during, after = self.reports_by_signal("signal-lent-again")
        self.assertEqual(during["reason"], "signal")
        check_books(during)
        stats = during["devices"]["0"]["stats"]
        self.assertEqual(stats["requested_bytes.all.current"], 7 << 19)
        self.assertEqual(stats["allocated_bytes.all.current"], 4 << 20)
        held = during["devices"]["0"]["leaks"]["largest"]
        self.assertEqual([(b["bytes"], b["requested_bytes"]) for b in held], [(4 << 20, 7 << 19)])
        self.assertEqual(after["reason"], "exit")
        check_books(after)
        self.assertEqual(after["devices"]["0"]["stats"]["requested_bytes.all.current"], 0)

    def test_sigusr1_can_be_turned_off(self):
        target = os.path.join(self.workdir, "report-signal.json")
        run = self.run_program(["test-lifecycle", "signal", target],
                               env={"GPUPOOL_LOG": target, "GPUPOOL_REPORT_SIGNAL": "none"})
        self.assertEqual(run.code, -10)  # SIGUSR1's default action, as without gpupool


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


class Command(ShimTest):
    def gpupool(self, *args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([sys.executable, GPUPOOL] + list(args), capture_output=True, text=True, env=e,
                              timeout=120)

    @staticmethod
    def beside_the_command(program):
        """A test program of the build the gpupool command runs with (the default
        one, beside scripts/), whichever build runs these tests."""
        return os.path.join(os.path.dirname(GPUPOOL), "..", "build", "bin", program)

    def older_report(self, path, forget):
        """The report at `path` as an older gpupool wrote it: `forget(report)` deletes what it lacked."""
        with open(path) as f:
            report = json.load(f)
        forget(report)
        old = os.path.join(self.workdir, "old.json")
        with open(old, "w") as f:
            json.dump(report, f)
        return old

    def reports(self, n):
        paths = []
        for i in range(n):
            run = self.run_program(["test-patterns", "800", str(10 + i)])
            self.assertSucceeded(run)
            path = os.path.join(self.workdir, f"rank{i}.json")
            os.rename(run.reports()[0], path)
            paths.append(path)
        return paths

    def test_run_summarizes_and_passes_settings_and_exit_code(self):
        out = self.gpupool("run", "--sim", "--conf", "max_split_size_mb:128", "--",
                           self.beside_the_command("test-repeat"), "3")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("for 30 allocations", out.stdout)
        failing = self.gpupool("run", "--sim", "--", "sh", "-c", "exit 3")
        self.assertEqual(failing.returncode, 3)

    def test_run_keeps_the_preloads_and_settings_already_set(self):
        # A sanitizer's runtime must stay first in LD_PRELOAD, and --conf adds
        # to GPUPOOL_CONF rather than replacing it.
        preloaded = ctypes.util.find_library("m")  # any library the loader finds
        program = self.beside_the_command("test-repeat")
        out = self.gpupool("run", "--sim", "--log", os.path.join(self.workdir, "%p.json"),
                           "--conf", "max_split_size_mb:128", "--",
                           "sh", "-c", f'echo "$LD_PRELOAD"; exec {program} 3',
                           env={"LD_PRELOAD": preloaded, "GPUPOOL_CONF": "roundup_power2_divisions:4"})
        self.assertEqual(out.returncode, 0, out.stderr)
        preload = out.stdout.splitlines()[0].split(":")
        self.assertEqual(preload[0], preloaded)
        self.assertEqual(os.path.basename(preload[1]), "libgpupool.so")
        [path] = glob.glob(os.path.join(self.workdir, "*.json"))
        with open(path) as f:
            values = {row["key"]: row["value"] for row in json.load(f)["config"]}
        self.assertEqual((values["max_split_size_mb"], values["roundup_power2_divisions"]), ("128", "4"))

    def test_run_keeps_the_report_format_set_in_the_environment(self):
        # Asked for text, the user gets text, which is not summarized; --format still wins.
        program = self.beside_the_command("test-repeat")
        for env_format, flags, written in (("text", [], "text"), ("TEXT", ["--format", "json"], "json")):
            with self.subTest(env_format=env_format, flags=flags):
                log = os.path.join(self.workdir, f"{written}-report")
                out = self.gpupool("run", "--sim", "--log", log, *flags, "--", program, "3",
                                   env={"GPUPOOL_LOG_FORMAT": env_format})
                self.assertEqual(out.returncode, 0, out.stderr)
                with open(log) as f:
                    text = f.read()
                if written == "text":
                    self.assertRaises(ValueError, json.loads, text)
                    self.assertNotIn("for 30 allocations", out.stdout)
                else:
                    self.assertEqual(json.loads(text)["program"], "test-repeat")
                    self.assertIn("for 30 allocations", out.stdout)

    def test_run_summarizes_each_report_and_exits_as_its_program_did(self):
        program = self.beside_the_command("test-repeat")
        out = self.gpupool("run", "--sim", "--", "sh", "-c", f"{program} 3 && {program} 2")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.count("gpupool: test-repeat (pid "), 2, out.stdout)
        self.assertIn("for 30 allocations", out.stdout)
        self.assertIn("for 20 allocations", out.stdout)
        # Ended by a signal: 128 plus its number, as a shell reports it.
        killed = self.gpupool("run", "--sim", "--", "sh", "-c", "kill -TERM $$")
        self.assertEqual(killed.returncode, 128 + 15)

    def test_report_says_where_gpupool_stepped_aside(self):
        # A real one is in test_host_oom; here the viewer alone.
        def aside(report):
            report["stepped_aside"] = {"call": "cudaMallocAsync", "reason": "out of host memory (std::bad_alloc)"}
        out = self.gpupool("report", self.older_report(self.reports(1)[0], aside))
        self.assertIn("gpupool stepped aside at cudaMallocAsync: out of host memory (std::bad_alloc); from then "
                      "on the CUDA runtime served every allocation", out.stdout)

    def test_report_refuses_a_file_that_is_not_a_gpupool_report(self):
        path = os.path.join(self.workdir, "other.json")
        with open(path, "w") as f:
            json.dump({"traceEvents": []}, f)
        out = self.gpupool("report", path)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, f"gpupool: {path} is not a gpupool JSON report "
                                     "(write one with GPUPOOL_LOG_FORMAT=json)\n")

    def test_report_lists_leaks_and_out_of_memory_verdicts(self):
        leak = self.run_program(["test-lifecycle", "leak"])
        self.assertSucceeded(leak)
        leaks = leak.report()["devices"]["0"]["leaks"]
        out = self.gpupool("report", leak.reports()[0])
        self.assertIn(f"never freed: {leaks['blocks']} blocks, {human_bytes(leaks['bytes'])}", out.stdout)
        for path in leak.reports():
            os.remove(path)
        oom = self.run_program(["test-oom", "full"], env=SMALL_DEVICE)
        self.assertSucceeded(oom)
        [record] = oom.report()["devices"]["0"]["ooms"]
        self.assertIn(f"out of memory: {record['verdict']}", self.gpupool("report", oom.reports()[0]).stdout)

    def test_report_prints_the_summary(self):
        path = self.reports(1)[0]
        out = self.gpupool("report", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("peak reserved", out.stdout)
        self.assertIn("GPU reserved memory", out.stdout)

    def test_report_gives_a_short_run_in_milliseconds(self):
        run = self.run_program(["test-repeat", "2"])
        self.assertSucceeded(run)
        path = run.reports()[0]
        with open(path) as f:
            wall = json.load(f)["wall_seconds"]
        self.assertLess(wall, 1)
        took = re.search(r"\(pid \d+\), (\d+\.\d) ms\n", self.gpupool("report", path).stdout)
        self.assertIsNotNone(took)
        self.assertAlmostEqual(float(took.group(1)), wall * 1000, delta=0.05)

    def test_config_lists_problems_and_notes_after_its_table_in_one_stream(self):
        env = dict(os.environ, GPUPOOL_CONF="max_split_size_mb:64,bogus:1")
        out = subprocess.run([os.path.join(BUILD, "bin", "gpupool-config")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60).stdout
        lines = out.splitlines()
        footer = next(i for i, line in enumerate(lines) if line.startswith("(* set by the environment"))
        said = [i for i, line in enumerate(lines) if line.startswith("gpupool: ")]
        self.assertEqual(len(said), 2, out)  # the unknown key, and the note on the split limit
        self.assertTrue(all(i > footer for i in said), out)

    def test_report_shows_configuration_problems_and_notes(self):
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_CONF": "max_split_size_mb:64,bogus:1"})
        self.assertSucceeded(run)
        out = self.gpupool("report", run.reports()[0])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("configuration problem: gpupool: GPUPOOL_CONF: unknown key 'bogus'", out.stdout)
        self.assertIn("configuration note: gpupool: max_split_size_mb (64) applies to fixed segments only", out.stdout)
        # A report from before the notes still reads.
        old = self.older_report(run.reports()[0], lambda report: report.pop("config_notes"))
        self.assertEqual(self.gpupool("report", old).returncode, 0)

    def test_the_report_says_when_the_trace_is_incomplete(self):
        # A trace cut at a line's end reads as whole: the report keeps what
        # stderr told, and `gpupool report` shows it.
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_TRACE": "/dev/full"})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["allocations"], 20)
        told = [line for line in run.stderr.splitlines() if "GPUPOOL_TRACE" in line]
        self.assertEqual(told, ["gpupool: GPUPOOL_TRACE: cannot write '/dev/full' (No space left on device); "
                                "the rest of the trace is lost"])
        self.assertEqual(run.report()["trace_problems"], told)
        out = self.gpupool("report", run.reports()[0])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"  trace problem: {told[0]}\n", out.stdout)
        # A report from before these lines still reads.
        old = self.older_report(run.reports()[0], lambda report: report.pop("trace_problems"))
        self.assertEqual(self.gpupool("report", old).returncode, 0)
        # A file that cannot be opened at all, in the text report.
        blocker = os.path.join(self.workdir, "a-file")  # where a folder should be
        with open(blocker, "w") as f:
            f.write("not a folder\n")
        trace = os.path.join(blocker, "trace.csv")
        self.remove_reports()
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_TRACE": trace}, fmt="text")
        self.assertSucceeded(run)
        line = f"gpupool: GPUPOOL_TRACE: cannot write '{trace}'; not tracing"
        self.assertIn(line, run.stderr.splitlines())
        with open(run.reports()[0]) as f:
            self.assertIn(f"  trace: {line}\n", f.read())

    def test_report_shows_device_resets_and_reads_reports_from_before_them(self):
        run = self.run_program(["test-lifecycle", "reset"], env={"GPUPOOL_BACKTRACE": "1"})
        self.assertSucceeded(run)
        out = self.gpupool("report", run.reports()[0])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("device resets: 1; 1 blocks, 2.00 MiB, still allocated when a reset freed them", out.stdout)
        self.assertIn("freed by a device reset: 2.00 MiB in 1 blocks from", out.stdout)
        def forget(report):
            for device in report["devices"].values():
                del device["device_resets"]
        out = self.gpupool("report", self.older_report(run.reports()[0], forget))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("device reset", out.stdout)

    def test_report_reads_a_report_from_before_barrier_waits(self):
        def forget(report):
            for device in report["devices"].values():
                for stream in device["streams"]:
                    del stream["barrier_waits"]
        out = self.gpupool("report", self.older_report(self.reports(1)[0], forget))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("0 barrier waits", out.stdout)

    def test_merge_marks_a_process_out_of_memory_the_worst_and_totals_every_process(self):
        paths = self.reports(3)
        reports = []
        for path in paths:
            with open(path) as f:
                reports.append(json.load(f))
        # The smallest reservation ran out of memory: worse than any larger one.
        peaks = [r["devices"]["0"]["stats"]["reserved_bytes.all.peak"] for r in reports]
        smallest = peaks.index(min(peaks))
        reports[smallest]["devices"]["0"]["stats"]["num_ooms"] = 1
        with open(paths[smallest], "w") as f:
            json.dump(reports[smallest], f)
        lines = self.gpupool("merge", *paths).stdout.splitlines()
        [worst] = [line for line in lines if "<- worst" in line]
        self.assertIn(f"[{reports[smallest]['pid']}]", worst)
        stats = [r["devices"]["0"]["stats"] for r in reports]
        total = lines[-1].split()
        self.assertEqual(total[:2], ["total", "(3)"])
        self.assertEqual(" ".join(total[2:4]), human_bytes(sum(s["allocated_bytes.all.peak"] for s in stats)))
        self.assertEqual(" ".join(total[4:6]), human_bytes(sum(s["reserved_bytes.all.peak"] for s in stats)))
        self.assertEqual(total[6:8], [str(sum(s["num_device_alloc"] for s in stats)), "1"])

    def test_merge_puts_ranks_side_by_side_and_marks_the_worst(self):
        paths = self.reports(3)
        out = self.gpupool("merge", *paths)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(sum("<- worst" in line for line in lines), 1)
        self.assertTrue(lines[-1].startswith("total (3)"))
        reports = []
        for path in paths:
            with open(path) as f:
                reports.append(json.load(f))
            check_books(reports[-1])
        peaks = [r["devices"]["0"]["stats"]["reserved_bytes.all.peak"] for r in reports]
        worst_line = [line for line in lines if "<- worst" in line][0]
        worst_pid = reports[peaks.index(max(peaks))]["pid"]
        self.assertIn(f"[{worst_pid}]", worst_line)

    def test_merge_names_a_process_without_device_activity(self):
        paths = self.reports(3)
        with open(paths[1]) as f:
            idle = json.load(f)
        idle["devices"] = {}  # as a rank that never allocated writes it
        with open(paths[1], "w") as f:
            json.dump(idle, f)
        lines = self.gpupool("merge", *paths).stdout.splitlines()
        self.assertTrue(lines[-2].startswith("total (2)"), lines)
        self.assertEqual(lines[-1], f"no device activity: {idle['program']}[{idle['pid']}]")
        # All of them idle: still named, every one.
        out = self.gpupool("merge", paths[1], paths[1])
        self.assertEqual(out.returncode, 0, out.stderr)
        name = f"{idle['program']}[{idle['pid']}]"
        self.assertEqual(out.stdout, f"gpupool merge: no device activity in these reports: {name}, {name}\n")

    def test_plot_draws_each_devices_timeline_and_histograms(self):
        # A two-device report: a row of two panels per device (14 by 4.5
        # inches each row, at 100 dots per inch). Each row's left panel draws
        # the reserved, allocated and requested lines, its right one the free
        # blocks' bars. Each colour must cover more of its panel than its
        # legend's sample does (about 50 pixels for a line, 300 for a bar).
        run = self.run_program(["test-devices", "cross", "20"], env={"SIMCUDA_DEVICES": "2"})
        self.assertSucceeded(run)
        png = os.path.join(self.workdir, "memory.png")
        out = self.gpupool("plot", run.reports()[0], "-o", png)
        self.assertEqual(out.returncode, 0, out.stderr)
        width, height, rows = png_pixels(png)
        self.assertEqual((width, height), (1400, 900))
        lines = {"reserved": (214, 39, 40), "allocated": (31, 119, 180), "requested": (44, 160, 44)}
        bars = {"free blocks at peak": (255, 127, 14), "free blocks at exit": (127, 127, 127)}
        for device, top in (("0", 0), ("1", 450)):
            for (left, right), drawn, least in (((0, 700), lines, 150), ((700, 1400), bars, 1000)):
                seen = collections.Counter(rows[y][x] for y in range(top, top + 450) for x in range(left, right))
                for name, colour in drawn.items():
                    self.assertGreater(seen[colour], least, f"device {device}: {name}")

    def test_config_lists_every_option_and_the_problems(self):
        out = self.gpupool("config", env={"GPUPOOL_CONF": "max_split_size_mb:256", "GPUPOOL_LOG_FORMAT": "xml"})
        self.assertEqual(out.returncode, 1)
        self.assertRegex(out.stdout, r"GPUPOOL_MAX_SPLIT_SIZE_MB\s+unlimited\s+256")
        self.assertIn("GPUPOOL_LOG_FORMAT: must be one of text or json ('xml'); using text", out.stderr)
        # A split limit beside the default expandable segments is a note on stderr, not a problem.
        self.assertIn("max_split_size_mb (256) applies to fixed segments only", out.stderr)
        only_note = self.gpupool("config", env={"GPUPOOL_CONF": "max_split_size_mb:256"})
        self.assertEqual(only_note.returncode, 0)
        self.assertIn("max_split_size_mb (256) applies to fixed segments only", only_note.stderr)


if __name__ == "__main__":
    main()
