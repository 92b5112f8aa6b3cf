"""Every way a cached block changes hands, on the asynchronous simulated
device: a slow write by the old owner must land before the new owner's. Each
case that has an ordering step is also run with that step switched off
(GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING=1) to show the test catches its absence."""
import os
import subprocess
import sys

from harness import BUILD, GPUPOOL, ShimTest, main, sanitizer_runtime


UNSAFE = {"GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING": "1"}


# Room for the first block only: a request on another stream must then take the
# cached block (waiting for its old work on the device) instead of growing.
PRESSURE = {"GPUPOOL_MEMORY_LIMIT": "2M"}


# case -> True when gpupool has an ordering step on that path (removing it must
# produce the hazard); False when stream order or completion alone protects it.
CASES = {
    "cudafree-blocking": True,      # cudaFree, cudaMalloc, blocking streams: the barrier
    "cudafree-nonblocking": True,   # cudaFree's promise on non-blocking streams
    "cudafree-idle-streams": True,  # idle streams are asked, not skipped, at each barrier
    "new-stream-after-barrier": True,  # a non-blocking stream made later waits for the barrier
    "same-stream": False,           # stream order
    "cross-stream-completed": False,  # the old work is done before the reuse
    "cross-stream-pending": True,   # the new stream waits on the free's fence
    "destroyed-stream": True,       # the destroyed stream's last work is fenced
    "cudafree-after-destroy-idle-streams": True,  # a barrier beside idle streams waits for a destroyed one
    "stream-per-task": True,        # the same, a stream made and destroyed for each of 8 tasks
    "per-thread": True,             # per-thread default streams of two threads
    "ended-thread": True,           # the same, the freeing thread ended before the reuse
}


class Hazards(ShimTest):
    def check(self, binary, case, has_ordering_step, env=None):
        env = dict(PRESSURE, **(env or {}))
        run = self.run_program([binary, case], env=env)
        self.assertSucceeded(run)  # reused, and ordered
        for path in run.reports()[:-1]:
            os.remove(path)
        if has_ordering_step:
            unsafe = self.run_program([binary, case], env=dict(env, **UNSAFE))
            # Under ThreadSanitizer the race itself is caught first (exit 66).
            expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
            self.assertIn(unsafe.code, expected, f"without ordering the hazard should show:\n{unsafe.stdout}")
        return run

    def test_each_reuse_path(self):
        for expandable in ("1", "0"):
            for case, has_step in CASES.items():
                with self.subTest(case=case, expandable_segments=expandable):
                    self.check("test-hazards", case, has_step, {"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})

    def test_streams_made_with_a_priority_are_ordered_as_their_flags_say(self):
        # PyTorch makes every stream of its pool with cudaStreamCreateWithPriority
        # (non-blocking): a barrier must reach them as it reaches the others.
        for case in ("cudafree-nonblocking", "cudafree-idle-streams", "new-stream-after-barrier",
                     "cross-stream-pending", "cudafree-blocking"):
            with self.subTest(case=case):
                self.check("test-hazards", case, True, {"HAZARDS_PRIORITY": "-1"})

    def test_plain_reuse_of_memory_an_earlier_barrier_covers(self):
        # No barrier of its own: the earlier one orders it. Without ordering the
        # pool records no barriers, so the request lands elsewhere (exit 2) and
        # there is no hazard to show; the unit tests model the bookkeeping.
        # The case needs a block of each pool: no memory limit.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                self.check("test-hazards", "cudafree-covered", False,
                           {"GPUPOOL_EXPANDABLE_SEGMENTS": expandable, "GPUPOOL_MEMORY_LIMIT": "unlimited"})

    def test_free_synchronizes_makes_cudafree_wait_for_the_device_as_the_runtimes_does(self):
        # The case reads on the host what slower device work wrote to mapped
        # memory, right after a cudaFree: the runtime's cudaFree waited for it.
        alone = self.run_program(["test-hazards", "cudafree-host-sync"], preload=False)
        self.assertSucceeded(alone)
        run = self.run_program(["test-hazards", "cudafree-host-sync"], env={"GPUPOOL_FREE_SYNCHRONIZES": "1"})
        self.assertSucceeded(run)
        synchronized = run.counters()["device_syncs"]
        # By default the device barrier orders reuse, and the host goes on at once.
        default = self.run_program(["test-hazards", "cudafree-host-sync"])
        expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
        self.assertIn(default.code, expected, default.stdout)
        self.assertEqual(synchronized, default.counters()["device_syncs"] + 1)  # the one cudaFree

    def test_free_synchronizes_waits_for_the_memorys_device_not_the_current_one(self):
        # Device 1's memory freed while device 0 is current, after slower work
        # on device 1: the runtime's cudaFree waits for the memory's device.
        args = ["test-hazards", "cudafree-host-sync-other-device"]
        two = {"SIMCUDA_DEVICES": "2"}
        self.assertSucceeded(self.run_program(args, env=two, preload=False))
        self.assertSucceeded(self.run_program(args, env={**two, "GPUPOOL_FREE_SYNCHRONIZES": "1"}))
        default = self.run_program(args, env=two)
        expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
        self.assertIn(default.code, expected, default.stdout)  # the host read early

    def test_with_event_calls_failing_no_case_reuses_early_or_runs_out(self):
        # The runtime refuses every event gpupool asks for (create, record,
        # wait), or half of them, the program's own calls aside: a fence or
        # barrier may not be had, or be had half-way (an event made but not
        # recorded: a query of it would say "done"). The one block's room is
        # then had by waiting for the whole device on the host: the request
        # is served (exit 0, or 2 when it got memory given back and mapped
        # again elsewhere), never early (1) and never refused for want of
        # memory (3).
        cases = [(rate, seed, case, expandable)
                 for rate, seeds in (("1", ["1"]), ("0.5", ["1", "2", "3", "4", "5"]))
                 for expandable in ("1", "0")
                 for case, has_step in CASES.items() if has_step
                 for seed in seeds]
        runs = self.run_programs([(["test-hazards", case],
                                   dict(PRESSURE, GPUPOOL_EXPANDABLE_SEGMENTS=expandable,
                                        SIMCUDA_EVENT_FAIL_RATE=rate, SIMCUDA_FAIL_SEED=seed))
                                  for rate, seed, case, expandable in cases])
        failed = {}
        for (rate, seed, case, expandable), run in zip(cases, runs):
            with self.subTest(rate=rate, seed=seed, case=case, expandable_segments=expandable):
                self.assertIn(run.code, (0, 2), run.stdout + run.stderr)
                failures = run.counters()["event_failures"]
                if rate == "1":
                    self.assertGreater(failures, 0)
                failed[rate] = failed.get(rate, 0) + failures
        self.assertGreater(failed["0.5"], 0)

    def test_a_new_stream_whose_wait_is_refused_is_ordered_by_a_host_wait(self):
        # One in ten of gpupool's event calls fail. With these seeds the
        # barrier is recorded and the new stream's wait for it is refused;
        # without the host wait that then stands in, each run reuses early.
        for expandable in ("1", "0"):
            for seed in ("7", "9", "11"):
                with self.subTest(seed=seed, expandable_segments=expandable):
                    run = self.run_program(["test-hazards", "new-stream-after-barrier"], env=dict(
                        PRESSURE, GPUPOOL_EXPANDABLE_SEGMENTS=expandable, SIMCUDA_EVENT_FAIL_RATE="0.1",
                        SIMCUDA_FAIL_SEED=seed))
                    self.assertIn(run.code, (0, 2), run.stdout + run.stderr)
        # With every host wait failing too, nothing can order the new stream
        # (a real device fails both only once broken): gpupool says so, once.
        for expandable in ("1", "0"):
            with self.subTest(host_waits="failing", expandable_segments=expandable):
                run = self.run_program(["test-hazards", "new-stream-after-barrier"], env=dict(
                    PRESSURE, GPUPOOL_EXPANDABLE_SEGMENTS=expandable, SIMCUDA_EVENT_FAIL_RATE="0.1",
                    SIMCUDA_HOST_WAIT_FAIL_RATE="1", SIMCUDA_FAIL_SEED="7"))
                said = [line for line in run.stderr.splitlines() if "refused both" in line]
                self.assertEqual(len(said), 1, run.stderr)
                self.assertIn("gpupool: device 0: the runtime refused both cudaStreamWaitEvent and "
                              "cudaEventSynchronize for a new stream", said[0])

    def test_with_host_waits_failing_too_no_case_reuses_early(self):
        # Every host wait gpupool makes fails too (cudaEventSynchronize,
        # cudaStreamSynchronize, cudaDeviceSynchronize), and some event calls.
        # Out of memory (3) is then allowed, early reuse (1) never. These
        # seeds reach two holes, each shown in several of the runs by taking
        # its fix out: a destroyed stream whose fence and host wait both
        # failed was covered by no barrier, and a block freed on another
        # device's stream went to the pool when its host wait failed.
        cases = [case for case, has_step in CASES.items() if has_step] + ["cross-device-free"]
        runs_made = [(rate, seed, case, expandable)
                     for rate, seeds in (("0.3", ["3", "12"]), ("0.05", ["5"]))
                     for expandable in ("1", "0")
                     for case in cases
                     for seed in seeds]
        runs = self.run_programs([(["test-hazards", case], dict(
                                      PRESSURE, GPUPOOL_EXPANDABLE_SEGMENTS=expandable, SIMCUDA_DEVICES="2",
                                      SIMCUDA_EVENT_FAIL_RATE=rate, SIMCUDA_HOST_WAIT_FAIL_RATE="1",
                                      SIMCUDA_FAIL_SEED=seed))
                                  for rate, seed, case, expandable in runs_made])
        host_wait_failures = 0
        for (rate, seed, case, expandable), run in zip(runs_made, runs):
            with self.subTest(rate=rate, seed=seed, case=case, expandable_segments=expandable):
                # Early only where the new stream could be ordered neither way,
                # which gpupool says.
                if run.code == 1 and case == "new-stream-after-barrier":
                    self.assertIn("refused both cudaStreamWaitEvent and cudaEventSynchronize", run.stderr)
                else:
                    self.assertIn(run.code, (0, 2, 3), run.stdout + run.stderr)
                host_wait_failures += run.counters()["host_wait_failures"]
        self.assertGreater(host_wait_failures, 0)

    def test_a_block_freed_on_another_devices_stream_is_reused_after_that_work(self):
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-hazards", "cross-device-free"], env=dict(
                    PRESSURE, GPUPOOL_EXPANDABLE_SEGMENTS=expandable, SIMCUDA_DEVICES="2"))
                self.assertSucceeded(run)

    def test_a_destroyed_streams_handle_brings_the_new_stream_no_blocks(self):
        # A runtime that gives a destroyed stream's handle to the next stream
        # at once: the blocks freed on the old stream, in the pool or in a
        # thread's cache (-threads), must not go to the new one by stream
        # order. Destroyed with cudaStreamDestroy, or with the driver's own
        # cuStreamDestroy, past gpupool (unseen-).
        for case in ("handle-given-again", "handle-given-again-threads", "unseen-destroy", "unseen-destroy-threads"):
            with self.subTest(case=case):
                self.check("test-hazards", case, True, {"SIMCUDA_REUSE_STREAM_HANDLES": "1"})
        # Without the runtime's reuse the case shows nothing, and says so.
        self.assertEqual(self.run_program(["test-hazards", "unseen-destroy"], env=PRESSURE).code, 2)

    def test_a_stream_destroyed_through_the_drivers_call_is_seen_where_called_or_looked_up(self):
        # The program fetches the driver's cuStreamDestroy_v2 with dlsym, or
        # calls it linked with the driver, or a library (driver_lookup_module.c)
        # fetches it with dlsym, or the program fetches it through the runtime's
        # cudaGetDriverEntryPoint: gpupool watches each, and keeps the destroy in
        # the books as cudaStreamDestroy's is. No call
        # names the dead handle (on CUDA 13 such a call crashed the program),
        # no device-wide wait is made, and the block freed on the stream
        # waits for its write on another stream.
        library = {"HAZARDS_DRIVER_LIBRARY": os.path.join(BUILD, "tests", "libtest-driver-lookup.so")}
        for case in ("driver-destroy", "linked-driver-destroy", "library-driver-destroy", "runtime-driver-destroy"):
            with self.subTest(case=case):
                self.remove_reports()
                run = self.run_program(["test-hazards", case], env=dict(PRESSURE, **library))
                self.assertEqual(run.code, 0, run.stdout + run.stderr)
                counters = run.counters()
                self.assertEqual(counters["destroyed_stream_calls"], 0)
                self.assertEqual(counters["device_syncs"], 1)  # the program's own
                rows = run.report()["devices"]["0"]["streams"]
                self.assertEqual(sum(r["host_syncs"] for r in rows), 0, rows)
                self.assertEqual(len([r for r in rows if not r["alive"]]), 1, rows)
                unsafe = self.run_program(["test-hazards", case], env=dict(PRESSURE, **library, **UNSAFE))
                expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
                self.assertIn(unsafe.code, expected, f"without ordering the hazard should show:\n{unsafe.stdout}")

    def test_a_stream_destroyed_unseen_whose_handle_stays_unused_costs_one_device_wait(self):
        # Destroyed through the driver, past gpupool, its handle given to no
        # new stream: the runtime refuses every call naming it. Its block goes
        # to a plain request only after its write (a device wait), and the
        # stream then leaves the barriers: the plain pairs after it reuse
        # memory, naming it no more.
        # With room for one block it is reused (0); with room to grow, its
        # request took new memory while the write was queued (2).
        for limit, code in (("2M", 0), ("unlimited", 2)):
            with self.subTest(memory_limit=limit):
                run = self.run_program(["test-hazards", "gone-stream"], env={"GPUPOOL_MEMORY_LIMIT": limit})
                self.assertEqual(run.code, code, run.stdout + run.stderr)
                counters = run.counters()
                self.assertEqual(counters["destroyed_stream_calls"], 1)  # the call that found it gone
                self.assertEqual(counters["device_syncs"], 2)  # gpupool's one, and the program's own
                device = run.report()["devices"]["0"]
                self.assertLessEqual(device["stats"]["reserved_bytes.all.peak"], 4 << 20)  # two 2 MiB segments
                # The report says so, and what to do.
                self.assertEqual(sum(r["destroyed_unseen"] for r in device["streams"]), 1, device["streams"])
                self.assertTrue(any(a.startswith("1 stream was destroyed where gpupool could not see it")
                                    for a in device["advice"]), device["advice"])
                viewed = subprocess.run([sys.executable, GPUPOOL, "report", run.reports()[0]], capture_output=True,
                                        text=True, timeout=120)
                self.assertIn("1 of the gone streams was destroyed where gpupool could not see it", viewed.stdout)
                os.remove(run.reports()[0])
        unsafe = self.run_program(["test-hazards", "gone-stream"], env=dict(PRESSURE, **UNSAFE))
        expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
        self.assertIn(unsafe.code, expected, f"without ordering the hazard should show:\n{unsafe.stdout}")

    def test_a_stream_made_through_the_driver_on_a_gone_handle_is_a_new_stream(self):
        # A plain request finds the destroyed stream gone; then a stream made
        # through the driver gets its handle. The old stream's block, in the
        # pool or in a thread's cache (-threads), must not go to the new one
        # by stream order while the old write is queued (1). gpupool forgets
        # the handle, and meets the new stream as new: one gone row for the
        # old stream, one live row for the new. 0: reused after the write; 2:
        # the request took other memory.
        env = {"SIMCUDA_REUSE_STREAM_HANDLES": "1", "GPUPOOL_MEMORY_LIMIT": "10M", "GPUPOOL_THREAD_CACHE_SIZE": "2M"}
        for case in ("gone-stream-made-again", "gone-stream-made-again-threads"):
            with self.subTest(case=case):
                run = self.run_program(["test-hazards", case], env=env)
                self.assertIn(run.code, (0, 2), run.stdout + run.stderr)
                self.assertNotIn("new stream has a handle of its own", run.stdout)
                self.assertEqual(run.counters()["destroyed_stream_calls"], 1)
                rows = [r for r in run.report()["devices"]["0"]["streams"] if r["stream"].startswith("0x")]
                self.assertEqual(sorted(r["alive"] for r in rows), [False, True], rows)
                self.assertEqual([r["destroyed_unseen"] for r in rows if not r["alive"]], [1], rows)
                os.remove(run.reports()[0])
                unsafe = self.run_program(["test-hazards", case], env=dict(env, **UNSAFE))
                expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
                self.assertIn(unsafe.code, expected, f"without ordering the hazard should show:\n{unsafe.stdout}")
                for path in unsafe.reports():
                    os.remove(path)
        # Named in a stream-ordered call, such a stream is made to follow the
        # latest barrier, as any stream gpupool meets first there.
        self.check("test-hazards", "gone-handle-after-barrier", True, {"SIMCUDA_REUSE_STREAM_HANDLES": "1"})

    def test_per_thread_default_stream_build(self):
        # Built with CUDA_API_PER_THREAD_DEFAULT_STREAM: the _ptsz entry points.
        for case in ("per-thread", "ended-thread"):
            with self.subTest(case=case):
                self.check("test-hazards-ptds", case, True)

    def reused_with_room_to_grow(self, case, expandable):
        """Runs a hazard case with no memory limit: the block must be reused
        (exit 2 otherwise) and ordered, with one 2 MiB segment at the peak.
        Returns the run, its reports removed."""
        env = {"GPUPOOL_MEMORY_LIMIT": "unlimited", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
        run = self.run_program(["test-hazards", case], env=env)
        try:
            self.assertSucceeded(run)
            self.assertEqual(run.report()["devices"]["0"]["stats"]["reserved_bytes.all.peak"], 2 << 20)
        finally:
            for path in run.reports():
                os.remove(path)
        return run

    def test_per_thread_streams_take_pending_blocks_through_the_legacy_stream_with_room_to_grow(self):
        # Thread B's per-thread stream follows the legacy stream, and the
        # completion fence's event there follows thread A's write: B takes
        # the block at once, with no wait and no new memory. (Before, B grew
        # the pool while A's work was pending: threads that come and go each
        # took new memory while the device was behind.)
        for case in ("per-thread", "ended-thread"):
            for expandable in ("1", "0"):
                with self.subTest(case=case, expandable_segments=expandable):
                    run = self.reused_with_room_to_grow(case, expandable)
                    self.assertEqual(run.counters()["stream_waits"], 0)
                    env = {"GPUPOOL_MEMORY_LIMIT": "unlimited", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable, **UNSAFE}
                    unsafe = self.run_program(["test-hazards", case], env=env)
                    expected = (1, 66) if "tsan" in (sanitizer_runtime() or "") else (1,)
                    self.assertIn(unsafe.code, expected, f"without ordering the hazard should show:\n{unsafe.stdout}")
                    for path in unsafe.reports():
                        os.remove(path)

    def test_a_stream_made_for_each_task_takes_the_last_tasks_block_after_a_wait(self):
        # With room to grow: a look at a destroyed stream's block, its work
        # in flight, makes the new stream wait for that stream's last event.
        # (Without ordering there is no wait and the block is not taken:
        # CASES shows the hazard under pressure.)
        for case in ("destroyed-stream", "stream-per-task"):
            for expandable in ("1", "0"):
                with self.subTest(case=case, expandable_segments=expandable):
                    self.reused_with_room_to_grow(case, expandable)

    def test_a_stream_made_for_each_task_on_an_idle_device_keeps_one_block(self):
        # 10 ms between tasks: each task's work is done by the next look,
        # which records a completion fence (no barrier) and finds it pending.
        # The task before the last one is then known done, and its bytes are
        # taken, though in an expandable segment they are merged with the last
        # task's (before, the merged block looked pending as a whole: a new
        # page every task or two, 30 MiB for 30 tasks). A look that comes
        # before the simulated runtime has run the last fence may still grow
        # the pool once.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["gpupool-bench-api", "tasks", "30", "10000"],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertLessEqual(run.report()["devices"]["0"]["stats"]["reserved_bytes.all.peak"], 4 << 20)
                for path in run.reports():
                    os.remove(path)

    def test_a_stream_made_for_each_task_beside_a_busy_stream_keeps_one_block(self):
        # A long-lived stream is given 11 ms of work before each task (each
        # simulated operation takes 1 ms) and falls ever further behind, so
        # no completion fence completes. Each task's own stream is done by
        # the next task: its blocks are then known done by the event recorded
        # on it at its destroy (before, they waited for a completion fence,
        # and the pool grew with the tasks: 10-58 MiB for these 60 in six runs
        # of the code before, expandable and fixed).
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["gpupool-bench-api", "tasks", "60", "10000", "11"],
                                       env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable,
                                            "SIMCUDA_OP_DELAY_US": "1000"})
                self.assertSucceeded(run)
                self.assertLessEqual(run.report()["devices"]["0"]["stats"]["reserved_bytes.all.peak"], 4 << 20)
                for path in run.reports():
                    os.remove(path)

    def test_a_stream_made_for_each_task_never_waits_behind_a_busy_stream(self):
        # Each task's stream takes the last task's block after waiting for
        # that task alone (auto), or new memory (completed, never: exit 2). A
        # device barrier would put it behind the busy stream's work (exit 4):
        # under those two policies a completion fence was made a barrier while
        # a destroyed stream's work was in flight, as growing the pool makes
        # one. Overlapping tasks (each stream destroyed after the next task
        # took memory, exit 0 either way) leave a fence pending on the stream
        # at its destroy: waiting for it made completion fences barriers too,
        # under completed.
        cases = [(case, policy, codes, expandable)
                 for case, per_policy in (("stream-per-task-beside-busy",
                                           (("auto", (0,)), ("completed", (0, 2)), ("never", (2,)))),
                                          ("overlapping-tasks-beside-busy",
                                           (("auto", (0,)), ("completed", (0,)), ("never", (0,)))))
                 for policy, codes in per_policy
                 for expandable in ("1", "0")]
        runs = self.run_programs([(["test-hazards", case], {"GPUPOOL_CROSS_STREAM_REUSE": policy,
                                                             "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                                  for case, policy, _, expandable in cases])
        for (case, policy, codes, expandable), run in zip(cases, runs):
            with self.subTest(case=case, policy=policy, expandable_segments=expandable):
                self.assertIn(run.code, codes, run.stdout + run.stderr)

    def test_completed_work_is_reused_without_a_device_wait(self):
        run = self.check("test-hazards", "cross-stream-completed", False)
        streams = run.report()["devices"]["0"]["streams"]
        self.assertEqual(sum(s["event_waits"] for s in streams), 0)
        self.assertEqual(sum(s["cross_stream_reuses"] for s in streams), 1)

    def test_with_room_to_grow_pending_work_is_left_alone(self):
        run = self.run_program(["test-hazards", "cross-stream-pending"])
        self.assertEqual(run.code, 2)  # new memory instead of a wait for the other stream
        self.assertEqual(run.counters()["stream_waits"], 0)

    def test_pending_work_is_reused_after_a_device_wait_not_a_host_wait(self):
        run = self.check("test-hazards", "cross-stream-pending", False)
        streams = run.report()["devices"]["0"]["streams"]
        self.assertEqual(sum(s["event_waits"] for s in streams), 1)
        self.assertEqual(sum(s["host_syncs"] for s in streams), 0)
        self.assertEqual(run.counters()["event_syncs"], 0)

    def test_completed_policy_never_makes_streams_wait(self):
        run = self.run_program(["test-hazards", "cross-stream-pending"],
                               env={"GPUPOOL_CROSS_STREAM_REUSE": "completed", "GPUPOOL_MEMORY_LIMIT": "4M"})
        self.assertEqual(run.code, 2)  # not reused while pending, even when tight: a new block instead
        self.assertEqual(run.counters()["stream_waits"], 0)

    def test_never_policy_keeps_streams_apart(self):
        # Without page recycling: unmapping s1's finished pages and mapping new
        # ones for s2 may hand out the same address (other memory, and safe),
        # which is not what this test looks at.
        run = self.run_program(["test-hazards", "cross-stream-completed"],
                               env={"GPUPOOL_CROSS_STREAM_REUSE": "never", "GPUPOOL_RECYCLE_PAGES": "0"})
        self.assertEqual(run.code, 2)

    def test_the_simulated_runtime_forgets_streams_destroyed_and_drained(self):
        # Each legacy-stream operation (every device barrier's event) looks at
        # the streams it may have to wait for. Were ended threads' per-thread
        # streams and destroyed streams kept there, a program that makes a
        # thread or a stream for each task would run slower with each task
        # (a churn of 20,000 threads took 3.5 times as long a thread as one
        # of 2,000). At exit the legacy stream is left, and perhaps the tasks'
        # last stream: its work is done (the program synchronizes the device
        # first), but its worker may not yet have woken to leave the list.
        for mode in (["churn", "200"], ["tasks", "30"]):
            with self.subTest(mode=mode[0]):
                run = self.run_program(["gpupool-bench-api"] + mode)
                self.assertSucceeded(run)
                self.assertLessEqual(run.counters()["streams_tracked"], 2)

    def test_the_simulated_runtime_wakes_only_the_workers_an_operation_concerns(self):
        # Under gpupool each task's stream waits for the last task's work (its
        # block's), so the tasks' work forms one chain, and the program makes
        # streams faster than the chain runs: their workers pile up, each
        # waiting for the one before. Woken all at each operation, they made
        # the tasks quadratic (3,000 tasks took 7.4 ms each, 300 took 0.8). A
        # worker now wakes for its own stream's operations and for the streams
        # it waits on: about 7 looks a task, where all-at-once made 51 a task
        # at 100 tasks and 79 at 200.
        run = self.run_program(["gpupool-bench-api", "tasks", "200"])
        self.assertSucceeded(run)
        self.assertLessEqual(run.counters()["worker_wakeups"], 20 * 200)


if __name__ == "__main__":
    main()
