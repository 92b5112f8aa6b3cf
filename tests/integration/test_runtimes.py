"""Which runtime gpupool serves: two runtimes in one process, nvcc's static
runtime through the driver, the shared runtime under another name, and a
runtime only a library reaches."""
import os
import shutil
import sys
import unittest

from harness import BUILD, EXPORTS_DLSYM, LIBRARY, ShimTest, main, native_only, sanitizer_runtime


class TwoRuntimes(ShimTest):
    """test-two-runtimes: the program's runtime (the simulated one, as CUDA
    13's) and a library's (tests/programs/second_runtime.c, as CUDA 12's)."""

    LIBRARY12 = os.path.join(BUILD, "tests", "cuda12", "libtest-cuda12-user.so")
    # cudaError_t: success, out of memory, invalid configuration, invalid device.
    EXPECTED = {"launch12": 9, "peek12": 9, "get12": 9, "get12_again": 0,
                "set_device": 101, "get12_beside_set_device": 0, "get_after_set_device": 101,
                "peer12": 101, "get_after_peer12": 0, "peek12_after_peer12": 101, "get12_after_peer12": 101,
                "oom12": 2, "get_after_oom12": 0, "get12_after_oom12": 2,
                "oom": 2, "get12_after_oom": 0, "peek_after_oom": 2, "get_after_oom": 2,
                "fetch_free12": 0, "driver_free12": 800, "driver_free12_watched": 0,
                "fetch_destroy12": 0, "driver_destroy12_watched": 0, "fetch_refused12": 1,
                "get_after_fetch_refused12": 0, "get12_after_fetch_refused12": 1,
                "pair12": 0, "get12_at_end": 0, "get_at_end": 0}

    def test_each_runtime_s_callers_read_their_own_last_error(self):
        # Without gpupool each runtime answers its own callers: this checks
        # the program and the stand-in runtime.
        alone = self.run_program(["test-two-runtimes", self.LIBRARY12], preload=False)
        self.assertSucceeded(alone)
        self.assertEqual(alone.output_json(), self.EXPECTED)
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                run = self.run_program(["test-two-runtimes", self.LIBRARY12],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                # The library's refused launch is its own caller's error; a
                # failed call it made through gpupool (served, or passed on to
                # the program's runtime) is too, and none of the program's is.
                # Its fetch of a driver function is its own runtime's, at that
                # runtime's version (the program's would give CUDA 13's
                # signatures), and gpupool watches the functions it watches;
                # the error of a fetch that runtime refuses is its callers'.
                self.assertEqual(run.output_json(),
                                 dict(self.EXPECTED, driver_free12_watched=1, driver_destroy12_watched=1))
                # gpupool served both: the program's two blocks and the library's one.
                stats = run.report()["devices"]["0"]["stats"]
                self.assertEqual(stats["allocation.all.allocated"], 3)
                self.assertEqual(stats["num_ooms"], 2)


@unittest.skipUnless(EXPORTS_DLSYM, "the static runtime hook is x86-64 and AArch64 only")
class StaticRuntime(ShimTest):
    """test-static-runtime reaches the driver as nvcc's static runtime does."""

    ON = {"GPUPOOL_STATIC_RUNTIME": "1"}

    def test_its_allocations_are_pooled_when_asked_and_told_when_not(self):
        run = self.run_program(["test-static-runtime", "pairs", "60"], env=self.ON)
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual(stats["allocation.all.allocated"], 60)
        self.assertEqual(stats["allocation.all.freed"], 60)
        counters = run.counters()
        self.assertEqual(counters["malloc_calls"], 0)  # expandable segments: pages mapped instead
        self.assertLess(counters["vmm_maps"], 10)
        self.assertNotIn("pooled nothing", run.stderr)
        reports = len(run.reports())
        off = self.run_program(["test-static-runtime", "pairs", "60"])
        self.assertSucceeded(off)
        self.assertEqual(off.counters()["malloc_calls"], 60)
        self.assertEqual(len(off.reports()), reports)
        self.assertEqual(off.stderr.count("GPUPOOL_STATIC_RUNTIME=1"), 1, off.stderr)

    def test_a_cuda_11_static_runtime_is_pooled_too(self):
        # CUDA 11.3-11.8 static runtimes fetch cuGetProcAddress in its first
        # form (no status argument) and every entry point through it.
        run = self.run_program(["test-static-runtime", "--cuda11", "pairs", "60"], env=self.ON)
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual(stats["allocation.all.allocated"], 60)
        self.assertEqual(run.counters()["malloc_calls"], 0)
        self.assertLess(run.counters()["vmm_maps"], 10)
        for path in run.reports():
            os.remove(path)
        hazard = self.run_program(["test-static-runtime", "--cuda11", "hazard"], env=self.ON)
        self.assertSucceeded(hazard)
        self.assertEqual(hazard.output_json()["reused"], 1)
        off = self.run_program(["test-static-runtime", "--cuda11", "pairs", "60"])
        self.assertSucceeded(off)
        self.assertEqual(off.counters()["malloc_calls"], 60)

    def test_asked_for_but_not_reached_is_told_so(self):
        # A driver loaded without a static runtime asking for cuGetProcAddress.
        driver = os.path.join(BUILD, "tests", "fake-driver", "libcuda.so.1")
        run = self.run_program(["test-lifecycle", "driver", driver, "none"], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.stderr.count("static_runtime:1 found no static runtime"), 1, run.stderr)
        self.assertNotIn("set GPUPOOL_STATIC_RUNTIME=1", run.stderr)

    def test_threads_that_open_the_driver_at_once_are_all_pooled(self):
        run = self.run_program(["test-static-runtime", "threads", "4", "40"], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 160)
        self.assertEqual(run.counters()["malloc_calls"], 0)

    def test_a_librarys_own_runtime_is_taken_over_only_when_named(self):
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        alone = self.run_program(["test-static-runtime", "library", module, "40"], env=self.ON)
        self.assertSucceeded(alone)
        self.assertEqual(alone.counters()["malloc_calls"], 40)
        self.assertIn("static_runtime_libraries names it", alone.stderr)
        named = {**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libother.so:libtest-driver-lookup.so"}
        run = self.run_program(["test-static-runtime", "library", module, "40"], env=named)
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["malloc_calls"], 0)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 40)
        lookups = self.run_program(["test-static-runtime", "lookups", module], env=named)
        self.assertEqual(lookups.output_json()["library"], "libgpupool.so")
        # Named or not, the shared runtime and NCCL are never taken over.
        nccl = os.path.join(self.workdir, "libnccl.so.2")
        shutil.copy(module, nccl)
        refused = self.run_program(["test-static-runtime", "library", nccl, "40"],
                                   env={**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libnccl.so"})
        self.assertSucceeded(refused)
        self.assertEqual(refused.counters()["malloc_calls"], 40)
        self.assertEqual(refused.stderr.count("is never taken over"), 1, refused.stderr)

    def test_pitched_allocations_are_pooled(self):
        run = self.run_program(["test-static-runtime", "pitched", "30"], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 30)
        self.assertEqual(run.counters()["malloc_calls"], 0)
        off = self.run_program(["test-static-runtime", "pitched", "30"])
        self.assertSucceeded(off)
        self.assertEqual(off.counters()["malloc_calls"], 30)

    def test_a_library_fetching_driver_calls_by_name_is_taken_over_only_when_named(self):
        # As XLA's CUDA stubs fetch them: dlsym(driver, "cuMemAlloc_v2"), ...
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        args = ["test-static-runtime", "library-by-name", module, "20"]
        advice = "GPUPOOL_STATIC_RUNTIME=1 GPUPOOL_STATIC_RUNTIME_LIBRARIES=libtest-driver-lookup.so to pool it"
        for env in (self.ON, {}):
            alone = self.run_program(args, env=env)
            self.assertSucceeded(alone)
            self.assertEqual(alone.counters()["malloc_async_calls"], 44)
            self.assertEqual(alone.stderr.count(advice), 1, alone.stderr)  # the library named at exit
        run = self.run_program(args, env={**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libtest-driver-lookup.so"})
        self.assertSucceeded(run)
        counters = run.counters()
        # Only the blocks of the library's own pools are the runtime's (one made
        # current with cuDeviceSetMemPool, one with cuMemSetMemPool).
        self.assertEqual(counters["malloc_calls"], 2)
        self.assertEqual(counters["malloc_async_calls"], 2)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["stats"]["allocation.all.allocated"], 82)
        # The library's stream, made with cuStreamCreate, is one the pool orders on.
        streams = [s for s in device["streams"] if s["stream"].startswith("0x")]
        self.assertEqual(len(streams), 1)
        # Most of its requests are served from the cache, from its own frees or
        # (ordered) from the per-thread stream's: how many of each depends on timing.
        self.assertGreaterEqual(streams[0]["same_stream_reuses"] + streams[0]["cross_stream_reuses"], 10)
        self.assertFalse(streams[0]["alive"])  # destroyed with cuStreamDestroy_v2

    def test_a_library_taking_memory_from_the_driver_is_named_though_the_rest_was_pooled(self):
        # The program's own cudaMalloc is pooled; the library's memory is not,
        # and the report cannot show it: a line at exit says so.
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        advice = "GPUPOOL_STATIC_RUNTIME_LIBRARIES=libtest-driver-lookup.so to pool it"
        run = self.run_program(["test-lifecycle", "library", module])
        self.assertSucceeded(run)
        self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 1)
        self.assertEqual(run.stderr.count(advice), 1, run.stderr)
        self.assertIn("not all of this program's device memory reached gpupool", run.stderr)
        os.remove(run.reports()[0])
        named = self.run_program(["test-lifecycle", "library", module],
                                 env={**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libtest-driver-lookup.so"})
        self.assertSucceeded(named)
        self.assertEqual(named.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 23)
        self.assertNotIn(advice, named.stderr)

    def test_a_default_pool_opened_by_a_library_fetching_by_name_opens_gpupools_memory(self):
        # As XLA's async allocator opens each device's default pool to its
        # peers: cuMemPoolSetAccess fetched with dlsym, between two blocks
        # from the pool named. Expandable pages open, the earlier block's
        # too; with fixed segments the later block is the runtime's.
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        for expandable, before, to_runtime in (("1", 1, 0), ("0", 0, 1)):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                env = {**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libtest-driver-lookup.so",
                       "SIMCUDA_DEVICES": "2", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                run = self.run_program(["test-static-runtime", "library-pool-access", module], env=env)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), {"before": before, "after": 1})
                self.assertEqual(run.counters()["malloc_async_calls"], to_runtime)
                self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 2 - to_runtime)

    def test_peer_access_given_and_taken_away_by_a_library_fetching_by_name_opens_and_closes_pooled_pages(self):
        # cuCtxEnablePeerAccess and cuCtxDisablePeerAccess fetched with dlsym:
        # gpupool's pages of device 1 (expandable segments) open to device 0
        # with the access and close after. With fixed segments its memory is
        # the driver's, which follows peer access itself.
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                env = {**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libtest-driver-lookup.so",
                       "SIMCUDA_DEVICES": "2", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                run = self.run_program(["test-static-runtime", "library-peer", module], env=env)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), {"with_access": 1, "taken_away": 0})
                self.assertEqual(run.report()["devices"]["1"]["stats"]["allocation.all.allocated"], 1)
                self.assertEqual(run.counters()["vmm_maps"] > 0, expandable == "1")

    def test_a_reset_fetched_by_name_leaves_nothing_from_before_it(self):
        # Both versions of cuDevicePrimaryCtxReset: a block cached before the
        # reset must not be handed out after it (the simulated reset frees it).
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        named = {**self.ON, "GPUPOOL_STATIC_RUNTIME_LIBRARIES": "libtest-driver-lookup.so"}
        for name in ("cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset"):
            with self.subTest(reset=name):
                run = self.run_program(["test-static-runtime", "library-reset", module, name], env=named)
                self.assertSucceeded(run)
                self.assertEqual(run.report()["devices"]["0"]["device_resets"]["count"], 1)
                for path in run.reports():
                    os.remove(path)

    def test_its_memory_pool_trim_gives_back_gpupools_idle_memory(self):
        held = {}
        for keep in (None, "0"):
            run = self.run_program(["test-static-runtime", "trim"] + ([keep] if keep else []), env=self.ON)
            self.assertSucceeded(run)
            held[keep] = run.counters()["bytes_in_use"]
            self.assertEqual(run.report()["devices"]["0"]["stats"]["reserved_bytes.all.current"], held[keep])
            for path in run.reports():
                os.remove(path)
        self.assertGreaterEqual(held[None], 64 << 20)
        self.assertLessEqual(held["0"], 2 << 20)

    def test_its_memory_pool_figures_include_gpupools(self):
        # The program reads its default pool's figures with the driver's
        # cuMemPoolGetAttribute, as the static runtime's cudaMemPoolGetAttribute does,
        # and the device's free memory with cuMemGetInfo, where what gpupool
        # keeps for reuse counts as free (mem_get_info's default).
        for keep in (None, "0"):
            run = self.run_program(["test-static-runtime", "trim"] + ([keep] if keep else []), env=self.ON)
            self.assertSucceeded(run)
            figures = run.output_json()
            self.assertGreaterEqual(figures["used_held"], 64 << 20)  # the 8 blocks of 8 MiB
            self.assertLessEqual(figures["free_held"], figures["free_before"] - (64 << 20))
            self.assertEqual(figures["free_after"], figures["free_before"])
            self.assertEqual(figures["used_high_reset"], 0)  # reset once all were freed
            if keep is None:
                self.assertGreaterEqual(figures["reserved"], 64 << 20)  # kept for reuse
            else:
                self.assertEqual(figures["reserved"], 0)
            for path in run.reports():
                os.remove(path)

    def test_a_pool_of_its_own_made_current_serves_its_stream_ordered_calls(self):
        # The static runtime's cudaDeviceSetMemPool reaches the driver's
        # cuDeviceSetMemPool; CUDA 13's cudaMemSetMemPool its cuMemSetMemPool.
        for how in ([], ["by-location"]):
            with self.subTest(how=how):
                self.remove_reports()
                run = self.run_program(["test-static-runtime", "own-pool"] + how, env=self.ON)
                self.assertSucceeded(run)
                self.assertGreaterEqual(run.output_json()["own_pool_used"], 16 << 20)
                self.assertEqual(run.counters()["malloc_async_calls"], 5)  # the program's pool's blocks
                self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 3)

    def test_its_default_pool_opened_to_another_device_opens_gpupools_memory(self):
        # The static runtime's cudaMemPoolSetAccess reaches the driver's
        # cuMemPoolSetAccess: expandable pages open, those of the block made
        # before it too; with fixed segments the block after it is the runtime's.
        for expandable, before, to_runtime in (("1", 1, 0), ("0", 0, 1)):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                env = {**self.ON, "SIMCUDA_DEVICES": "2", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                run = self.run_program(["test-static-runtime", "pool-access"], env=env)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), {"hidden_before": 1, "before": before, "after": 1})
                self.assertEqual(run.counters()["malloc_async_calls"], to_runtime)

    def test_stream_ordered_and_per_thread_stream_calls_are_pooled(self):
        run = self.run_program(["test-static-runtime", "async", "20"], env=self.ON)
        self.assertSucceeded(run)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["stats"]["allocation.all.allocated"], 41)
        # One reached the runtime: the request on the destroyed stream.
        self.assertEqual(run.counters()["malloc_async_calls"], 1)
        # The last free was the per-thread default stream's: its block waits
        # there, not on the legacy stream.
        cached = {s["stream"]: s["cached_blocks"] for s in device["streams"]}
        self.assertGreater(cached["per-thread #1"], 0, cached)
        self.assertEqual(cached["legacy"], 0, cached)

    def test_a_block_freed_under_slower_work_is_reused_only_after_it(self):
        # Its slower stream made with cuStreamCreate, then with a priority.
        for env in (self.ON, {**self.ON, "STATIC_RUNTIME_PRIORITY": "-1"}):
            with self.subTest(env=env):
                run = self.run_program(["test-static-runtime", "hazard"], env=env)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json()["reused"], 1)  # the same block: the ordering was needed
                self.assert_breaks_without_ordering(["test-static-runtime", "hazard"], env)

    def test_with_events_refused_the_pool_waits_for_the_device_through_the_driver(self):
        # No event can be made: a block freed under a slower write is not
        # known done, and with room for one 12 MiB block the second request
        # makes gpupool wait for the whole device (the static runtime's
        # cudaDeviceSynchronize is cuCtxSynchronize) before it gives memory back.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                env = {**self.ON, "SIMCUDA_EVENT_FAIL_RATE": "1", "GPUPOOL_MEMORY_LIMIT": "20M",
                       "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                run = self.run_program(["test-static-runtime", "hazard", "100", "12"], env=env)
                self.assertSucceeded(run)
                counters = run.counters()
                self.assertGreater(counters["event_failures"], 0)
                self.assertGreaterEqual(counters["device_syncs"], 2)  # the program's own, and gpupool's

    def assert_breaks_without_ordering(self, args, env):
        # The control: without ordering the late write races the reuse. It
        # comes 400 ms late here (100 by default): on a loaded machine the
        # reuse and its copy could otherwise come after it, and the data then
        # look right (the destroyed-stream control did so in 1 full ctest -j2
        # run, and in 1 of 12 runs alone just after it). Under ThreadSanitizer the
        # simulated device's 16 MiB copies are slower still: the control is
        # left to the other builds there.
        if "tsan" in (sanitizer_runtime() or ""):
            return
        unsafe = self.run_program(args + ["400"], env={**env, "GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING": "1"})
        self.assertEqual(unsafe.code, 1)
        self.assertIn("overwritten by work queued before its free", unsafe.stderr)

    def test_a_block_freed_on_a_destroyed_stream_waits_for_its_work(self):
        pressure = {**self.ON, "GPUPOOL_MEMORY_LIMIT": "20M"}  # room for one 16 MiB block: it is reused
        run = self.run_program(["test-static-runtime", "destroyed"], env=pressure)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["reused"], 1)
        self.assert_breaks_without_ordering(["test-static-runtime", "destroyed"], pressure)

    def test_another_devices_block_is_reused_in_its_order_while_this_device_is_current(self):
        # Device 1's block, freed on one of its streams under a slower write,
        # asked for on another of its streams while device 0's context is
        # current: gpupool makes device 1 current for its own calls (the
        # primary context, as the static runtime does) and back again.
        pressure = {**self.ON, "GPUPOOL_MEMORY_LIMIT": "20M", "SIMCUDA_DEVICES": "2"}
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                env = {**pressure, "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                run = self.run_program(["test-static-runtime", "cross-device"], env=env)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json()["reused"], 1)
                self.assertEqual(run.counters()["stale_event_uses"], 0)
                self.assert_breaks_without_ordering(["test-static-runtime", "cross-device"], env)
                for path in run.reports():
                    os.remove(path)

    def test_a_stream_made_past_gpupool_is_served_by_its_own_devices_pool(self):
        # Device 1's stream, made by the driver's cuStreamCreate found past
        # gpupool (as a library that resolves the driver privately finds it),
        # named in cuMemAllocAsync while device 0's context is current: the
        # driver would give it device 1's memory, and so does gpupool, which
        # asks the stream's context (cuStreamGetCtx). Taken for the current
        # device's, all five blocks came from device 0's pool.
        run = self.run_program(["test-static-runtime", "unseen-stream"], env={**self.ON, "SIMCUDA_DEVICES": "2"})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["pairs"], 5)
        devices = run.report()["devices"]
        self.assertEqual(sorted(devices), ["1"])
        self.assertEqual(devices["1"]["stats"]["allocation.all.allocated"], 5)
        self.assertEqual(devices["1"]["stats"]["allocation.all.current"], 0)

    def test_calls_during_a_capture_leave_it_valid(self):
        for mode in ("capture", "capture-to-graph", "capture-per-thread", "capture-to-graph-per-thread"):
            with self.subTest(mode=mode):
                run = self.run_program(["test-static-runtime", mode], env=self.ON)
                self.assertSucceeded(run)
                counters = run.counters()
                self.assertEqual(counters["captures_begun"], 1)
                self.assertEqual(counters["captures_invalidated"], 0)
                # The captured allocations (cuMemAllocAsync, cuMemAllocFromPoolAsync
                # from the default pool) are the graph's.
                self.assertEqual(counters["malloc_async_calls"], 2)

    def test_an_ipc_handle_that_would_name_other_memory_is_refused(self):
        run = self.run_program(["test-static-runtime", "ipc"], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["ipc_result"], 1)  # CUDA_ERROR_INVALID_VALUE
        self.assertIn("GPUPOOL_DISABLE=1", run.stderr)

    def test_nothing_from_before_a_device_reset_is_used_after_it(self):
        # Each block is checked: one in memory the reset freed fails the program.
        run = self.run_program(["test-static-runtime", "reset"], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["stale_event_uses"], 0)
        self.assertGreaterEqual(run.counters()["vmm_maps"], 3)  # pages mapped afresh after each reset

    def test_a_block_freed_inside_a_capture_of_a_device_comes_back_after_its_reset(self):
        # Through cuDevicePrimaryCtxReset, the static runtime's reset. Room for
        # one block: the request after the reset needs the freed block's memory.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-static-runtime", "foreign-capture-reset"],
                                       env={**self.ON, "SIMCUDA_DEVICES": "2", "GPUPOOL_MEMORY_LIMIT": "20M",
                                            "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), {"reused": 1})
                self.assertEqual(run.counters()["captures_invalidated"], 0)

    def test_peer_access_reaches_pooled_pages_until_it_is_disabled(self):
        run = self.run_program(["test-static-runtime", "peer"], env={**self.ON, "SIMCUDA_DEVICES": "2"})
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"hidden_before": 1, "before": 1, "after": 1, "open_after_disable": 0})
        self.assertGreater(run.counters()["vmm_maps"], 0)  # expandable segments, with two devices too

    def test_a_cuGetProcAddress_lookup_is_gpupools_but_nccls_and_rtld_next_keep_theirs(self):
        # The program's cuGetProcAddress is gpupool's, and a library's too:
        # one that only watches (what it takes over is the program's alone:
        # test_a_librarys_own_runtime_is_taken_over_only_when_named). NCCL's
        # is the driver's.
        module = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        run = self.run_program(["test-static-runtime", "lookups", module], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"program": "libgpupool.so", "library": "libgpupool.so",
                                             "next": "libgpupool.so", "plain": "libcuda.so.1"})
        nccl = os.path.join(self.workdir, "libnccl.so.2")
        shutil.copy(module, nccl)
        run = self.run_program(["test-static-runtime", "lookups", nccl], env=self.ON)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json()["library"], "libcuda.so.1")
        alone = self.run_program(["test-static-runtime", "lookups", module], preload=False)
        self.assertSucceeded(alone)
        self.assertEqual(alone.output_json(), {"program": "libcuda.so.1", "library": "libcuda.so.1",
                                               "next": "none", "plain": "libcuda.so.1"})


class RuntimeUnderAnotherName(ShimTest):
    # The runtime loaded from a file not named libcudart.so*: a wheel's repair
    # tool renames the copy it bundles (libcudart-1a2b3c4d.so.11.0), and any
    # other name must work too. Preloaded after gpupool, it answers the
    # program's need of libcudart.so.13 by its soname. gpupool then finds the
    # runtime's functions past itself (dlsym with RTLD_NEXT), which it once
    # asked from the wrong object and found nothing: every call crashed.
    def test_a_renamed_runtime_is_found_and_pooled(self):
        for name in ("libsimrt.so", "libcudart-1a2b3c4d.so.13"):
            with self.subTest(name=name):
                renamed = os.path.join(self.workdir, name)
                shutil.copy(os.path.join(BUILD, "sim", "libcudart.so.13"), renamed)
                run = self.run_program(["test-patterns", "500", "3"], library=LIBRARY + ":" + renamed)
                self.assertSucceeded(run)
                stats = run.report()["devices"]["0"]["stats"]
                self.assertEqual(stats["allocation.all.allocated"], run.output_json()["allocations"])
                os.remove(run.reports()[0])


@unittest.skipUnless(EXPORTS_DLSYM, "gpupool's dlsym is x86-64 and AArch64 only")
class RuntimeCallsFetchedByName(ShimTest):
    # A program that opens the runtime itself and fetches its calls with
    # dlsym(handle, name), as Python's ctypes and the cudart stubs of XLA and
    # TensorFlow do, reached the runtime past gpupool: nothing pooled, and no
    # report.
    FETCHED = ["cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaStreamCreate",
               "cudaStreamDestroy", "cudaGetLastError", "cudaStreamSynchronize"]

    def run_by_name(self, preload=True):
        run = self.run_program(["test-runtime-by-name", "libcudart.so.13",
                                os.path.join(BUILD, "tests", "libtest-runtime-next.so"),
                                os.path.join(BUILD, "tests", "cuda12", "libcudart.so.12")], preload=preload)
        self.assertSucceeded(run)
        return run

    def test_the_intercepted_calls_fetched_from_the_runtime_are_gpupools(self):
        alone = self.run_by_name(preload=False)
        self.assertEqual(alone.output_json()["from_runtime"], self.FETCHED)
        blocks = alone.output_json()["blocks"]
        self.assertEqual(alone.counters()["malloc_calls"], blocks)
        run = self.run_by_name()
        out = run.output_json()
        # The calls gpupool intercepts are its own; the others the runtime's.
        self.assertEqual(out["from_runtime"], ["cudaStreamSynchronize"])
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual((stats["allocation.all.allocated"], stats["allocation.all.freed"]), (blocks, blocks))
        self.assertEqual(run.counters()["malloc_calls"], 0)  # pages mapped for the pool instead
        self.assertGreater(run.counters()["vmm_maps"], 0)

    def test_rtld_next_and_another_librarys_function_keep_their_meaning(self):
        # An interposer's dlsym(RTLD_NEXT, ...) past itself finds the
        # runtime's own; a second runtime's function is its own (gpupool
        # passes calls on to the first only).
        for preload in (False, True):
            with self.subTest(preload=preload):
                out = self.run_by_name(preload=preload).output_json()
                self.assertEqual((out["next_from_runtime"], out["other_own"]), (1, 1))

    def test_a_probe_of_the_global_scope_finds_what_it_finds_without_gpupool(self):
        # gpupool's exports come first in the global scope. A probe for one
        # (dlsym(RTLD_DEFAULT, ...)) found it with no runtime loaded, or where
        # the runtime is older than the call (cudaMemSetMemPool is CUDA 13's),
        # and the driver's stream destroys with no driver there. Last: the
        # simulated runtime opened after the CUDA 12 stand-in, which gpupool
        # passes calls on to by then; what only the later one has is its own.
        cuda12 = os.path.join(BUILD, "tests", "cuda12", "libcudart.so.12")
        for runtimes in (["none"], ["libcudart.so.13"], [cuda12], [cuda12, "libcudart.so.13"]):
            with self.subTest(runtimes=runtimes):
                alone = self.run_program(["test-global-lookups", *runtimes], preload=False)
                self.assertSucceeded(alone)
                run = self.run_program(["test-global-lookups", *runtimes])
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), alone.output_json())
                self.assertEqual(run.output_json()["unexplained"], [])  # dlerror() says why
                if runtimes == ["none"]:
                    self.assertEqual(run.output_json()["found"], [])
                else:
                    self.assertIn("cudaMalloc", run.output_json()["found"])
        self.assertIn("cudaMemSetMemPool", run.output_json()["found"])

    def test_a_library_built_as_the_cudart_stubs_are_is_pooled_and_reads_its_errors(self):
        # TensorFlow's and XLA's cudart stubs define the runtime's calls
        # themselves, each forwarding to what they fetched by name: gpupool's
        # now. Such a library counts as a runtime of its own, and reading its
        # last error called its cudaGetLastError, which came back to gpupool's
        # again, without end (SIGSEGV).
        stub = os.path.join(BUILD, "tests", "libtest-cudart-stub.so")
        for preload in (False, True):
            with self.subTest(preload=preload):
                self.remove_reports()
                run = self.run_program(["test-hidden-runtime", stub], preload=preload)
                self.assertSucceeded(run)
                self.assertEqual(run.output_json(), {"step": 0, "error": 0})
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual((stats["allocation.all.allocated"], stats["allocation.all.freed"]), (1, 1))
        self.assertEqual(stats["num_ooms"], 1)

    @unittest.skipIf(sanitizer_runtime(), "Python itself is not built with the sanitizer")
    @native_only
    def test_python_ctypes_calls_are_pooled(self):
        script = ("import ctypes\n"
                  "rt = ctypes.CDLL('libcudart.so.13')\n"
                  "for size in [1 << 20, 4096, 3 << 20] * 20:\n"
                  "    p = ctypes.c_void_p()\n"
                  "    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0\n"
                  "    ctypes.memset(p, 7, size)\n"
                  "    assert rt.cudaFree(p) == 0\n")
        run = self.run_program([sys.executable, "-c", script])
        self.assertSucceeded(run)
        stats = run.report()["devices"]["0"]["stats"]
        self.assertEqual((stats["allocation.all.allocated"], stats["allocation.all.freed"]), (60, 60))
        self.assertEqual(run.counters()["malloc_calls"], 0)


class RuntimeOnlyALibraryReaches(ShimTest):
    # test-hidden-runtime links no runtime and loads a library RTLD_LOCAL (as
    # Python loads an extension module) whose runtime is a renamed copy of
    # the simulated one: only that library's own scope reaches it. Its calls
    # come to gpupool's entry points, which once found no runtime at all
    # under libsimrt-1a2b.so: every call jumped through a null table
    # (SIGSEGV). Under a wheel's name (libcudart-1a2b3c4d.so) gpupool finds it
    # by name, under any other as the library that defines the calls.
    NOT_SUPPORTED = 801  # cudaErrorNotSupported

    def run_hidden(self, *extra, preload=True, runtime="simrt-1a2b"):
        shutil.copy(os.path.join(BUILD, "sim", "libcudart.so.13"), os.path.join(self.workdir, f"lib{runtime}.so"))
        env = {"LD_LIBRARY_PATH": self.workdir + ":" + os.path.join(BUILD, "sim")}
        user = os.path.join(BUILD, "tests", f"libtest-hidden-{runtime}-user.so")
        run = self.run_program(["test-hidden-runtime", user, *extra], env=env, preload=preload)
        self.assertSucceeded(run)
        return run

    def test_the_librarys_runtime_is_found_and_its_calls_pooled(self):
        for runtime in ("simrt-1a2b", "cudart-1a2b3c4d"):
            with self.subTest(runtime=runtime):
                self.remove_reports()
                self.assertEqual(self.run_hidden(preload=False, runtime=runtime).output_json(),
                                 {"step": 0, "error": 0})
                run = self.run_hidden(runtime=runtime)
                self.assertEqual(run.output_json(), {"step": 0, "error": 0})
                report = run.report()
                self.assertNotIn("stepped_aside", report)
                stats = report["devices"]["0"]["stats"]
                # 8 cudaMalloc and 8 cudaMallocAsync, each freed.
                self.assertEqual(stats["allocation.all.allocated"], 16)
                self.assertEqual(stats["allocation.all.freed"], 16)

    def test_a_probe_before_any_runtime_is_loaded_finds_nothing_and_later_calls_are_pooled(self):
        # dlsym(RTLD_DEFAULT, "cudaMalloc") finds gpupool's export first. With
        # no runtime loaded it answered with it, and the calls made through it
        # were refused and stepped gpupool aside for good (the next test); it
        # now answers as the global scope does without gpupool: nothing.
        self.assertEqual(self.run_hidden("probe", preload=False).output_json()["probe"], [])
        run = self.run_hidden("probe")
        output = run.output_json()
        self.assertEqual(output["probe"], [])
        self.assertEqual(output["step"], 0)
        report = run.report()
        self.assertNotIn("stepped_aside", report)
        self.assertEqual(report["devices"]["0"]["stats"]["allocation.all.allocated"], 16)

    def test_calls_made_before_any_runtime_is_loaded_are_refused_and_the_runtime_serves_later_ones(self):
        # dlsym(RTLD_NEXT, ...) from the program keeps its meaning: gpupool's
        # exports, past the program, whether or not a runtime is loaded.
        run = self.run_hidden("probe-next")
        output = run.output_json()
        self.assertEqual(output["probe"], [self.NOT_SUPPORTED] * 5)
        self.assertEqual(output["step"], 0)
        report = run.report()
        self.assertEqual(report["stepped_aside"]["call"], "cudaMalloc")
        self.assertIn("no CUDA runtime found", report["stepped_aside"]["reason"])
        self.assertIn("no CUDA runtime found", run.stderr)
        # Once stepped aside, the runtime serves: nothing is pooled.
        self.assertEqual(report["devices"], {})


if __name__ == "__main__":
    main()
