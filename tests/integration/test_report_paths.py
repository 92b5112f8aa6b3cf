"""Where the report and gpupool's lines go: default and named paths, the
folders they name, pipes and descriptors that go away, and the report signal."""
import array
import fcntl
import glob
import json
import os
import termios
import threading
import time

from harness import ShimTest, check_books, main, program


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


if __name__ == "__main__":
    main()
