"""The process around gpupool: programs that never use CUDA, exit, fork,
device resets, IPC handles, the segment modes, the configuration's errors,
and an unchanged program built with nvcc."""
import collections
import csv
import glob
import itertools
import json
import os
import shutil
import subprocess

from harness import BUILD, DRIVER_WAYS, ShimTest, check_books, main, native_only, sanitizer_runtime


# A forked child of a process whose simulated device runs a thread: under
# AddressSanitizer (GCC 12's), the child's leak check at exit can wait forever
# for an allocator lock that thread held at the fork (seen once in five runs).
# gpupool makes no thread; the leak check stays on everywhere else.
NO_LEAK_CHECK_AFTER_FORK = {"ASAN_OPTIONS": "detect_leaks=0"}


class Lifecycle(ShimTest):
    @native_only
    def test_no_report_from_processes_that_never_use_cuda(self):
        for command in (["/bin/true"], ["sh", "-c", "ls / >/dev/null; echo hi"]):
            run = self.run_program(command)
            self.assertSucceeded(run)
            self.assertEqual(run.reports(), [])
            self.assertEqual(run.stderr, "")

    def test_a_process_that_used_cuda_unseen_is_told_once(self):
        # The driver loaded, but no allocation reached gpupool (nvcc's static
        # runtime, the driver API): one line says why nothing was pooled, in
        # whichever process used CUDA, never in a child that inherited it.
        driver = os.path.join(BUILD, "tests", "fake-driver", "libcuda.so.1")
        told = "so gpupool pooled nothing"
        for use, lines in (("none", 1), ("stream", 1), ("alloc", 0)):
            for fork in ([], ["fork"]):
                with self.subTest(use=use, fork=bool(fork)):
                    reports_before = len(glob.glob(os.path.join(self.workdir, "report-*")))
                    run = self.run_program(["test-lifecycle", "driver", driver, use] + fork,
                                           env=NO_LEAK_CHECK_AFTER_FORK if fork else None)
                    self.assertSucceeded(run)
                    self.assertEqual(run.stderr.count(told), lines, run.stderr)
                    self.assertEqual(len(run.reports()) - reports_before, 1 - lines)
        for env in ({"GPUPOOL_DISABLE": "1"}, {"GPUPOOL_LOG_LEVEL": "error"}):
            with self.subTest(env=env):
                run = self.run_program(["test-lifecycle", "driver", driver, "stream"], env=env)
                self.assertSucceeded(run)
                self.assertNotIn(told, run.stderr)

    def test_frees_in_static_destructors_count_before_the_report(self):
        run = self.run_program(["test-lifecycle", "static"])
        self.assertSucceeded(run)
        self.assertEqual(run.report()["devices"]["0"]["leaks"]["blocks"], 0)

    def test_frees_in_thread_local_destructors_after_the_threads_cache_is_gone_reach_the_pool(self):
        # The program's thread_local, made before the thread's first CUDA
        # call, is destroyed after gpupool's cache holder: its frees found
        # the deleted cache (a use after free under ASan; without it, the
        # blocks were stranded and reported leaked).
        # The destructor then allocates one more block (past the cache, which
        # is gone), fills and checks it, and frees it.
        run = self.run_program(["test-lifecycle", "thread-exit"])
        self.assertSucceeded(run)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["leaks"]["blocks"], 0)
        # The warm-up's, the two freed at exit, the one kept, the late one.
        self.assertEqual(device["stats"]["allocation.all.allocated"], 5)
        self.assertEqual(device["stats"]["allocation.all.freed"], 5)

    def test_forked_child_writes_no_report_of_its_parent(self):
        run = self.run_program(["test-lifecycle", "fork"], env=NO_LEAK_CHECK_AFTER_FORK)
        self.assertSucceeded(run)
        self.assertEqual(len(run.reports()), 1)

    def test_fork_while_another_thread_writes_reports_goes_on(self):
        # fork's handler takes gpupool's locks in the order the other paths
        # nest them: a device's pool, then the call sites (a report names
        # them with the pool's held) and the trace (a free is traced so).
        run = self.run_program(["test-lifecycle", "fork-reports", "300"], timeout=60,
                               env=dict(NO_LEAK_CHECK_AFTER_FORK, GPUPOOL_BACKTRACE="1",
                                        GPUPOOL_LOG=os.path.join(self.workdir, "report.json"),
                                        GPUPOOL_TRACE=os.path.join(self.workdir, "trace.csv")))
        self.assertSucceeded(run)

    def test_fork_handlers_in_the_child_touch_no_heap(self):
        # Another thread may hold an allocator's lock at the fork (ASan's
        # stack depot, say): a heap call in the child's handler could wait
        # for it for good. The trace, call sites and thread caches are on,
        # on two devices.
        run = self.run_program(["test-fork", "handlers"], env=dict(
            NO_LEAK_CHECK_AFTER_FORK, GPUPOOL_BACKTRACE="1", SIMCUDA_DEVICES="2",
            GPUPOOL_TRACE=os.path.join(self.workdir, "trace-%p-dev%d.csv")))
        self.assertSucceeded(run)
        result = run.output_json()
        if result.get("skipped"):
            self.assertIsNotNone(sanitizer_runtime())  # a sanitizer's allocator cannot be wrapped
            return
        self.assertEqual(result, {"child_heap_calls": 0})

    def test_children_forked_while_threads_allocate_exit_and_the_threads_go_on(self):
        # A data loader forks its workers while the training threads allocate,
        # plain and stream-ordered, with their caches: each child exits through
        # the exit handlers (gpupool's among them), none waits for good, and
        # the threads find their blocks intact.
        run = self.run_program(["test-threads", "busy-at-fork", "3", "40"], env=NO_LEAK_CHECK_AFTER_FORK, timeout=300)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"threads": 3, "children": 40, "failed": 0})
        # At least a pair (two allocations) between one fork and the next.
        self.assertGreaterEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 2 * 40)

    def test_a_forked_child_writes_its_lines_while_another_thread_was_writing_one_at_the_fork(self):
        # The thread is held inside gpupool's line (stderr a full pipe) when
        # the program forks; the child's own line waited for good on the
        # lock that thread held.
        run = self.run_program(["test-fork", "message-at-fork"], env=NO_LEAK_CHECK_AFTER_FORK)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"child_finished": True}, run.stderr)

    def test_a_forked_child_flushes_caches_while_another_thread_was_flushing_them_at_the_fork(self):
        # One thread flushes the threads' caches (a trim) and waits, with the
        # caches' flush lock, for a pool lock that another thread holds in
        # its out-of-memory line (stderr a full pipe) when the program forks.
        # The child's report at exit flushes the caches too: it waited for
        # good when the fork came between the two locks.
        run = self.run_program(["test-fork", "flush-at-fork"], env=NO_LEAK_CHECK_AFTER_FORK)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"child_finished": True}, run.stderr)

    def test_a_forked_child_resets_its_device_while_another_thread_was_using_its_cache(self):
        # The thread's cache hits take a lock of gpupool's table of live
        # blocks, which fork's handlers do not hold. A child that allocates
        # and resets the device must not walk that table: without that, 2 to
        # 4 of 20 children waited for good in each of 3 runs.
        run = self.run_program(["test-fork", "reset-in-child"], env=NO_LEAK_CHECK_AFTER_FORK, timeout=600)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"children_finished": 40}, run.stderr)

    def test_a_forked_child_traces_and_reports_only_its_own_calls(self):
        # The parent: a second thread's 512 bytes (thread caches on), then
        # 1 MiB plain and 3 MiB stream-ordered twice (the second 3 MiB a
        # hit in its thread's cache); the child: 2 MiB and 4 MiB.
        parent = {512: 1, 1 << 20: 2, 3 << 20: 2}
        child = {2 << 20: 1, 4 << 20: 1}
        for template, processes in (("trace-%p.csv", 2), ("trace.csv", 1)):
            with self.subTest(template=template):
                for path in glob.glob(os.path.join(self.workdir, "*")):
                    os.remove(path)
                run = self.run_program(["test-fork", "child-uses-cuda"], env=dict(
                    NO_LEAK_CHECK_AFTER_FORK, GPUPOOL_TRACE=os.path.join(self.workdir, template)))
                self.assertSucceeded(run)
                traced = []
                for path in sorted(glob.glob(os.path.join(self.workdir, "trace*.csv"))):
                    with open(path) as f:
                        rows = list(csv.reader(f))
                    self.assertEqual(rows[0], ["Thread", "Time", "Action", "Pointer", "Size", "Stream"])
                    allocated = collections.Counter(int(r[4]) for r in rows[1:] if r[2] == "allocate")
                    freed = collections.Counter(int(r[4]) for r in rows[1:] if r[2] == "free")
                    self.assertEqual(allocated, freed, path)
                    traced.append(dict(allocated))
                # Without %p the child would write into the parent's file: it does not trace.
                self.assertCountEqual(traced, [parent, child][:processes])
                reported = {}
                for path in run.reports():
                    with open(path) as f:
                        report = json.load(f)
                    check_books(report)
                    device = report["devices"]["0"]
                    self.assertEqual(device["leaks"]["blocks"], 0, path)
                    allocated = device["stats"]["allocation.all.allocated"]
                    reported[allocated, device["stats"]["allocation.all.freed"]] = report["wall_seconds"]
                self.assertCountEqual(reported, [(5, 5), (2, 2)])
                # The parent waited 1.5 s before the fork, then for the child,
                # whose run starts at the fork.
                self.assertGreaterEqual(reported[5, 5] - reported[2, 2], 1.4)

    # Every way test-lifecycle resets the device: the runtime's cudaDeviceReset,
    # CUDA 12's cudaThreadExit, and the driver's cuDevicePrimaryCtxReset however
    # the program or a library reaches it (Numba and CUDA.jl reset so).
    RESETS = ("cudaDeviceReset", "thread-exit") + DRIVER_WAYS
    DRIVER_LOOKUP = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")

    def test_nothing_from_before_a_device_reset_is_handed_out_after_it(self):
        # Blocks kept in a thread's cache when the device is reset are gone
        # with it; the next requests get new memory (the memset fails on
        # memory the reset took), whichever call made the reset.
        for expandable, how in itertools.product(("1", "0"), self.RESETS):
            with self.subTest(expandable_segments=expandable, reset=how):
                self.remove_reports()  # also a failed subtest's
                run = self.run_program(["test-lifecycle", "reset", how, self.DRIVER_LOOKUP],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertIn("lifecycle: reset", run.stdout)
                self.assertEqual(run.counters()["stale_event_uses"], 0)

    def test_the_drivers_free_of_a_block_gpupool_lent_frees_it_in_the_pool(self):
        # CUDA lets either API free what the other allocated. The driver's own
        # cuMemFree took a fixed segment from under the pool (lent again while
        # the driver reused the memory) and refused an expandable segment's
        # mapped pages (the block leaked); now the pool frees the block, however
        # the program reaches the driver's free, plain or stream-ordered (its
        # per-thread version too). Memory the driver allocated stays the
        # driver's to free, and a block freed twice is refused with a line
        # naming the driver's call.
        frees = (("driver-free", "cuMemFree"), ("driver-free-async", "cuMemFreeAsync"))
        ways = DRIVER_WAYS
        for expandable, (mode, call), how in itertools.product(("1", "0"), frees, ways):
            with self.subTest(expandable_segments=expandable, free=call, how=how):
                self.remove_reports()  # also a failed subtest's
                run = self.run_program(["test-lifecycle", mode, how, self.DRIVER_LOOKUP],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertIn("lifecycle: " + mode + "\n", run.stdout)
                self.assertIn("gpupool: " + call + ": ", run.stderr)
                dev = run.report()["devices"]["0"]
                s = dev["stats"]
                self.assertEqual(s["allocation.all.allocated"], 11)  # three before, eight after
                self.assertEqual(s["allocation.all.freed"], 11)
                self.assertEqual(dev["leaks"]["blocks"], 0)
                # The per-thread version's null stream is the thread's own
                # default stream (no other call of the program names it).
                per_thread = [row for row in dev["streams"] if row["stream"].startswith("per-thread")]
                self.assertEqual(len(per_thread), 1 if mode == "driver-free-async" else 0)

    def test_a_stream_ordered_block_live_at_a_reset_cannot_be_freed_into_a_cache_after_it(self):
        # The reset freed it: its free is refused (the runtime judges a
        # pointer gpupool does not know), as without gpupool, and the next
        # request of its size gets new memory. The block was its thread
        # cache's, lent again for 3.5 MiB: the reset frees those 3.5 MiB
        # (the pool lent it for 4 MiB), and the books balance.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-lifecycle", "reset-live"],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertIn("lifecycle: reset-live", run.stdout)
                report = run.report()
                os.remove(run.reports()[0])
                dev = report["devices"]["0"]
                self.assertEqual(dev["device_resets"]["blocks_freed_by_reset"], 1)
                self.assertEqual(dev["stats"]["allocation.all.current"], 0)
                self.assertEqual(dev["stats"]["requested_bytes.all.allocated"], 512 + (4 << 20) * 2 + (7 << 19))
                self.assertEqual(dev["stats"]["requested_bytes.all.freed"], 512 + (4 << 20) * 2 + (7 << 19))

    def test_a_reset_answered_with_an_error_is_judged_by_the_memory_it_left(self):
        # A reset may be refused (nothing reset: the program's blocks keep
        # their bytes and are still gpupool's to free), or return an earlier
        # launch's error having reset all the same (their memory is gone, and
        # must not be lent again).
        for error, answer, resets in (("refused", "cudaErrorNotPermitted", 0), ("late", "cudaErrorLaunchFailure", 1)):
            for expandable in ("1", "0"):
                with self.subTest(reset=error, expandable_segments=expandable):
                    run = self.run_program(["test-lifecycle", "reset-error"],
                                           env={"SIMCUDA_RESET_ERROR": error, "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                    self.assertSucceeded(run)
                    self.assertEqual(run.output_json(), {"reset": answer})
                    self.assertEqual(run.counters()["stale_event_uses"], 0)
                    report = run.report()
                    os.remove(run.reports()[0])
                    dev = report["devices"]["0"]
                    self.assertEqual(dev["device_resets"]["count"], resets)
                    self.assertEqual(dev["device_resets"]["blocks_freed_by_reset"], 2 * resets)
                    self.assertEqual(dev["stats"]["allocation.all.current"], 0)

    def test_the_report_covers_the_run_across_a_device_reset(self):
        # One 512-byte block on another thread (to turn the thread caches on),
        # two blocks freed into this thread's cache and one never freed before
        # the reset, two blocks after it: the report counts all six, only the
        # one the program held as freed by the reset, none leaked at exit.
        # Each other way to reset counts as the one reset it is.
        for backtrace, how in [("1", "cudaDeviceReset")] + [("0", how) for how in self.RESETS]:
            with self.subTest(backtrace=backtrace, reset=how):
                self.remove_reports()  # also a failed subtest's
                run = self.run_program(["test-lifecycle", "reset", how, self.DRIVER_LOOKUP],
                                       env={"GPUPOOL_BACKTRACE": backtrace})
                self.assertSucceeded(run)
                dev = run.report()["devices"]["0"]
                s = dev["stats"]
                self.assertEqual(s["allocation.all.allocated"], 6)
                self.assertEqual(s["requested_bytes.all.allocated"], 512 + ((1 + 3 + 2 + 1 + 3) << 20))
                for key in ("allocation", "allocated_bytes", "requested_bytes", "reserved_bytes", "segment"):
                    self.assertEqual(s[f"{key}.all.allocated"] - s[f"{key}.all.freed"], s[f"{key}.all.current"])
                for key in ("allocation", "allocated_bytes", "requested_bytes"):
                    self.assertEqual(s[f"{key}.all.current"], 0)
                self.assertGreaterEqual(s["requested_bytes.all.peak"], (1 + 3) << 20)  # before the reset
                self.assertEqual(dev["leaks"]["blocks"], 0)
                # The two were in this thread's cache at the reset (the caches
                # turned on though the thread that turned them on had ended).
                self.assertEqual(dev["thread_cache_kept_peak_bytes"], (1 + 3) << 20)
                resets = dev["device_resets"]
                self.assertEqual((resets["count"], resets["blocks_freed_by_reset"]), (1, 1))
                self.assertEqual(resets["bytes_freed_by_reset"], 2 << 20)
                self.assertEqual(sum(site["blocks"] for site in resets["sites"]), int(backtrace))
                if backtrace == "1":
                    self.assertNotIn("GPUPOOL_BACKTRACE=1", " ".join(dev["advice"]))
                else:
                    self.assertIn("still allocated when a device reset freed them", " ".join(dev["advice"]))

    def test_ipc_handle_that_would_name_other_memory_is_refused(self):
        # A handle names the whole segment: given for a block that does not
        # start it, the other process would map other bytes than the block.
        # The driver's cuIpcGetMemHandle is refused alike however the program
        # reaches it, and leaves the runtime's last error alone.
        ways = [("cudaIpcGetMemHandle", "cudaErrorInvalidValue", "cudaErrorInvalidValue", "cudaSuccess")]
        ways += [(how, "CUDA_ERROR_INVALID_VALUE", "cudaSuccess", "CUDA_SUCCESS")
                 for how in DRIVER_WAYS]
        for how, refusal, error_after, success in ways:
            call = "cudaIpcGetMemHandle" if how == "cudaIpcGetMemHandle" else "cuIpcGetMemHandle"
            refused = f"{call}: {refusal}, then {error_after}"
            given = f"{call}: {success}, then cudaSuccess"
            for expandable, says, results in (
                    ("1", "expandable segment, which CUDA IPC cannot share", [refused] * 4),
                    ("0", "4096 bytes into a pooled segment", [given, refused] * 2)):
                with self.subTest(how=how, expandable=expandable):
                    run = self.run_program(["test-lifecycle", "ipc", how, self.DRIVER_LOOKUP],
                                           env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                    self.assertSucceeded(run)
                    self.assertEqual(run.stdout.splitlines(), results)
                    self.assertIn(f"gpupool: {call}: ", run.stderr)
                    self.assertIn(says, run.stderr)
                    self.assertEqual(run.stderr.count(f"refused with {refusal}."), results.count(refused))
                    self.assertIn("GPUPOOL_DISABLE=1", run.stderr)
            with self.subTest(how=how, disabled=True):
                run = self.run_program(["test-lifecycle", "ipc", how, self.DRIVER_LOOKUP],
                                       env={"GPUPOOL_DISABLE": "1"})
                self.assertSucceeded(run)
                self.assertEqual(run.stdout.splitlines(), [given] * 4)
                self.assertNotIn("IPC", run.stderr)

    def test_ipc_handle_of_memory_gpupool_does_not_own_is_the_runtimes(self):
        # Memory from a pool the program made is the runtime's: gpupool passes
        # the handle requests on, for it and for a pointer inside it, and
        # refuses nothing. The answers are the runtime's own.
        runtime = self.run_program(["test-lifecycle", "ipc-foreign"], env={"GPUPOOL_DISABLE": "1"})
        self.assertSucceeded(runtime)
        self.assertEqual(len(runtime.stdout.splitlines()), 2)
        for expandable in ("1", "0"):
            with self.subTest(expandable=expandable):
                run = self.run_program(["test-lifecycle", "ipc-foreign"],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.stdout, runtime.stdout)
                self.assertNotIn("IPC", run.stderr)

    def test_fixed_segments_use_cudamalloc(self):
        run = self.run_program(["test-repeat", "5"], env={"GPUPOOL_EXPANDABLE_SEGMENTS": "0"})
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["vmm_maps"], 0)
        self.assertGreater(run.counters()["malloc_calls"], 0)

    def test_a_driver_without_virtual_memory_gets_fixed_segments_and_a_warning(self):
        run = self.run_program(["test-repeat", "5"], env={"SIMCUDA_NO_VMM": "1",
                                                          "GPUPOOL_CONF": "max_split_size_mb:64"})
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["vmm_maps"], 0)
        self.assertGreater(run.counters()["malloc_calls"], 0)
        self.assertIn("expandable_segments:1 needs the driver's virtual memory calls", run.stderr)
        self.assertEqual(run.report()["config_problems"], [])
        self.assertEqual(run.counters()["malloc_calls"], run.report()["devices"]["0"]["stats"]["num_device_alloc"])

    def test_a_split_limit_pasted_with_expandable_segments_is_told_not_refused(self):
        run = self.run_program(["test-repeat", "5"], env={"GPUPOOL_CONF": "max_split_size_mb:64",
                                                          "GPUPOOL_STRICT": "1"})
        self.assertSucceeded(run)
        self.assertIn("max_split_size_mb (64) applies to fixed segments only", run.stderr)
        self.assertNotIn("needs the driver's virtual memory", run.stderr)
        # The report keeps the note beside the settings it is about.
        notes = run.report()["config_notes"]
        self.assertEqual(len(notes), 1, notes)
        self.assertIn("max_split_size_mb (64) applies to fixed segments only", notes[0])
        self.assertGreater(run.counters()["vmm_maps"], 0)
        quiet = self.run_program(["test-repeat", "2"], env={"GPUPOOL_CONF": "max_split_size_mb:64",
                                                            "GPUPOOL_LOG_LEVEL": "warn"})
        self.assertNotIn("max_split_size_mb", quiet.stderr)

    def test_disabled_is_pure_pass_through(self):
        run = self.run_program(["test-repeat", "5"], env={"GPUPOOL_DISABLE": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.reports(), [])
        self.assertEqual(run.counters()["malloc_calls"], 50)

    def test_bad_configuration_keeps_the_program_running(self):
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_MAX_SPLIT_SIZE_MB": "lots",
                                                           "GPUPOOL_CONF": "bogus:1"})
        self.assertSucceeded(run)
        self.assertIn("gpupool: GPUPOOL_MAX_SPLIT_SIZE_MB: not a size", run.stderr)
        self.assertIn("unknown key 'bogus'", run.stderr)
        self.assertEqual(len(run.report()["config_problems"]), 2)
        self.assertEqual(run.report()["config_notes"], [])

    def test_strict_configuration_stops_after_listing_every_problem(self):
        run = self.run_program(["test-repeat", "2"], env={"GPUPOOL_MAX_SPLIT_SIZE_MB": "lots",
                                                           "GPUPOOL_LOG_FORMAT": "xml", "GPUPOOL_STRICT": "1"})
        self.assertNotEqual(run.code, 0)
        self.assertIn("GPUPOOL_MAX_SPLIT_SIZE_MB", run.stderr)
        self.assertIn("GPUPOOL_LOG_FORMAT", run.stderr)
        self.assertIn("GPUPOOL_STRICT=1", run.stderr)

    @native_only
    def test_unchanged_nvcc_program_runs_under_the_shim(self):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.path.exists(nvcc):
            self.skipTest("nvcc not installed")
        source = os.path.join(self.workdir, "user.cu")
        with open(source, "w") as f:
            f.write(USER_PROGRAM)
        binary = os.path.join(self.workdir, "user")
        subprocess.run([nvcc, "-cudart", "shared", "-o", binary, source], check=True, capture_output=True)
        run = self.run_program([binary])
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual(stats["allocation.all.allocated"], 300)
        self.assertLess(stats["num_device_alloc"], 10)


USER_PROGRAM = r"""
#include <cstdio>
__global__ void scale(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }
int main() {
  for (int step = 0; step < 100; ++step) {
    float *a, *b, *c;
    if (cudaMalloc(&a, 4 << 20) || cudaMalloc(&b, 1000) || cudaMalloc(&c, (step + 1) * 4096)) return 1;
    scale<<<16, 256>>>(a, 4096);
    cudaFree(c); cudaFree(b); cudaFree(a);
  }
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
"""


if __name__ == "__main__":
    main()
