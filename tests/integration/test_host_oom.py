"""gpupool's own host allocations failing inside a program (std::bad_alloc,
the host out of memory): the program must never notice."""
import collections
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from harness import BUILD, LIBRARY, NATIVE, SOURCE, ShimTest, check_books, main, sanitizer_runtime


class HostMemoryFailure(ShimTest):
    # test-host-oom with libtest-failing-malloc.so ahead of gpupool: the
    # core's N-th host allocation after the program's start fails (std::bad_alloc
    # inside gpupool, as when the host is out of memory), or that one and every
    # later one. The program exits 1 unless every CUDA call it makes succeeds,
    # no two live blocks overlap and each keeps its bytes.
    FAULTS = os.path.join(BUILD, "tests", "libtest-failing-malloc.so")
    CONFIGS = {"default": {},
               "traced": {"GPUPOOL_TRACE": "trace.csv", "GPUPOOL_BACKTRACE": "1", "GPUPOOL_EXPANDABLE_SEGMENTS": "0"}}

    def setUp(self):
        if sanitizer_runtime():
            self.skipTest("a sanitizer's runtime owns malloc")
        super().setUp()

    def run_failing(self, first, every, env, fmt="json"):
        workdir = tempfile.mkdtemp(dir=self.workdir)
        e = {k: os.path.join(workdir, v) if k == "GPUPOOL_TRACE" else v for k, v in env.items()}
        e["GPUPOOL_LOG"] = os.path.join(workdir, "report-%p." + fmt)
        e["SIMCUDA_COUNTERS_FILE"] = os.path.join(workdir, "counters.json")
        run = self.run_program(["test-host-oom", str(first), str(every)], env=e, fmt=fmt,
                               library=f"{self.FAULTS}:{LIBRARY}")
        reports = glob.glob(os.path.join(workdir, "report-*"))
        report = None
        if len(reports) == 1:
            with open(reports[0]) as f:
                report = json.load(f) if fmt == "json" else f.read()
        return run, report

    def check(self, run, report, first, every):
        where = f"failing from the core's allocation {first}{' on' if every else ''}"
        self.assertEqual(run.code, 0, f"{where}: exit {run.code}\n{run.stdout}\n{run.stderr}")
        failures = run.output_json()["failures"]
        aside = re.findall(r"^gpupool: (\S+) failed inside gpupool: ", run.stderr, re.M)
        lost_report = re.search(r"^gpupool: (GPUPOOL_LOG: )?cannot (make|write) the report.*: std::bad_alloc$",
                                run.stderr, re.M) is not None
        self.assertLessEqual(len(aside), 1, f"{where}:\n{run.stderr}")
        # Told only when it happened. (A failure may also go untold: one that
        # made a line on stderr go out unformatted.)
        self.assertTrue(failures > 0 or not (aside or lost_report), f"{where}:\n{run.stderr}")
        self.assertIsNotNone(report, f"{where}: no report at exit\n{run.stderr}")  # written once disarmed
        if isinstance(report, dict):
            try:
                check_books(report)
            except AssertionError as e:
                raise AssertionError(f"{where}: {e}") from None
        if aside:
            self.assertEqual(report["stepped_aside"], {"call": aside[0], "reason": "out of host memory (std::bad_alloc)"})
        else:
            # Nothing was left half done: the program freed all it allocated.
            self.assertNotIn("stepped_aside", report)
            stats = report["devices"]["0"]["stats"]
            self.assertEqual(stats["allocation.all.current"], 0, where)
            self.assertEqual(stats["allocated_bytes.all.current"], 0, where)
        return "aside" if aside else "report" if lost_report else "none"

    def test_failing_host_allocations_never_reach_the_program(self):
        outcomes = collections.Counter()
        for name, env in self.CONFIGS.items():
            run, report = self.run_failing(0, 0, env)
            self.check(run, report, 0, 0)
            total = run.output_json()["core_allocations"]
            self.assertGreater(total, 100, name)
            # Each of the first allocations, then a spread over the rest (the
            # report asked for by signal makes most of them); with
            # POOLTEST_EVERY_HOST_ALLOCATION=1, every one, alone and from there
            # on, and past the total (runs differ by a few dozen): about 20
            # minutes on two cores.
            if os.environ.get("POOLTEST_EVERY_HOST_ALLOCATION") == "1":
                firsts = list(range(1, total + 40))
                cases = [(n, every) for n in firsts for every in (0, 1)]
            else:
                firsts = sorted(set(range(1, 11)) | {11 + (total - 11) * i // 16 for i in range(17)})
                cases = [(n, 0) for n in firsts] + [(n, 1) for n in firsts[::3]]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                runs = list(pool.map(lambda case: (case, self.run_failing(*case, env)), cases))
            for (first, every), (run, report) in runs:
                with self.subTest(config=name, first=first, every=every):
                    outcomes[self.check(run, report, first, every)] += 1
        # Both ways a failure can end were seen.
        self.assertGreater(outcomes["aside"], 0, outcomes)
        self.assertGreater(outcomes["report"], 0, outcomes)

    def run_mode(self, mode, expandable, env=None):
        """test-host-oom MODE (after-reset, fork), which arms the failures
        itself; it must succeed. Only this run's report is left."""
        for path in glob.glob(os.path.join(self.workdir, "report-*")):
            os.remove(path)
        run = self.run_program(["test-host-oom", mode], library=f"{self.FAULTS}:{LIBRARY}",
                               env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable, **(env or {})})
        self.assertSucceeded(run)
        return run

    def test_once_stepped_aside_the_runtime_memory_is_never_taken_for_gpupools(self):
        # test-host-oom after-reset: gpupool's blocks are kept, not exported
        # over IPC, and after a device reset the runtime's memory at the
        # addresses of gpupool's old segment is freed by the runtime (the
        # program checks that the device ends with all its memory free).
        for expandable in ("0", "1"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_mode("after-reset", expandable)
                self.assertIn("gpupool steps aside", run.stderr)
                if expandable == "0" and NATIVE:  # an emulator's mmap does not give freed ranges again
                    # The case is there: the runtime's blocks landed in the old segment.
                    self.assertGreater(run.output_json()["in_old_segment"], 0)

    def test_once_stepped_aside_a_reset_returning_an_earlier_error_frees_gpupools_blocks(self):
        # test-host-oom after-reset, its reset returning an earlier launch's
        # error having reset: as after a reset without one, the runtime's
        # memory at the addresses of gpupool's old segment is the runtime's.
        for expandable in ("0", "1"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_mode("after-reset", expandable, {"SIMCUDA_RESET_ERROR": "late"})
                self.assertIn("gpupool steps aside", run.stderr)
                out = run.output_json()
                self.assertEqual(out["reset"], "cudaErrorLaunchFailure")
                if expandable == "0" and NATIVE:  # as above
                    self.assertGreater(out["in_old_segment"], 0)  # the case is there

    def test_once_stepped_aside_a_refused_reset_leaves_gpupools_blocks_to_it(self):
        # test-host-oom after-reset, its reset refused: nothing was freed, so
        # the block gpupool lent before it stepped aside keeps its bytes and
        # its free is still gpupool's to take (the runtime would refuse it, or
        # free a whole segment under it).
        for expandable in ("0", "1"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_mode("after-reset", expandable, {"SIMCUDA_RESET_ERROR": "refused"})
                self.assertIn("gpupool steps aside", run.stderr)
                self.assertEqual(run.output_json(), {"reset": "refused"})

    def test_a_fork_whose_handlers_cannot_allocate_leaves_parent_and_child_whole(self):
        # test-host-oom fork: every host allocation of gpupool's fails from the
        # fork handler's on (in the child until it exits); the parent disarms
        # after fork() and goes on with its pools.
        for expandable in ("0", "1"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_mode("fork", expandable)
                out = run.output_json()
                self.assertEqual(out["child_exit"], 0, run.stderr)
                self.assertGreater(out["parent_failures"], 0)  # the case is there
                self.assertNotIn("steps aside", run.stderr)  # nothing failed that the parent needed
                report = run.report()  # the parent's: the child used no CUDA
                self.assertNotIn("stepped_aside", report)
                self.assertEqual(report["devices"]["0"]["stats"]["allocation.all.current"], 0)

    def test_an_exit_without_host_memory_loses_only_the_report(self):
        # test-host-oom at-exit: blocks still live on two streams, then every
        # host allocation of gpupool's fails, through exit. The program exits
        # as it meant to, the trace keeps its lines, and one line says the
        # report is lost; gpupool does not step aside.
        for expandable in ("0", "1"):
            with self.subTest(expandable_segments=expandable):
                trace = os.path.join(self.workdir, f"trace-{expandable}.csv")
                run = self.run_program(["test-host-oom", "at-exit"], library=f"{self.FAULTS}:{LIBRARY}",
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable, "GPUPOOL_TRACE": trace})
                self.assertSucceeded(run)
                self.assertIn("gpupool: cannot make the report: std::bad_alloc", run.stderr)
                self.assertNotIn("steps aside", run.stderr)
                self.assertEqual(run.reports(), [])
                with open(trace) as f:
                    lines = f.read().splitlines()
                self.assertEqual([line.split(",")[2:5:2] for line in lines[1:]],
                                 [["allocate", str(3 << 20)], ["allocate", str(1 << 20)]])

    def test_every_form_of_the_report_says_where_gpupool_stepped_aside(self):
        import jsonschema
        run, report = self.run_failing(1, 0, {})
        self.assertSucceeded(run)
        call = re.search(r"^gpupool: (\S+) failed inside gpupool: ", run.stderr, re.M).group(1)
        with open(os.path.join(SOURCE, "docs", "report.schema.json")) as f:
            jsonschema.validate(report, json.load(f))
        self.assertEqual(report["stepped_aside"]["call"], call)
        told = f"gpupool stepped aside at {call}: out of host memory (std::bad_alloc)"
        path = os.path.join(self.workdir, "report.json")
        with open(path, "w") as f:
            json.dump(report, f)
        viewer = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "gpupool"), "report", path],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(viewer.returncode, 0, viewer.stderr)
        self.assertIn(told, viewer.stdout)
        run, text = self.run_failing(1, 0, {}, fmt="text")
        self.assertSucceeded(run)
        self.assertIn(told, text)


if __name__ == "__main__":
    main()
