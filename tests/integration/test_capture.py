"""Stream capture under gpupool: allocations inside a capture pass through
and leave it valid; captures refused, never ended or ended on another
thread; other streams and devices during a capture; and the simulated
runtime's own capture rules."""
import os

from harness import BUILD, DRIVER_WAYS, ShimTest, main


class Capture(ShimTest):
    def test_allocations_inside_a_capture_pass_through_and_it_stays_valid(self):
        # Begun with cudaStreamBeginCapture or into a graph, through the
        # legacy entry points and the per-thread default stream's; with the
        # per-thread caches on, which must not keep the block freed inside;
        # and on the per-thread default stream itself.
        runs = [(program, how) for program in ("test-capture", "test-capture-ptds")
                for how in ([], ["to-graph"], ["threads"])] + [("test-capture-ptds", ["default-stream"])]
        for program, how in runs:
            with self.subTest(program=program, how=how):
                self.remove_reports()
                run = self.run_program([program] + how)
                self.assertSucceeded(run)
                device = run.report()["devices"]["0"]
                self.assertEqual(run.counters()["captures_invalidated"], 0)
                self.assertEqual(device["quarantined_bytes"], 1 << 20)  # freed inside the capture

    def test_a_capture_begun_through_the_driver_is_kept_as_the_runtimes(self):
        # The driver's cuStreamBeginCapture (its first version too, and into a
        # graph) and cuStreamEndCapture, their per-thread versions in
        # test-capture-ptds, however the program reaches them (through the
        # runtime's cudaGetDriverEntryPoint too). Unseen, the pool
        # served the capture's requests from its cache and lent the captured
        # block again after the capture, which the graph writes at each launch.
        ways = DRIVER_WAYS
        lookup = os.path.join(BUILD, "tests", "libtest-driver-lookup.so")
        programs = ("test-capture", "test-capture-ptds")
        runs = [(program, how, variant) for program in programs for how in ways for variant in ([], ["to-graph"])]
        runs += [("test-capture-ptds", how, ["default-stream"]) for how in ways]
        # (cuda.h links the second version; the runtime's call without a
        # version fetches at the runtime's own, which has only the second.)
        runs += [(program, how, ["v1"]) for program in programs for how in ways
                 if how not in ("driver-linked", "runtime-entry-point")]
        # Begun with the process's first CUDA call, before gpupool started.
        runs += [("test-capture-ptds", how, ["first"]) for how in ways]
        for program, how, variant in runs:
            with self.subTest(program=program, how=how, variant=variant):
                self.remove_reports()
                run = self.run_program([program, "driver", how, lookup] + variant)
                self.assertSucceeded(run)
                self.assertIn("capture: valid, allocations inside went to the runtime", run.stdout)
                counters = run.counters()
                self.assertEqual((counters["captures_begun"], counters["captures_invalidated"]), (1, 0))
                if variant != ["first"]:  # a pooled block freed inside the capture
                    self.assertEqual(run.report()["devices"]["0"]["quarantined_bytes"], 1 << 20)

    def test_a_capture_of_a_stream_the_pool_meets_inside_it_stays_valid(self):
        # A new thread's per-thread default stream, captured before any call of
        # gpupool's names it: the pool must count the capture, not meet the
        # stream afresh at its first allocation and forget it (it then served
        # the captured request and fenced the legacy stream, which broke the
        # capture).
        run = self.run_program(["test-capture-ptds", "new-thread"])
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["captures_invalidated"], 0)

    def test_a_capture_the_runtime_refused_to_begin_leaves_nothing_behind(self):
        # Refused on the legacy stream and on a stream already capturing: the
        # pool, told before the runtime answered, must take both back.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                run = self.run_program(["test-capture", "refused"], env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["captures_begun"], 1)
                self.assertEqual(run.report()["devices"]["0"]["quarantined_bytes"], 0)

    def test_a_capture_never_ended_leaves_the_books_when_its_stream_goes(self):
        # A capture whose stream is destroyed, whose thread ends or whose
        # device is reset can no longer be ended; the runtime ends it. Kept in
        # gpupool's books, it would forbid the pool cudaFree for good: a
        # request only the cache can serve would fail. So would a thread-local
        # capture whose stream or device goes on another thread, in the count
        # of the thread that began it. A destroy the runtime refuses leaves
        # the stream capturing, and the pool treating it so.
        # A reset that returns an earlier launch's error (reset-late) has
        # ended the capture all the same; one the runtime refuses
        # (reset-refused) has not. After a reset on another thread
        # (reset-elsewhere) the runtime keeps refusing the beginning thread's
        # host waits unless relaxed (the test below), which the pool needs
        # before it unmaps pages.
        for how in ("stream", "thread", "reset", "reset-late", "reset-refused", "stream-elsewhere", "reset-elsewhere",
                    "refused"):
            for expandable in ("1", "0"):
                with self.subTest(how=how, expandable_segments=expandable):
                    self.remove_reports()
                    run = self.run_program(["test-capture", "gone", how.removesuffix("-late")],
                                           env={"SIMCUDA_MEMORY": "64M", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable,
                                                "SIMCUDA_REFUSE_CAPTURING_DESTROY": "1" if how == "refused" else "0",
                                                "SIMCUDA_RESET_ERROR": how.removeprefix("reset-")
                                                if how in ("reset-late", "reset-refused") else ""})
                    self.assertSucceeded(run)
                    self.assertEqual(run.output_json(), {"after": "cudaSuccess"})
                    self.assertEqual(run.counters()["captures_invalidated"], 0)
                    self.assertEqual(run.report()["devices"]["0"]["ooms"], [])

    def test_a_stream_whose_destroy_is_refused_keeps_its_kind_and_counters(self):
        # test-capture refused-destroy: the runtime refuses to destroy a
        # capturing blocking stream, which lives on. It stays one stream in
        # the report, alive, with the reuse it made before; and blocking, so
        # the device barriers after it (the plain pairs under a 24 MiB
        # device) make it wait for none. Taken for a new non-blocking stream,
        # it would wait at each.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                run = self.run_program(["test-capture", "refused-destroy"],
                                       env={"SIMCUDA_MEMORY": "24M", "SIMCUDA_REFUSE_CAPTURING_DESTROY": "1",
                                            "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["captures_invalidated"], 0)
                rows = run.report()["devices"]["0"]["streams"]
                barriers = next(r for r in rows if r["stream"] == "cudaMalloc/cudaFree")["fences_recorded"]
                self.assertGreater(barriers, 0, rows)  # the case is there
                mine = [r for r in rows if r["stream"] == run.output_json()["stream"]]
                self.assertEqual(len(mine), 1, rows)
                self.assertTrue(mine[0]["alive"])
                self.assertGreaterEqual(mine[0]["same_stream_reuses"], 1)
                self.assertEqual(mine[0]["barrier_waits"], 0)

    def test_a_capture_end_refused_on_another_thread_ends_the_books_as_the_runtime_does(self):
        # CUDA refuses to end a non-relaxed capture on another thread than
        # the one that began it. CUDA 13 ends the capture all the same
        # (scripts/gpu-check.sh asks it): kept in the books, the capture would
        # forbid the pool cudaFree for good. A runtime that lets the capture
        # go on (SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE=1) keeps it there:
        # counted as ended, the pool would serve its stream's requests itself
        # and give the beginning thread's cache back with cudaFree, which
        # would invalidate the capture.
        expected = {"0": {"end elsewhere": "cudaErrorStreamCaptureWrongThread", "status after": "none",
                          "during": "cudaSuccess", "after": "cudaSuccess"},
                    "1": {"end elsewhere": "cudaErrorStreamCaptureWrongThread", "status after": "active",
                          "during": "cudaErrorMemoryAllocation", "after": "cudaSuccess"}}
        for keeps, output in expected.items():
            for expandable in ("1", "0"):
                with self.subTest(keeps_capture=keeps, expandable_segments=expandable):
                    run = self.run_program(["test-capture", "wrong-thread-end"],
                                           env={"SIMCUDA_MEMORY": "64M", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable,
                                                "SIMCUDA_WRONG_THREAD_END_KEEPS_CAPTURE": keeps})
                    self.assertSucceeded(run)
                    self.assertEqual(run.counters()["captures_invalidated"], 0)
                    self.assertEqual(run.output_json(), output)

    def test_the_simulated_runtime_ends_a_capture_whose_end_it_refuses_on_another_thread(self):
        # CUDA 13's answer, as scripts/gpu-check.sh checks it on CUDA.
        run = self.run_program(["test-capture-rules", "wrong-thread-rules"], preload=False)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {"end elsewhere": "cudaErrorStreamCaptureWrongThread",
                                             "status after": "none", "end": "cudaErrorIllegalState"})

    def test_the_simulated_runtime_keeps_a_thread_local_capture_reset_elsewhere_counted_on_its_thread(self):
        # CUDA 13's answers, as scripts/gpu-check.sh checks them on CUDA.
        run = self.run_program(["test-capture-rules", "reset-elsewhere-rules"], preload=False)
        self.assertSucceeded(run)
        refused = "cudaErrorStreamCaptureUnsupported"
        self.assertEqual(run.output_json(), {
            "reset": "cudaSuccess",
            "own mode": {"cudaEventSynchronize": refused, "cudaDeviceSynchronize": refused},
            "relaxed": {"cudaEventSynchronize": "cudaSuccess", "cudaDeviceSynchronize": refused},
            "cudaMalloc": refused})

    def test_the_simulated_runtime_ends_a_capture_with_its_stream_thread_or_device(self):
        # The rule the books follow above, kept by the simulated runtime as
        # scripts/gpu-check.sh checks it on CUDA.
        run = self.run_program(["test-capture-rules", "gone-rules"], preload=False)
        self.assertSucceeded(run)
        self.assertEqual(run.output_json(), {how: {"end": "cudaSuccess", "cudaMalloc after": "cudaSuccess"}
                                             for how in ("stream", "thread", "reset")})

    def test_free_synchronizes_does_not_synchronize_during_a_capture(self):
        # A plain cudaFree inside a capture: a device synchronization there
        # would be refused and invalidate the capture.
        run = self.run_program(["test-capture", "plain"], env={"GPUPOOL_FREE_SYNCHRONIZES": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["captures_invalidated"], 0)

    def test_other_streams_allocating_during_a_capture_leave_it_valid(self):
        # Blocks freed on the legacy stream and with cudaFree, still busy: the
        # pool must neither fence nor query the legacy stream for them while a
        # blocking stream captures (the capture would be invalidated).
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-capture", "others"],
                                       env={"SIMCUDA_OP_DELAY_US": "100000", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["captures_invalidated"], 0)
                self.assertEqual(run.report()["devices"]["0"]["stats"]["num_ooms"], 0)
                os.remove(run.reports()[0])
        # No room to grow: the requests take the third stream's block, after a
        # device-side wait for its work, capture or no capture.
        run = self.run_program(["test-capture", "others"],
                               env={"SIMCUDA_OP_DELAY_US": "100000", "GPUPOOL_MEMORY_LIMIT": "24M"})
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["captures_invalidated"], 0)
        device = run.report()["devices"]["0"]
        self.assertEqual(device["stats"]["num_ooms"], 0)
        self.assertEqual(device["stats"]["reserved_bytes.all.peak"], 24 << 20)

    def test_the_simulated_runtime_follows_cudas_capture_modes(self):
        # What the tests above rely on: an unsafe call is refused when CUDA
        # refuses it, and not otherwise.
        run = self.run_program(["test-capture-rules", "rules"], preload=False)
        self.assertSucceeded(run)
        self.assertEqual(run.counters()["captures_invalidated"], 3)

    def test_a_capture_on_another_device_keeps_the_cache_only_if_it_forbids_cudafree(self):
        # cudaFree is unsafe during a capture, whichever device the memory is
        # on: a global-mode capture forbids it to every thread, a thread-local
        # one to its own thread, a relaxed one to none. Where it is forbidden
        # the request fails rather than give the cache back, and succeeds once
        # the capture is over; elsewhere the cache goes back at once.
        forbidden = {("global", "same-thread"), ("global", "other-thread"), ("thread-local", "same-thread")}
        for mode in ("global", "thread-local", "relaxed"):
            for thread in ("same-thread", "other-thread"):
                for expandable in ("1", "0"):
                    with self.subTest(mode=mode, thread=thread, expandable_segments=expandable):
                        self.remove_reports()  # a failed subtest's too
                        run = self.run_program(["test-capture", "other-device", mode, thread],
                                               env={"SIMCUDA_DEVICES": "2", "SIMCUDA_MEMORY": "64M",
                                                    "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                        self.assertSucceeded(run)
                        self.assertEqual(run.counters()["captures_invalidated"], 0)
                        oom = (mode, thread) in forbidden
                        self.assertEqual(run.output_json(),
                                         {"during": "cudaErrorMemoryAllocation" if oom else "cudaSuccess",
                                          "after": "cudaSuccess"})
                        ooms = run.report()["devices"]["0"]["ooms"]
                        self.assertEqual(len(ooms), 1 if oom else 0)
                        if oom:
                            self.assertEqual(ooms[0]["cause"], "capture_kept_cache")
                            self.assertFalse(ooms[0]["during_capture"])  # not this device's: still ordered


if __name__ == "__main__":
    main()
