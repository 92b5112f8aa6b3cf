"""The shim under real programs: data integrity, reuse, fidelity with the
runtime, pitched memory, a device fault."""
import json
import os
import re
import shutil
import subprocess

from harness import BUILD, CORE, EXPORTS_DLSYM, LIBRARY, ShimTest, check_books, main, native_only, sanitizer_runtime


class Integrity(ShimTest):
    def test_patterns_stay_intact_across_seeds(self):
        for seed, expandable in ((1, "1"), (2, "1"), (3, "0"), (4, "0")):
            with self.subTest(seed=seed, expandable_segments=expandable):
                run = self.run_program(["test-patterns", "3000", str(seed)],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                did = run.output_json()
                stats = run.report()["devices"]["0"]["stats"]
                self.assertEqual(stats["allocation.all.allocated"], did["allocations"])
                self.assertEqual(stats["allocation.all.freed"], did["frees"])
                self.assertEqual(stats["requested_bytes.all.peak"], did["peak_requested"])
                self.assertEqual(stats["allocation.all.current"], 0)
                self.assertEqual(stats["requested_bytes.all.current"], 0)
                report = run.report()
                upstream = stats["num_device_alloc"] + report["devices"]["0"]["upstream"]["page_maps"]
                self.assertGreater(upstream, 0)
                # Random sizes that keep growing: page mappings follow the new
                # peaks more closely than whole segments do.
                self.assertLess(upstream, did["allocations"] / (2 if expandable == "1" else 10))
                # All the device memory the program used was gpupool's: the
                # report's peak reserved is what the device counted.
                self.assertEqual(stats["reserved_bytes.all.peak"], run.counters()["peak_bytes_in_use"])
                os.remove(run.reports()[0])

    def test_beside_many_non_blocking_streams_plain_reuse_searches_by_default(self):
        # 8 idle non-blocking streams (with the program's own, 9): the default
        # search takes memory a barrier covers from larger blocks, and every
        # pattern stays intact; set to 0, it records those barriers instead.
        figures = {}
        for search in ("auto", "0"):
            with self.subTest(plain_reuse_search=search):
                run = self.run_program(["test-patterns", "3000", "6", "8"],
                                       env={"GPUPOOL_PLAIN_REUSE_SEARCH": search})
                self.assertSucceeded(run)
                device = run.report()["devices"]["0"]
                check_books(run.report())
                row = [s for s in device["streams"] if s["stream"] == "cudaMalloc/cudaFree"][0]
                figures[search] = (row["searched_reuses"], row["fences_recorded"])
                os.remove(run.reports()[0])
        searched, barriers = figures["auto"]
        self.assertGreater(searched, 0)
        self.assertEqual(figures["0"][0], 0)
        self.assertLess(barriers, figures["0"][1])
        # 7 non-blocking streams, one short of 8: auto does not search.
        run = self.run_program(["test-patterns", "3000", "6", "6"])
        self.assertSucceeded(run)
        row = [s for s in run.report()["devices"]["0"]["streams"] if s["stream"] == "cudaMalloc/cudaFree"][0]
        self.assertEqual(row["searched_reuses"], 0)
        os.remove(run.reports()[0])

    def test_patterns_program_passes_without_gpupool_too(self):
        # The control: the program's checks hold against the runtime alone.
        run = self.run_program(["test-patterns", "1000", "4"], preload=False)
        self.assertSucceeded(run)
        self.assertEqual(run.reports(), [])

    def test_blocks_parked_in_a_thread_cache_do_not_double_the_memory(self):
        # One thread frees 16 x 8 MiB stream-ordered (kept in its cache); a
        # second then needs as much on its own stream. Once the pool has had
        # to grow, the parked blocks go back to it and serve the rest.
        run = self.run_program(["test-parked", "16", "8"])
        self.assertSucceeded(run)
        device = run.report()["devices"]["0"]
        self.assertLessEqual(device["stats"]["reserved_bytes.all.peak"], (128 + 16) << 20)
        # The first thread kept its 16 blocks: the report says so.
        self.assertGreaterEqual(device["thread_cache_kept_peak_bytes"], 128 << 20)
        os.remove(run.reports()[0])

    def test_at_the_memory_limit_parked_blocks_come_back_before_the_cache_is_released(self):
        # The same, with no room to grow past the first thread's blocks: the
        # pool takes back what threads keep (no device call) before it would
        # release its cache (a host wait and device frees) and try again.
        run = self.run_program(["test-parked", "16", "8"], env={"GPUPOOL_MEMORY_LIMIT": "130M"})
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertLessEqual(stats["reserved_bytes.all.peak"], 130 << 20)
        self.assertEqual(stats["num_ooms"], 0)
        self.assertEqual(stats["num_alloc_retries"], 0)
        os.remove(run.reports()[0])

    def test_a_block_freed_twice_while_in_a_thread_cache_is_refused(self):
        run = self.run_program(["test-parked", "double-free"])
        self.assertSucceeded(run)
        self.assertIn("not a live allocation", run.stderr)

    def test_blocks_past_a_thread_caches_limit_go_back_to_the_pool_whole(self):
        # An 8 MiB cache: one spill given back and made a plain block, then
        # rounds of 16 sizes of 1-2 MiB (23.5 MiB) allocated together and
        # freed, about two thirds of whose frees find the cache full; a block
        # past the limit waits as the spill that the next allocation gives
        # back under the device's lock. Every pattern holds and every free
        # succeeds (checked by the program), and nothing stays allocated.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-parked", "spill"],
                                       env={"GPUPOOL_THREAD_CACHE_SIZE": "8M",
                                            "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                device = run.report()["devices"]["0"]
                os.remove(run.reports()[0])
                did = run.output_json()
                stats = device["stats"]
                self.assertEqual(stats["allocation.all.allocated"], did["allocations"])
                self.assertEqual(stats["allocation.all.current"], 0)
                self.assertEqual(stats["allocated_bytes.all.current"], 0)
                # The cache reached its limit; the spill is the only block past it.
                kept = device["thread_cache_kept_peak_bytes"]
                self.assertGreater(kept, 6 << 20)
                self.assertLessEqual(kept, (8 << 20) + (2 << 20))
                # Every stream-ordered free of the second thread went to its
                # cache (the first thread's went to the pool: caches were off).
                self.assertEqual(device["thread_cache_frees"], did["allocations"] - 1 - 2)
                self.assertGreater(device["thread_cache_frees_found_full"], 20 * 16 // 4)
                # Pages mapped as needed leave the spill the only free block
                # of its size: the plain block was made from it. (Fixed
                # segments give the plain requests a segment of their own.)
                if expandable == "1":
                    self.assertTrue(did["plain_reused_spill"])

    def test_a_cache_too_small_for_a_threads_blocks_is_advised_larger(self):
        # 80 rounds of 16 sizes live at once, 23.5 MiB together: an 8 MiB
        # cache is found full by about two thirds of the frees, each of
        # which sends a block back to the pool; a 64 MiB one by none.
        for size, full in (("8M", True), ("64M", False)):
            with self.subTest(thread_cache_size=size):
                run = self.run_program(["test-parked", "spill", "80"], env={"GPUPOOL_THREAD_CACHE_SIZE": size})
                self.assertSucceeded(run)
                device = run.report()["devices"]["0"]
                os.remove(run.reports()[0])
                advised = [line for line in device["advice"] if "from full per-thread caches" in line]
                if full:
                    self.assertGreater(device["thread_cache_blocks_let_go"] * 4, device["thread_cache_frees"])
                    self.assertLessEqual(device["thread_cache_blocks_let_go"], device["thread_cache_frees"])
                    self.assertEqual(len(advised), 1, device["advice"])
                    self.assertIn("GPUPOOL_THREAD_CACHE_SIZE=8M)", advised[0])
                else:
                    self.assertEqual(device["thread_cache_frees_found_full"], 0)
                    self.assertEqual(device["thread_cache_blocks_let_go"], 0)
                    self.assertEqual(advised, [])

    def test_a_cache_found_full_that_sends_nothing_back_is_not_advised_larger(self):
        # 100 rounds of 11 sizes one at a time: all but the largest fit a 32
        # MiB cache, and the largest, which no smaller block can serve, waits
        # as the spill and serves its size in the next round. The cache is
        # found full about once a round (more than 1 free in 100), but sends
        # back next to nothing: a larger cache would save no lock trip.
        run = self.run_program(["test-parked", "spill-cycle", "100"], env={"GPUPOOL_THREAD_CACHE_SIZE": "32M"})
        self.assertSucceeded(run)
        device = run.report()["devices"]["0"]
        os.remove(run.reports()[0])
        frees = device["thread_cache_frees"]
        self.assertEqual(frees, run.output_json()["allocations"] - 1)
        self.assertGreater(device["thread_cache_frees_found_full"] * 100, frees * 5)
        self.assertLess(device["thread_cache_blocks_let_go"] * 100, frees)
        self.assertEqual([line for line in device["advice"] if "per-thread caches" in line], [], device["advice"])

    def test_without_thread_caches_the_peaks_are_exact(self):
        run = self.run_program(["test-parked", "16", "8"], env={"GPUPOOL_THREAD_CACHE_SIZE": "0"})
        self.assertSucceeded(run)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["thread_cache_kept_peak_bytes"], 0)
        self.assertEqual(device["thread_cache_frees"], 0)  # off: no free even offered to a cache
        self.assertEqual(device["stats"]["allocated_bytes.all.peak"], 128 << 20)
        self.assertEqual(device["stats"]["requested_bytes.all.peak"], 128 << 20)
        self.assertEqual(device["cache"]["hits"] + device["cache"]["misses"], 2 * 16 + 1)  # all through the pool

    def test_threads_allocate_on_one_thread_free_on_another(self):
        run = self.run_program(["test-threads", "3", "300"])
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual(stats["allocation.all.current"], 0)
        self.assertEqual(stats["allocation.all.allocated"], 900)

    def test_threads_that_come_and_go_leave_no_stream_behind(self):
        # Each ended thread's per-thread stream leaves the pool's books (the
        # report keeps 64 of them and one row for the rest); the main thread's
        # stays. Blocks they left live or cached are checked and reused, and
        # blocks freed by a thread_local's destructor after gpupool's own
        # thread-locals are gone bring no stream back.
        threads = 300
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-threads", "come-and-go", str(threads)],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                did = run.output_json()
                self.assertEqual(did["left"], threads // 10)
                device = run.report()["devices"]["0"]
                os.remove(run.reports()[0])
                stats = device["stats"]
                kept_to_the_end = (threads + 6) // 7
                self.assertEqual(stats["allocation.all.allocated"], threads + 1 + threads // 3 + kept_to_the_end)
                self.assertEqual(stats["allocation.all.current"], 0)
                per_thread = [s for s in device["streams"] if s["stream"].startswith("per-thread")]
                alive = [s["stream"] for s in per_thread if s["alive"]]
                self.assertEqual(len(alive), 1, alive)  # the main thread's
                self.assertEqual(len(per_thread) - 1, 63)  # gone: the first 63 ended threads'
                [later] = [s for s in device["streams"] if s["stream"] == "later streams"]
                # The other ended threads' streams, and the main thread's stream destroyed at the end.
                self.assertEqual(later["streams"], threads - 63 + 1)
                self.assertTrue(all(s["streams"] == 1 for s in device["streams"] if s is not later))
                # Not a block per thread (the fix before this kept each one pending).
                self.assertLess(stats["reserved_bytes.all.peak"], threads // 2 << 20)


    def test_a_main_thread_that_calls_pthread_exit_ends_its_stream_like_any_thread(self):
        # Its per-thread stream leaves the books (its cache goes back first),
        # and the process goes on in the thread it started. A main thread
        # that returns keeps its stream to the report (see above).
        if sanitizer_runtime():
            # ThreadSanitizer cannot join the main thread. LeakSanitizer finds
            # 32 bytes of glibc's thread_local exit entries there, without
            # gpupool too, from a frame it cannot name (no suppression matches).
            self.skipTest("the sanitizers' runtimes do not follow a main thread's pthread_exit")
        run = self.run_program(["test-threads", "main-exits"])
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"main ended": 1})
        device = run.report()["devices"]["0"]
        per_thread = {s["stream"]: s["alive"] for s in device["streams"] if s["stream"].startswith("per-thread")}
        # The thread that turned the caches on, the main thread, the one that outlived it.
        self.assertEqual(per_thread, {"per-thread #1": False, "per-thread #2": False, "per-thread #3": True})
        self.assertEqual(device["stats"]["allocation.all.current"], 0)

    def run_key_destructor_threads(self, mode, threads):
        """Runs test-threads MODE THREADS, whose threads make CUDA calls from a
        pthread key's destructor, and returns its device's report. A
        thread_local first used that late (gpupool's cache holder, the
        simulated runtime's stream) is registered after glibc has run the
        thread's thread_local destructors: glibc never runs nor frees that
        entry (32 bytes). Under ASan, only those entries are let go."""
        suppressions = os.path.join(self.workdir, "lsan.supp")
        with open(suppressions, "w") as f:
            f.write("leak:__cxa_thread_atexit_impl\n")
        run = self.run_program(["test-threads", mode, str(threads)],
                               env={"LSAN_OPTIONS": f"suppressions={suppressions}"})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["corrupted"], 0)
        return run.report()["devices"]["0"]

    def test_a_thread_whose_first_calls_come_from_a_key_destructor_leaves_no_stream_behind(self):
        # Its cache is made after the thread_local destructors that hand caches
        # back have run: gpupool's own thread-end hook hands it back before the
        # stream leaves the books (else its block came back later under the
        # ended stream, as a live row).
        threads = 50
        device = self.run_key_destructor_threads("first-use-at-exit", threads)
        alive = [s["stream"] for s in device["streams"] if s["alive"] and s["stream"].startswith("per-thread")]
        self.assertEqual(alive, ["per-thread #1"])  # the main thread's
        self.assertEqual(sum(s["streams"] for s in device["streams"] if not s["alive"]), threads + 1)
        self.assertEqual(device["stats"]["allocation.all.allocated"], threads + 2)

    def test_a_thread_stream_used_after_its_end_is_one_gone_stream(self):
        # A key destructor of the program's runs after gpupool's and uses the
        # stream again: its second end joins its first (140 gone for 70 before).
        threads = 70
        device = self.run_key_destructor_threads("used-after-end", threads)
        self.assertEqual(sum(s["streams"] for s in device["streams"] if not s["alive"]), threads)
        self.assertEqual(device["stats"]["allocation.all.allocated"], 2 * threads + 1)

    def test_threads_calling_while_the_process_exits_neither_crash_it_nor_lose_its_report(self):
        # Data loader and communication threads still allocate when main
        # returns: gpupool's exit handler, its report and threads ending after
        # it all run under their calls. Timing decides where each exit lands,
        # so several runs, each ending at another point. Right at the start,
        # a thread's first call may come as the process exits: gpupool is
        # not loaded then (a dlopen racing glibc's _dl_fini ran ASan's
        # constructor again, which aborted, in 12 of 40 runs of 0-4 ms), and
        # without a call before the exit there is no report. Whether the
        # threads were under way is what the program counted, not the time:
        # under a sanitizer on a busy machine 60 ms was once too short, and
        # 150 ms once under ThreadSanitizer beside a parallel build. So where
        # no run has seen them under way yet, longer runs follow.
        reports_checked = 0
        delays = [0, 0, 0, 1, 2, 5, 20, 60, 150]
        for milliseconds in delays:  # (a list grows under its iterator: the new items come too)
            with self.subTest(milliseconds=milliseconds):
                # (A thread that ends as the process exits is never joined:
                # ThreadSanitizer would call it a leak.)
                run = self.run_program(["test-threads", "busy-at-exit", "3", str(milliseconds)],
                                       env={"TSAN_OPTIONS": "report_thread_leaks=0"})
                try:
                    self.assertSucceeded(run)
                    output = run.output_json()
                    self.assertEqual(output["threads"], 3)
                    self.assertNotIn("CHECK failed", run.stderr)  # a sanitizer's runtime, aborting
                    if output["rounds_done"] > 0:  # the threads were under way
                        report = run.report()  # its books checked, too
                        self.assertEqual(report["reason"], "exit")
                        self.assertGreater(report["devices"]["0"]["stats"]["allocation.all.allocated"], 0)
                        reports_checked += 1
                    else:
                        for path in run.reports():
                            with open(path) as f:
                                check_books(json.load(f))
                finally:
                    for path in run.reports():
                        os.remove(path)
            if reports_checked == 0 and len(delays) < 12 and milliseconds == delays[-1]:
                delays.append(milliseconds * 4)
        self.assertGreater(reports_checked, 0, "in no run were the threads under way before the exit")


class PitchedMemory(ShimTest):
    """cudaMallocPitch and cudaMalloc3D, as image and volume code uses them."""

    def test_2d_and_3d_arrays_are_pooled_and_stay_intact(self):
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-pitched", "4"], env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                did = run.output_json()
                device = run.report()["devices"]["0"]
                stats = device["stats"]
                self.assertEqual(stats["allocation.all.allocated"], did["allocations"])
                self.assertEqual(stats["allocation.all.freed"], did["allocations"])
                self.assertEqual(stats["num_ooms"], 1)  # the 1 PiB array, refused by the pool
                self.assertEqual(did["pitch_of_a_1_byte_row"], 512)
                upstream = run.counters()
                self.assertEqual(upstream["malloc_calls"], device["upstream"]["cuda_malloc_calls"])
                self.assertLess(upstream["malloc_calls"] + upstream["vmm_maps"], did["allocations"] / 3)
                os.remove(run.reports()[0])

    def test_the_pitched_program_passes_without_gpupool_too(self):
        run = self.run_program(["test-pitched", "4"], preload=False)
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["malloc_calls"], run.output_json()["allocations"] + 1)  # and the refused one

    def test_with_gpupool_disabled_the_runtime_serves_them(self):
        run = self.run_program(["test-pitched", "2"], env={"GPUPOOL_DISABLE": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["malloc_calls"], run.output_json()["allocations"] + 1)


class Reuse(ShimTest):
    def test_repeated_workload_makes_few_upstream_calls(self):
        run = self.run_program(["test-repeat", "50"])
        self.assertSucceeded(run)
        did = run.output_json()
        report = run.report()
        stats = report["devices"]["0"]["stats"]
        self.assertEqual(did["allocations"], 500)
        # The first round's memory serves all 50 rounds: a handful of segments
        # or page mappings (each mapping maps pages one cuMemMap at a time).
        maps = report["devices"]["0"]["upstream"]["page_maps"]
        self.assertGreater(stats["num_device_alloc"] + maps, 0)
        self.assertLessEqual(stats["num_device_alloc"] + maps, 10)
        self.assertEqual(stats["num_device_alloc"], run.counters()["malloc_calls"])
        self.assertGreaterEqual(run.counters()["vmm_maps"], maps)
        self.assertEqual(stats["allocation.all.allocated"], did["allocations"])
        self.assertEqual(stats["requested_bytes.all.peak"], did["peak_requested"])
        self.assertEqual(stats["requested_bytes.all.allocated"], did["requested_total"])
        self.assertGreaterEqual(report["devices"]["0"]["cache"]["hit_ratio"], 0.98)

    def test_cached_pairs_ask_the_runtime_for_no_current_device_they_can_do_without(self):
        # On a real runtime every call costs. Where the process sees one
        # device, it is always the current one: a cached pair asks nothing.
        # Where it sees more, a pair's cudaMalloc asks (its memory is the
        # current device's) and so does a device barrier (its event's), but a
        # cudaFree looks for its block where the only device with a pool is.
        # A few calls more set up the pool.
        for devices in ("1", "2"):
            with self.subTest(devices=devices):
                run = self.run_program(["test-repeat", "50"], env={"SIMCUDA_DEVICES": devices})
                self.assertSucceeded(run)
                counters = run.counters()
                asked = run.output_json()["allocations"] + counters["event_records"] if devices == "2" else 0
                self.assertLessEqual(counters["get_device_calls"], asked + 8)

    def test_demo_runs_intact_under_gpupool(self):
        run = self.run_program(["gpupool-demo", "--steps", "4"])
        self.assertSucceeded(run)
        self.assertIn("every buffer read back intact", run.stdout)
        upstream = run.report()["devices"]["0"]["upstream"]
        self.assertLess(upstream["cuda_malloc_calls"] + upstream["page_maps"], 60)


class Fidelity(ShimTest):
    def test_runtime_behaviour_is_kept(self):
        run = self.run_program("test-fidelity", env={"SIMCUDA_MEMORY": "256M"})
        self.assertSucceeded(run)
        self.assertIn("not a live allocation", run.stderr)  # the double free, named
        # cudaFree(NULL) reaches the runtime: programs call it to create the context.
        self.assertEqual(run.counters()["null_free_calls"], 1)

    def test_libraries_need_no_cuda_spdlog_fmt_or_libstdcxx(self):
        # Sanitizer builds link the C++ runtime dynamically, as the sanitizers need.
        forbidden = r"cudart|cuda|spdlog|fmt" if sanitizer_runtime() else r"cudart|cuda|spdlog|fmt|stdc\+\+|gcc_s"
        for library in (LIBRARY, CORE):
            out = subprocess.run(["readelf", "-d", library], capture_output=True, text=True, check=True).stdout
            needed = re.findall(r"\(NEEDED\).*\[(.*)\]", out)
            self.assertTrue(needed, library)
            for lib in needed:
                self.assertNotRegex(lib, forbidden, library)
        # The preload library is plain C: nothing but the C library (and a sanitizer's runtime).
        out = subprocess.run(["readelf", "-d", LIBRARY], capture_output=True, text=True, check=True).stdout
        for lib in re.findall(r"\(NEEDED\).*\[(.*)\]", out):
            self.assertRegex(lib, r"^(libc|libdl|libpthread|ld-linux.*|libasan|libtsan|libubsan|libm)\.so", lib)

    def test_libraries_export_only_the_intercepted_entry_points_and_the_core_table(self):
        def exported(library):
            out = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True,
                                 check=True).stdout
            return sorted(line.split()[-1] for line in out.splitlines() if line.strip())
        shim = os.path.join(os.path.dirname(__file__), "..", "..", "shim")
        with open(os.path.join(shim, "exports.map")) as f:
            listed = sorted(re.findall(r"^\s+(cuda\w+);", f.read(), re.M))
        with open(os.path.join(shim, "entry_points.def")) as f:
            entries = sorted(re.findall(r"^GPUPOOL_ENTRY\((\w+),", f.read(), re.M))
        self.assertEqual(listed, entries)
        # The driver's stream destroy, device reset, frees, IPC handle and
        # capture calls (for programs linked with the driver), and dlsym, the
        # static runtime's way to the driver (x86-64 and AArch64 only).
        captures = ["cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
                    "cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
                    "cuStreamEndCapture", "cuStreamEndCapture_ptsz"]
        hooks = (["cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz",
                  "cuMemFree_v2", "cuStreamDestroy", "cuStreamDestroy_v2", "cuIpcGetMemHandle"] + captures +
                 (["dlsym"] if EXPORTS_DLSYM else []))
        self.assertEqual(exported(LIBRARY), sorted(listed + hooks))
        self.assertEqual(exported(CORE), ["gpupool_core_open"])

    @native_only
    def test_processes_that_never_use_cuda_load_only_the_small_library(self):
        run = self.run_program(["cat", "/proc/self/maps"])
        self.assertSucceeded(run)
        self.assertIn("libgpupool.so", run.stdout)
        self.assertNotIn("libgpupool-core.so", run.stdout)

    def test_without_its_core_the_library_passes_calls_through(self):
        alone = os.path.join(self.workdir, "alone")
        os.mkdir(alone)
        shutil.copy(LIBRARY, alone)
        run = self.run_program(["test-repeat", "5"], library=os.path.join(alone, "libgpupool.so"))
        self.assertSucceeded(run)
        self.assertEqual(run.stderr.count("cannot load"), 1, run.stderr)
        self.assertIn("libgpupool-core.so", run.stderr)
        self.assertEqual(run.reports(), [])
        # Every allocation went to the runtime: 5 rounds of 10 sizes.
        self.assertEqual(run.counters()["malloc_calls"], 50)

    def test_a_child_forked_while_a_thread_loads_the_core_exits_at_once(self):
        # The exit handler waits for a load of the core under way (see
        # test_threads_calling_while_the_process_exits...); in a fork's child
        # the loading thread is gone, and nothing may be waited for.
        slow = os.path.join(self.workdir, "slow")
        os.mkdir(slow)
        shutil.copy(LIBRARY, slow)
        shutil.copy(os.path.join(BUILD, "tests", "libtest-slow-core.so"), os.path.join(slow, "libgpupool-core.so"))
        run = self.run_program(["test-lifecycle", "fork-while-loading"], library=os.path.join(slow, "libgpupool.so"),
                               env={"TSAN_OPTIONS": "atexit_sleep_ms=0"})  # ThreadSanitizer's own second
        self.assertSucceeded(run)
        # Without forgetting the parent's loader: 1091 ms (the wait's limit, 1 s).
        self.assertLess(run.output_json()["child_exit_ms"], 500)

    def test_relative_preload_path_survives_a_change_of_directory(self):
        build = os.path.abspath(BUILD)
        run = self.run_program(["test-lifecycle", "chdir"], library="lib/libgpupool.so", cwd=build)
        self.assertSucceeded(run)
        self.assertNotIn("cannot load", run.stderr)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 1)


class DeviceFault(ShimTest):
    # test-lifecycle fault: a kernel faults (the simulated runtime's sticky
    # error, as after an illegal address) while the program holds a plain and
    # a stream-ordered block; it then frees both, synchronizes and allocates.
    def test_a_faulted_device_neither_crashes_nor_hangs_the_program(self):
        fault = "cudaErrorIllegalAddress"
        alone = self.run_program(["test-lifecycle", "fault"], preload=False)
        self.assertSucceeded(alone)
        self.assertEqual(set(alone.output_json().values()), {fault})  # the runtime fails every call
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-lifecycle", "fault"], env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                calls = run.output_json()
                # The pool serves and takes back blocks without asking the
                # device: the fault shows at the next synchronization, and
                # stays the program's next error.
                self.assertEqual(calls["cudaFree"], "cudaSuccess")
                self.assertEqual(calls["cudaDeviceSynchronize"], fault)
                self.assertEqual(calls["cudaGetLastError"], fault)
                self.assertIn("devices", run.report())
                for path in run.reports():
                    os.remove(path)

    def test_a_segment_free_the_faulted_runtime_refuses_stays_reserved(self):
        # Past the garbage collection threshold, the pool gives its idle 40 MiB
        # segment back before taking more: the runtime refuses that cudaFree
        # (the fault), so the memory is still on the device, and the report
        # says so and still counts it reserved, as the device does.
        env = {"GPUPOOL_EXPANDABLE_SEGMENTS": "0", "GPUPOOL_GARBAGE_COLLECTION_THRESHOLD": "0.5",
               "SIMCUDA_MEMORY": "64M"}
        run = self.run_program(["test-lifecycle", "fault-release"], env=env)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["cudaMalloc"], "cudaErrorIllegalAddress")
        device = run.report()["devices"]["0"]
        self.assertEqual(device["upstream"]["cuda_free_failures"], 1)
        self.assertEqual(device["upstream"]["cuda_free_calls"], 1)
        self.assertEqual(device["stats"]["reserved_bytes.all.current"], run.counters()["bytes_in_use"])
        self.assertEqual(device["stats"]["reserved_bytes.all.current"], 40 << 20)
        self.assertTrue(any("refused 1 of gpupool's cudaFree calls" in a for a in device["advice"]), device["advice"])
        check_books(run.report())

    def test_pages_whose_unmap_the_driver_refuses_stay_reserved(self):
        # With expandable segments (the default) the pool gives pages back
        # with cuMemUnmap, which a driver whose context a fault broke refuses
        # (half of gpupool's here, on purpose). Those pages are still on the
        # device: the pool keeps them mapped, free and counted reserved, and
        # the report counts each refusal, so its books end equal to the
        # device's. Patterns are checked throughout.
        env = {"SIMCUDA_UNMAP_FAIL_RATE": "0.5", "GPUPOOL_MEMORY_LIMIT": "640M"}
        run = self.run_program(["test-patterns", "2000", "3"], env=env)
        self.assertSucceeded(run)
        counters = run.counters()
        device = run.report()["devices"]["0"]
        self.assertGreater(counters["unmap_failures"], 0)
        self.assertEqual(device["upstream"]["page_unmap_failures"], counters["unmap_failures"])
        self.assertGreater(device["upstream"]["page_unmaps"], device["upstream"]["page_unmap_failures"])
        self.assertEqual(device["stats"]["reserved_bytes.all.current"], counters["bytes_in_use"])
        refused = f"refused {counters['unmap_failures']} of gpupool's page unmaps"
        self.assertTrue(any(refused in a for a in device["advice"]), device["advice"])
        check_books(run.report())

    def test_pages_left_mapped_by_a_refused_undo_are_mapped_again_without_a_new_map(self):
        # A 6 MiB request whose third page the full device refuses: the two
        # pages just mapped are unmapped again, which the driver refuses too.
        # Once the program's own 4 MiB are gone, the same request maps one new
        # page beside those two (mapping over them would fail), and the books
        # end equal to the device's.
        env = {"SIMCUDA_UNMAP_FAIL_RATE": "1", "SIMCUDA_MEMORY": "8M"}
        run = self.run_program(["test-lifecycle", "remap"], env=env)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"first": "cudaErrorMemoryAllocation", "again": "cudaSuccess"})
        counters = run.counters()
        self.assertGreater(counters["unmap_failures"], 0)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["reserved_bytes.all.current"], counters["bytes_in_use"])
        check_books(run.report())

    def test_free_synchronizes_returns_the_fault_from_cudafree(self):
        run = self.run_program(["test-lifecycle", "fault"], env={"GPUPOOL_FREE_SYNCHRONIZES": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["cudaFree"], "cudaErrorIllegalAddress")


if __name__ == "__main__":
    main()
