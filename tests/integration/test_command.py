"""The gpupool command: run, report, merge, plot and config."""
import collections
import ctypes.util
import glob
import json
import re
import os
import subprocess
import sys

from harness import BUILD, GPUPOOL, SMALL_DEVICE, ShimTest, check_books, human_bytes, main


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
