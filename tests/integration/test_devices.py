"""Several devices in one process: each device's memory from its own pool
whatever device is current, frees on another device's stream, resets, peer
and pool access; and random work on two devices, with failures injected."""
import json
import os

from harness import NATIVE, ShimTest, main


class Devices(ShimTest):
    # Two simulated devices, and room in each device's pool for one 12 MiB
    # block: a block freed with cudaFree can only be reused, on its device.
    ENV = {"SIMCUDA_DEVICES": "2", "GPUPOOL_MEMORY_LIMIT": "20M"}

    # The simulated runtime gives a destroyed stream's handle to the next
    # stream made, as CUDA may.
    HANDLES_AGAIN = {"SIMCUDA_REUSE_STREAM_HANDLES": "1"}

    PROGRAM = "test-devices"

    def in_both_segment_modes(self, args, env, check):
        """Runs the class's PROGRAM with ARGS, expandable segments on, then
        off, and calls check(report) on each run's JSON report."""
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program([self.PROGRAM] + args, env=dict(env, GPUPOOL_EXPANDABLE_SEGMENTS=expandable))
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["captures_invalidated"], 0)
                self.assertEqual(run.counters()["stale_event_uses"], 0)  # none after a reset destroyed it
                check(run.report())
                os.remove(run.reports()[0])

    def test_each_device_serves_its_own_memory_whatever_device_is_current(self):
        # Blocks asked of one device while the other is current (cudaMallocAsync
        # on its stream) and freed while the other is current (cudaFree): the
        # reuse is ordered on the block's device, not the current one.
        def check(report):
            self.assertEqual(sorted(report["devices"]), ["0", "1"])
            for device in report["devices"].values():
                self.assertEqual(device["stats"]["num_ooms"], 0)
                self.assertEqual(device["stats"]["reserved_bytes.all.peak"], 12 << 20)
                self.assertEqual(device["stats"]["allocation.all.allocated"], 3 * 20)
                self.assertEqual(device["stats"]["allocation.all.current"], 0)
        self.in_both_segment_modes(["cross", "20"], self.ENV, check)

    def test_a_stream_made_past_gpupool_gets_memory_of_its_own_device(self):
        # Device 1's stream, made through the driver where gpupool cannot see
        # it, named in cudaMallocAsync while device 0 is current: the runtime
        # would give it device 1's memory, and so does gpupool (the program
        # checks each block's device, and its pattern). Taken for the current
        # device's, it got device 0's memory, which a kernel on that stream
        # cannot reach without peer access.
        def check(report):
            self.assertEqual(sorted(report["devices"]), ["1"])
            one = report["devices"]["1"]["stats"]
            self.assertEqual(one["allocation.all.allocated"], 5)
            self.assertEqual(one["allocation.all.current"], 0)
            self.assertEqual(one["num_ooms"], 0)
        self.in_both_segment_modes(["unseen-stream", "5"], self.ENV, check)

    def test_a_thread_per_device(self):
        # Both threads make stream-ordered calls, so each keeps its freed
        # blocks in its cache; each one's plain cudaMalloc then needs them back
        # while the other thread may be flushing the caches too.
        run = self.run_program(["test-devices", "threads", "50"], env=self.ENV)
        self.assertSucceeded(run)
        for device in run.report()["devices"].values():
            self.assertEqual(device["stats"]["num_ooms"], 0)
            self.assertEqual(device["stats"]["allocation.all.allocated"], 2 * 50)

    def test_a_block_freed_on_another_devices_stream_waits_for_that_stream(self):
        # Device 1's stream writes device 0's block (peer access), then frees
        # it in its order. Device 0's pool cannot order its reuse on its own
        # streams; the block comes back only once device 1's stream has passed
        # the free (a pattern check fails if it comes back early), and device
        # 0's pool never sees device 1's stream.
        def check(report):
            zero, one = report["devices"]["0"], report["devices"]["1"]
            self.assertEqual(zero["stats"]["num_ooms"], 0)
            self.assertEqual(zero["stats"]["reserved_bytes.large_pool.peak"], 12 << 20)  # one block
            self.assertEqual(zero["leaks"]["blocks"], 0)
            own = {s["stream"] for s in one["streams"]} - {"cudaMalloc/cudaFree", "legacy"}
            self.assertTrue(own)
            self.assertFalse(own & {s["stream"] for s in zero["streams"]})
        self.in_both_segment_modes(["foreign", "10"], dict(self.ENV, SIMCUDA_OP_DELAY_US="20000"), check)

    def test_a_failed_query_of_another_devices_free_is_not_taken_as_done(self):
        # The same, with every event query gpupool makes failing: the query
        # of the free's event says nothing of whether device 1's stream has
        # passed the free, so the block stays out until a host wait on that
        # event succeeds (the next request, having no room, makes one).
        # Taken as done, the block comes back under device 1's queued memset
        # and the program's pattern check fails.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-devices", "foreign", "6"], env=dict(
                    self.ENV, SIMCUDA_OP_DELAY_US="20000", SIMCUDA_EVENT_QUERY_FAIL_RATE="1",
                    GPUPOOL_EXPANDABLE_SEGMENTS=expandable))
                self.assertSucceeded(run)
                self.assertGreater(run.counters()["event_query_failures"], 0)
                zero = run.report()["devices"]["0"]
                self.assertEqual(zero["stats"]["num_ooms"], 0)
                self.assertEqual(zero["stats"]["reserved_bytes.large_pool.peak"], 12 << 20)  # one block
                os.remove(run.reports()[0])

    def test_a_block_freed_on_another_devices_stream_inside_a_capture_stays_the_graphs(self):
        def check(report):
            self.assertEqual(report["devices"]["0"]["leaks"]["blocks"], 0)  # the program freed it
        self.in_both_segment_modes(["foreign-capture"], {"SIMCUDA_DEVICES": "2"}, check)

    def test_a_block_freed_inside_a_capture_of_a_device_then_reset_comes_back(self):
        # The graph's until device 1 is reset, which destroys the graph and
        # ends its work. Room for one block: the next request on device 0
        # needs it. Also where the reset returns an earlier launch's error
        # (late): device 1's pool memory being gone says it happened, whether
        # the runtime answers for an unknown address with an unregistered
        # type (CUDA 11 on) or cudaErrorInvalidValue (legacy: before).
        def check(report):
            zero = report["devices"]["0"]
            self.assertEqual(zero["stats"]["num_ooms"], 0)
            self.assertEqual(zero["stats"]["allocation.all.current"], 0)
        for error, attributes in (("", ""), ("late", ""), ("late", "legacy")):
            with self.subTest(reset_error=error, pointer_attributes=attributes):
                self.in_both_segment_modes(["foreign-capture-reset"], dict(
                    self.ENV, SIMCUDA_RESET_ERROR=error, SIMCUDA_POINTER_ATTRIBUTES=attributes), check)

    def test_a_block_freed_on_a_device_then_reset_comes_back(self):
        # The free still waits on device 1's stream when device 1 is reset: the
        # reset destroys the event it waits on, so gpupool waits for it first
        # and gives the block back. Room for one block: the next request on
        # device 0 needs it.
        def check(report):
            zero = report["devices"]["0"]
            self.assertEqual(zero["stats"]["num_ooms"], 0)
            self.assertEqual(zero["stats"]["allocation.all.current"], 0)
        self.in_both_segment_modes(["foreign-reset"], dict(self.ENV, SIMCUDA_OP_DELAY_US="200000"), check)

    def test_a_second_free_while_the_first_waits_on_another_devices_stream_is_refused(self):
        # Accepted, the block would go back to the pool now and again when
        # the first free's wait ends: handed out twice. Room for one block on
        # device 0: two requests after it are served, so it came back once.
        def check(report):
            zero = report["devices"]["0"]
            self.assertEqual(zero["stats"]["num_ooms"], 0)
            self.assertEqual(zero["stats"]["allocation.all.allocated"], 3)
            self.assertEqual(zero["stats"]["allocation.all.current"], 0)
        self.in_both_segment_modes(["foreign-twice"], dict(self.ENV, SIMCUDA_OP_DELAY_US="200000"), check)

    def test_a_report_mid_run_shows_a_free_on_another_devices_stream_as_freed_once_done(self):
        # Device 1's stream has passed the free when the program asks for a
        # report (SIGUSR1): the block is no longer the program's. It read as
        # allocated until the report looked at the waiting frees.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                target = os.path.join(self.workdir, f"report-signal-{expandable}.json")
                run = self.run_program(["test-devices", "foreign-signal", target], env={
                    "SIMCUDA_DEVICES": "2", "GPUPOOL_LOG": target, "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                during = json.loads(run.stdout)
                self.assertEqual(during["reason"], "signal")
                zero = during["devices"]["0"]["stats"]
                self.assertEqual((zero["allocation.all.allocated"], zero["allocation.all.current"]), (1, 0))

    def test_a_reset_counts_a_free_waiting_on_another_devices_stream_as_the_programs(self):
        # The program freed device 0's block on device 1's stream; device 0's
        # pool has not looked at that stream's event yet when device 0 is
        # reset. The reset did not free that block: the program did.
        def check(report):
            zero = report["devices"]["0"]
            resets = zero["device_resets"]
            self.assertEqual((resets["count"], resets["blocks_freed_by_reset"], resets["bytes_freed_by_reset"]),
                             (1, 0, 0))
            self.assertEqual(zero["stats"]["allocation.all.freed"], zero["stats"]["allocation.all.allocated"])
        self.in_both_segment_modes(["owner-reset"], {"SIMCUDA_DEVICES": "2"}, check)

    def test_a_handle_given_again_to_another_devices_stream_serves_that_device(self):
        # A thread's last stream is remembered with its device; the stream
        # destroyed and its handle given to a stream of device 1, the memory
        # must be device 1's (the program checks where each block lies).
        self.in_both_segment_modes(["handle-again"], dict(self.HANDLES_AGAIN, SIMCUDA_DEVICES="2"), lambda report: None)

    def test_the_devices_program_passes_without_gpupool_too(self):
        for mode in ("cross", "foreign", "foreign-capture", "foreign-capture-reset", "foreign-reset", "owner-reset",
                     "handle-again"):
            env = dict(self.HANDLES_AGAIN if mode == "handle-again" else {}, SIMCUDA_DEVICES="2")
            run = self.run_program(["test-devices", mode, "5"], env=env, preload=False)
            self.assertSucceeded(run)


class Access(ShimTest):
    """Who may use whose memory, gpupool's pages included, as the program
    grants access between devices and takes it away."""
    PROGRAM = "test-device-access"
    in_both_segment_modes = Devices.in_both_segment_modes

    def test_peer_access_reaches_pooled_pages(self):
        # cudaDeviceEnablePeerAccess opens a peer's cudaMalloc memory, not
        # pages mapped with cuMemMap: gpupool grants those itself, for pages
        # mapped before and after the call, and for pools made later.
        self.in_both_segment_modes(["peer"], {"SIMCUDA_DEVICES": "2"}, lambda report: None)

    def test_a_default_pool_opened_to_another_device_opens_the_memory_gpupool_serves_for_it(self):
        # cudaMemPoolSetAccess, not peer access, opens stream-ordered memory to
        # another device (PyTorch's cudaMallocAsync backend enables peer copies
        # so). Expandable segments open their pages to it, those mapped before
        # the grant too, and those of a device whose pool came after the
        # grant, and go on serving. Fixed segments are cudaMalloc memory,
        # which only peer access opens: the stream-ordered calls of each
        # opened device go to the runtime after its grant (3 on device 0, 1 on
        # device 1), and a line says device 0's block lent before stays closed.
        opened = "cudaMemPoolSetAccess opened device {}'s default memory pool to other devices"
        for expandable, lent_before_open, to_runtime in (("1", True, 0), ("0", False, 4)):
            with self.subTest(expandable_segments=expandable):
                self.remove_reports()
                run = self.run_program(["test-device-access", "pool-access"],
                                       env={"SIMCUDA_DEVICES": "3", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(json.loads(run.stdout)["lent_before_open"], lent_before_open)
                zero = run.report()["devices"]["0"]["stats"]
                self.assertEqual(zero["allocation.all.allocated"], 1 if to_runtime else 4)
                self.assertEqual(run.counters()["malloc_async_calls"], to_runtime)
                for device in (0, 1):
                    self.assertEqual(run.stderr.count(opened.format(device)), 1 - lent_before_open, run.stderr)
                self.assertEqual(run.stderr.count("gpupool lent before stay closed"), 1 - lent_before_open)
                if not lent_before_open:
                    self.assertIn("the 12.00 MiB of stream-ordered blocks gpupool lent before stay closed", run.stderr)
                    self.assertEqual(run.stderr.count(
                        "4 cudaMallocAsync calls drew from default memory pools this program opened to other "
                        "devices"), 1, run.stderr)
        alone = self.run_program(["test-device-access", "pool-access"], env={"SIMCUDA_DEVICES": "3"}, preload=False)
        self.assertSucceeded(alone)
        self.assertTrue(json.loads(alone.stdout)["lent_before_open"])

    def test_a_device_reset_closes_its_default_pool_again(self):
        # With fixed segments only the block made while device 0's default
        # pool was open is the runtime's: not the one after a pool of the
        # program's own was opened, nor those after each device's reset
        # (device 1's pool opened before device 1 had a pool of gpupool's).
        for expandable, to_runtime in (("1", 0), ("0", 1)):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-device-access", "pool-access-reset"],
                                       env={"SIMCUDA_DEVICES": "2", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["malloc_async_calls"], to_runtime)
                self.assertEqual(run.stderr.count("drew from default memory pools this program opened"), to_runtime,
                                 run.stderr)
                for path in run.reports():
                    os.remove(path)

    def test_access_taken_away_closes_the_pooled_pages_unless_the_other_grant_holds(self):
        # A page of gpupool's serves both kinds of block, so it stays open to
        # a device while peer access or the default pool's access holds, and
        # closes once neither does (cudaDeviceDisablePeerAccess,
        # cudaMemAccessFlagsProtNone), to pages mapped before and after; a
        # device reset closes the default pool.
        self.in_both_segment_modes(["access-revoked"], {"SIMCUDA_DEVICES": "2"}, lambda report: None)

    def test_a_pool_opened_for_reading_opens_the_pooled_pages_for_reading_alone(self):
        # cudaMemAccessFlagsProtRead: gpupool's pages of device 0 open to
        # device 1 for reading, mapped before the grant or after, and for
        # writing too only while the pool's grant or peer access says so.
        self.in_both_segment_modes(["pool-read"], {"SIMCUDA_DEVICES": "2"}, lambda report: None)

    def test_access_changed_on_one_thread_while_another_maps_and_unmaps_pages(self):
        # The grants' books and pages change under the devices' lock, then the
        # device's: every block keeps its contents, and once the changes stop
        # the pages are open as far as the last grants say.
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                run = self.run_program(["test-device-access", "access-churn"],
                                       env={"SIMCUDA_DEVICES": "2", "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                self.assertSucceeded(run)
                made = json.loads(run.stdout)
                self.assertEqual(made["steps"], 400)
                self.assertGreaterEqual(made["changes"], 100)  # most steps see a change
                self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.current"], 0)
                self.remove_reports()

    def test_pages_the_driver_will_not_map_for_reading_alone_open_for_writing_too(self):
        # SIMCUDA_REFUSE_ACCESS=1:read: a driver that will not map pages for
        # reading alone. Less access than the grant would fault the program's
        # reads, so the pages open for writing too: the first pages, mapped
        # after the grant, and pages already mapped at the next one (a line
        # each); each step back from writing to reading alone is refused (a
        # line each: device 1 may still write them).
        run = self.run_program(["test-device-access", "pool-read", "read-gives-write"],
                               env={"SIMCUDA_DEVICES": "2", "SIMCUDA_REFUSE_ACCESS": "1:read",
                                    "GPUPOOL_EXPANDABLE_SEGMENTS": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.stderr.count("the driver refused to open device 0's pooled pages to device 1 for reading "
                                          "alone (cuMemSetAccess: error 801): gpupool opens them for writing too"), 2,
                         run.stderr)
        self.assertEqual(run.stderr.count("the driver refused to make device 0's pooled pages read-only to device 1 "
                                          "(cuMemSetAccess: error 801): device 1 may still write them"), 2, run.stderr)
        self.assertEqual(run.stderr.count("gpupool: the driver refused"), 4, run.stderr)

    def test_a_reset_of_either_device_ends_peer_access_to_the_pooled_pages(self):
        # CUDA ends peer access when either device is reset: gpupool's pages
        # of the owner close to the accessor, mapped before or after, until
        # access is enabled again.
        self.in_both_segment_modes(["peer-reset"], {"SIMCUDA_DEVICES": "2"}, lambda report: None)

    def test_pages_the_driver_will_not_open_or_close_are_said_and_later_pages_still_map(self):
        # SIMCUDA_REFUSE_ACCESS=0: cuMemSetAccess refuses any change of device
        # 0's access; with ":close", only taking it away; with
        # ":open-after=1", opening it past the first page (the page opened
        # closes again: the device, left out, would never be closed); with
        # ":open-after=6", past the first block's six pages, so that only the
        # later block's new pages stay closed (those opened before close when
        # the access goes, though the device has left the list). With
        # expandable segments a line says so once, and the pages, mapped
        # before the grant and after it, serve device 1 alone (every
        # allocation still succeeds), or stay open once peer access is
        # disabled. Fixed segments are cudaMalloc memory, which the runtime
        # opens and closes.
        opened = "the driver refused to open device 1's pooled pages to device 0"
        closed = "the driver refused to close device 1's pooled pages to device 0"
        for expandable in ("1", "0"):
            for refuse in ("0", "0:close", "0:open-after=1", "0:open-after=6", "-1"):
                with self.subTest(expandable_segments=expandable, refuse=refuse):
                    run = self.run_program(["test-device-access", "peer-after-pages"],
                                           env={"SIMCUDA_DEVICES": "2", "SIMCUDA_REFUSE_ACCESS": refuse,
                                                "GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                    self.assertSucceeded(run)
                    before_closed = expandable == "1" and refuse in ("0", "0:open-after=1")
                    after_closed = before_closed or (expandable == "1" and refuse == "0:open-after=6")
                    not_closed = expandable == "1" and refuse == "0:close"
                    self.assertEqual(json.loads(run.stdout),
                                     {"before": not before_closed, "after": not after_closed,
                                      "closed": not not_closed})
                    self.assertEqual(run.stderr.count(opened), 1 if after_closed else 0, run.stderr)
                    self.assertEqual(run.stderr.count(closed), 1 if not_closed else 0, run.stderr)
                    self.remove_reports()
        # Granted before device 0 had pages: its first pages map, for device 0
        # alone, and its blocks serve device 1's writes as before.
        run = self.run_program(["test-devices", "foreign", "5"],
                               env={"SIMCUDA_DEVICES": "2", "SIMCUDA_REFUSE_ACCESS": "1",
                                    "GPUPOOL_EXPANDABLE_SEGMENTS": "1"})
        self.assertSucceeded(run)
        self.assertEqual(run.stderr.count("the driver refused to open device 0's pooled pages to device 1"), 1,
                         run.stderr)

    def test_the_access_program_passes_without_gpupool_too(self):
        for mode in ("peer", "pool-access", "pool-access-reset", "access-revoked", "peer-after-pages", "pool-read",
                     "access-churn", "peer-reset"):
            run = self.run_program(["test-device-access", mode],
                                   env={"SIMCUDA_DEVICES": "3" if mode == "pool-access" else "2"}, preload=False)
            self.assertSucceeded(run)


class Stress(ShimTest):
    # Three threads, two devices, every kind of stream, frees with work still
    # queued (some on the other device's stream), streams renewed; a memory
    # limit makes the pool reuse under pressure.
    ENV = {"SIMCUDA_DEVICES": "2", "SIMCUDA_OP_DELAY_US": "50", "GPUPOOL_MEMORY_LIMIT": "256M"}

    def test_random_work_on_two_devices_keeps_every_pattern(self):
        # test-stress-ptds: the same built for the per-thread default stream
        # (every stream call through a _ptsz entry point). Where the runtime
        # gives a destroyed stream's handle to the next stream made (reuse),
        # the program's renewed streams come back under their old handles.
        refused = allocations = 0
        for program, seed, expandable, reuse in (("test-stress", "1", "1", "0"), ("test-stress", "2", "1", "1"),
                                                 ("test-stress", "3", "0", "0"), ("test-stress", "4", "0", "1"),
                                                 ("test-stress-ptds", "5", "1", "1")):
            with self.subTest(program=program, seed=seed, expandable_segments=expandable, reuse=reuse):
                run = self.run_program([program, "3", "10", "200", seed],
                                       env=dict(self.ENV, GPUPOOL_EXPANDABLE_SEGMENTS=expandable,
                                                SIMCUDA_REUSE_STREAM_HANDLES=reuse))
                self.assertSucceeded(run)
                did = run.output_json()
                devices = run.report()["devices"].values()
                self.assertEqual(sum(d["stats"]["allocation.all.allocated"] for d in devices), did["allocations"])
                for key in ("allocation", "allocated_bytes", "requested_bytes"):  # the program freed everything
                    self.assertEqual(sum(d["stats"][f"{key}.all.current"] for d in devices), 0, key)
                refused += did["refused"]
                allocations += did["allocations"]
                os.remove(run.reports()[0])
        # Refusals come only from the limit, seldom: blocks freed on a
        # device's streams, or on the other's, come back to be reused. Judged
        # over all five runs: one run's rate depends on timing (the ptds run
        # refused 0.2% to 5.1% on a loaded machine), all five together 0.4%
        # to 0.6%, and 3.1% to 4.1% with GPUPOOL_CROSS_STREAM_REUSE=never.
        # Not judged under an emulator (scripts/cross-test), where the program
        # runs several times slower beside the device's fixed delays (2.1%
        # once): the policy is the same on every machine.
        if NATIVE:
            self.assertLess(refused * 50, allocations)

    def stress_with(self, seed, expandable, failures):
        """Runs the stress program with the simulated runtime's `failures`
        and checks that every pattern and count holds; returns the run, what
        the program did and the report's devices."""
        run = self.run_program(["test-stress", "3", "10", "200", seed],
                               env=dict(self.ENV, GPUPOOL_EXPANDABLE_SEGMENTS=expandable, SIMCUDA_FAIL_SEED=seed,
                                        **failures))
        self.assertSucceeded(run)
        did = run.output_json()
        devices = list(run.report()["devices"].values())
        self.assertEqual(sum(d["stats"]["allocation.all.allocated"] for d in devices), did["allocations"])
        for key in ("allocation", "allocated_bytes", "requested_bytes"):  # the program freed everything
            self.assertEqual(sum(d["stats"][f"{key}.all.current"] for d in devices), 0, key)
        os.remove(run.reports()[0])
        return run, did, devices

    def test_random_device_failures_are_refusals_and_damage_nothing(self):
        # One in five of the device's allocations (cudaMalloc, or a page's
        # cuMemCreate) fails: the program sees out-of-memory errors, each one
        # reported, and every pattern and count still holds.
        for seed, expandable in (("7", "1"), ("8", "0")):
            with self.subTest(seed=seed, expandable_segments=expandable):
                _, did, devices = self.stress_with(seed, expandable, {"SIMCUDA_FAIL_RATE": "0.2"})
                self.assertGreater(did["refused"], 0)
                self.assertEqual(sum(d["stats"]["num_ooms"] for d in devices), did["refused"])

    def injected_failures_damage_nothing(self, runs, failures, counter, at_least):
        """Stress runs (seed, segment mode) with `failures` injected: the
        simulated runtime's `counter` of them passes `at_least`, and at most
        one allocation in twenty is refused."""
        for seed, expandable in runs:
            with self.subTest(seed=seed, expandable_segments=expandable):
                run, did, _ = self.stress_with(seed, expandable, failures)
                self.assertGreater(run.counters()[counter], at_least)
                self.assertLess(did["refused"] * 20, did["allocations"])

    def test_random_event_failures_damage_nothing(self):
        # Three in ten of gpupool's event calls (create, record, wait) fail:
        # reuse that needed them waits or takes other memory, and every
        # pattern and count still holds.
        self.injected_failures_damage_nothing((("9", "1"), ("10", "0")), {"SIMCUDA_EVENT_FAIL_RATE": "0.3"},
                                              "event_failures", 100)

    def test_random_event_and_host_wait_failures_damage_nothing(self):
        # Three in ten of gpupool's host waits fail too (its fallback when an
        # event is refused): reuse that needed one takes other memory, and
        # every pattern and count still holds. (Seeds 9-11, both segment
        # modes: 73-119 host waits failed, 6-57 of about 3,000 refused.)
        self.injected_failures_damage_nothing(
            (("11", "1"), ("12", "0")), {"SIMCUDA_EVENT_FAIL_RATE": "0.3", "SIMCUDA_HOST_WAIT_FAIL_RATE": "0.3"},
            "host_wait_failures", 20)

    def test_random_event_query_failures_damage_nothing(self):
        # Three in ten of gpupool's event queries fail, saying nothing of
        # whether the event has completed: reuse that needed one waits for a
        # later barrier or takes other memory, and every pattern and count
        # still holds. (Seeds 13 and 14: 2,516-3,862 queries failed, 0-6 of
        # about 3,000 refused.)
        self.injected_failures_damage_nothing((("13", "1"), ("14", "0")), {"SIMCUDA_EVENT_QUERY_FAIL_RATE": "0.3"},
                                              "event_query_failures", 500)

    def test_without_ordering_the_stress_breaks_patterns(self):
        # The control: the program does catch a pool that reuses too early
        # (slower device work, a shorter run; under TSan the races this makes
        # on purpose go unreported).
        run = self.run_program(["test-stress", "3", "3", "100", "1"],
                               env=dict(self.ENV, GPUPOOL_DEBUG_UNSAFE_SKIP_ORDERING="1", SIMCUDA_OP_DELAY_US="1000",
                                        TSAN_OPTIONS="report_bugs=0"))
        self.assertNotEqual(run.code, 0)
        self.assertIn("lost its pattern", run.stderr)

    def test_the_stress_program_passes_without_gpupool(self):
        run = self.run_program(["test-stress", "3", "5", "200", "1"], env=self.ENV, preload=False)
        self.assertSucceeded(run)


if __name__ == "__main__":
    main()
