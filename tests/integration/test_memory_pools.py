"""The runtime's memory pools as gpupool answers for them: trimming and
figures of the default pool, a device without pools, a pool of the
program's own made current."""
import itertools
import os

from harness import ShimTest, main


class Trim(ShimTest):
    def test_trimming_the_default_pool_gives_back_gpupools_idle_memory(self):
        # 64 MiB freed into a thread's cache, then cudaMemPoolTrimTo(default pool, KEEP).
        for expandable in ("1", "0"):
            with self.subTest(expandable_segments=expandable):
                env = {"GPUPOOL_EXPANDABLE_SEGMENTS": expandable}
                held = {}
                for keep in (None, "0", str(1 << 30)):
                    run = self.run_program(["test-lifecycle", "trim"] + ([keep] if keep else []), env=env)
                    self.assertSucceeded(run)
                    held[keep] = run.counters()["bytes_in_use"]
                    device = run.report()["devices"]["0"]
                    self.assertEqual(device["thread_cache_kept_peak_bytes"], 64 << 20)  # they were in the cache
                    self.assertEqual(device["stats"]["reserved_bytes.all.current"], held[keep])
                    for path in run.reports():
                        os.remove(path)
                self.assertGreaterEqual(held[None], 64 << 20)
                self.assertLessEqual(held["0"], 2 << 20)  # the page of the block allocated after the trim
                # Reserving less than KEEP: nothing given back. (Not compared with
                # the untrimmed run's figure: how many 2 MiB segments the warm-up
                # and the last block take varies with timing.)
                self.assertGreaterEqual(held[str(1 << 30)], 64 << 20)


class MemoryPoolFigures(ShimTest):
    # test-meminfo pool reads its default pool's figures (cudaMemPoolGetAttribute)
    # while it holds 36 MiB of stream-ordered blocks, after freeing 26 MiB of
    # them, after resetting the high watermarks and after a trim, and checks
    # what any pool shows (the figures in use follow the program's blocks, a
    # reset watermark starts from what is held). The runtime's own pool passes
    # it alone; under gpupool, whose pool serves those blocks, only if its
    # figures are added.
    def test_alone_and_with_gpupool_disabled_the_runtimes_pool_passes(self):
        self.assertSucceeded(self.run_program(["test-meminfo", "pool"], preload=False))
        self.assertSucceeded(self.run_program(["test-meminfo", "pool"], env={"GPUPOOL_DISABLE": "1"}))

    def test_gpupools_figures_follow_the_program_and_its_trims(self):
        for expandable in ("1", "0"):
            for threads in ([], ["threads"]):
                with self.subTest(expandable_segments=expandable, threads=threads):
                    run = self.run_program(["test-meminfo", "pool"] + threads,
                                           env={"GPUPOOL_EXPANDABLE_SEGMENTS": expandable})
                    self.assertSucceeded(run)
                    figures = run.output_json()
                    # What gpupool holds for reuse stays reserved until the trim.
                    self.assertEqual(figures["freed"]["reserved"], figures["held"]["reserved"])
                    self.assertLess(figures["trimmed"]["reserved"], figures["freed"]["reserved"])
                    # The pool's figures are the report's.
                    stats = run.report()["devices"]["0"]["stats"]
                    self.assertEqual(stats["reserved_bytes.all.current"], figures["end"]["reserved"])
                    self.assertEqual(stats["allocated_bytes.all.current"], figures["end"]["used"])
                    if threads:  # the 26 MiB freed were kept in the thread's cache, not in use
                        self.assertEqual(run.report()["devices"]["0"]["thread_cache_kept_peak_bytes"], 26 << 20)
                    for path in run.reports():
                        os.remove(path)


class PoollessDevice(ShimTest):
    # test-meminfo poolless-neighbour uses device 1, a GPU without memory pools,
    # then reads device 0's pool figures: gpupool asks each device it serves
    # for its default pool, which fails on device 1. That failure is gpupool's:
    # the program's next cudaGetLastError must not see it, and must still see
    # an error the program left pending.
    def test_gpupools_failed_pool_lookup_is_not_the_programs_error(self):
        env = {"SIMCUDA_DEVICES": "2", "SIMCUDA_POOLLESS_DEVICE": "1"}
        self.assertSucceeded(self.run_program(["test-meminfo", "poolless-neighbour"], env=env, preload=False))
        self.assertSucceeded(self.run_program(["test-meminfo", "poolless-neighbour"], env=env))


class OwnMemoryPool(ShimTest):
    # test-meminfo own-pool makes a pool of its own device 0's current pool and
    # allocates 4 blocks of 4 MiB with cudaMallocAsync: they must come from that
    # pool (the program may have given it IPC export, peer access or another
    # location), as its figures show; one with each pool named in
    # cudaMallocFromPoolAsync; then one block with the default pool current
    # again, and one after another pool was made current and destroyed.
    def test_its_blocks_come_from_its_pool_and_the_default_pools_from_gpupool(self):
        # Through the legacy entry points, and the per-thread default stream's
        # (cudaMallocAsync_ptsz, cudaMallocFromPoolAsync_ptsz, ...); each pool
        # made current with cudaDeviceSetMemPool, or with CUDA 13's
        # cudaMemSetMemPool naming the device's pinned memory.
        for program, how in itertools.product(("test-meminfo", "test-meminfo-ptds"), ([], ["by-location"])):
            with self.subTest(program=program, how=how):
                self.remove_reports()
                alone = self.run_program([program, "own-pool"] + how, preload=False)
                self.assertSucceeded(alone)
                self.assertEqual(alone.counters()["malloc_async_calls"], 8)
                run = self.run_program([program, "own-pool"] + how)
                self.assertSucceeded(run)
                self.assertEqual(run.counters()["malloc_async_calls"], 5)
                self.assertEqual(run.report()["devices"]["0"]["stats"]["allocation.all.allocated"], 3)
                # At exit a line says what the report does not count.
                self.assertEqual(
                    run.stderr.count("4 cudaMallocAsync calls drew from memory pools this program made current"), 1,
                    run.stderr)


if __name__ == "__main__":
    main()
