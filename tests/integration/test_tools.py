"""Traces: GPUPOOL_TRACE records them, gpupool-import-snapshot converts PyTorch
snapshots to them, gpupool-replay replays them."""
import csv
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time

from harness import BUILD, SOURCE, ShimTest, clean_environment, main, sanitizer_runtime

REPLAY = os.path.join(BUILD, "bin", "gpupool-replay")
IMPORT = os.path.join(SOURCE, "scripts", "gpupool-import-snapshot")


def read_csv(path):
    with open(path) as f:
        return list(csv.reader(f))


class Recording(ShimTest):
    def trace(self, args, env=None):
        path = os.path.join(self.workdir, "trace-%p.csv")
        run = self.run_program(args, env=dict(env or {}, GPUPOOL_TRACE=path))
        traces = [p for p in os.listdir(self.workdir) if p.startswith("trace-")]
        self.assertEqual(len(traces), 1, os.listdir(self.workdir))
        return run, os.path.join(self.workdir, traces[0])

    def test_every_allocation_and_free_is_recorded_and_replays(self):
        run, path = self.trace(["test-repeat", "20"])
        self.assertSucceeded(run)
        rows = read_csv(path)
        self.assertEqual(rows[0], ["Thread", "Time", "Action", "Pointer", "Size", "Stream"])
        did = run.output_json()
        self.assertEqual(run.report()["trace_problems"], [])
        self.assertEqual(sum(r[2] == "allocate" for r in rows[1:]), did["allocations"])
        self.assertEqual(sum(r[2] == "free" for r in rows[1:]), did["allocations"])
        for row in rows[1:]:
            self.assertEqual(len(row), 6, row)
            self.assertRegex(row[0], r"^\d+$")
            self.assertRegex(row[1], r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{6}$")
            self.assertRegex(row[3], r"^0x[0-9a-f]+$")
            self.assertRegex(row[4], r"^[1-9]\d*$")
            self.assertEqual(row[5], "0x0", row)  # cudaMalloc and cudaFree name no stream: RMM writes 0
        # Local time of day, as RMM writes it.
        hours, minutes, seconds = rows[-1][1].split(":")
        now = time.localtime()
        recorded = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        apart = abs(now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec - recorded)
        self.assertLess(min(apart, 86400 - apart), 120)
        replayed = subprocess.run([REPLAY, "--json", path], capture_output=True, text=True, check=True)
        result = json.loads(replayed.stdout)
        self.assertEqual(result["allocations"], did["allocations"])
        self.assertEqual(result["peak_live_bytes"], did["peak_requested"])
        self.assertEqual(result["unknown_frees"], 0)

    def test_threads_record_whole_lines(self):
        run, path = self.trace(["test-threads", "3", "200"])
        self.assertSucceeded(run)
        rows = read_csv(path)
        self.assertTrue(all(len(r) == 6 for r in rows))
        self.assertEqual(sum(r[2] == "allocate" for r in rows[1:]), 600)
        self.assertEqual(sum(r[2] == "free" for r in rows[1:]), 600)
        self.assertGreaterEqual(len({r[0] for r in rows[1:]}), 3)  # thread ids

    def test_threads_record_a_history_in_order(self):
        # A free recorded after its block went back to the pool could follow
        # another thread's allocation of the same block.
        run, path = self.trace(["test-threads", "4", "3000"])
        self.assertSucceeded(run)
        self.assertHistory(path)

    def assertHistory(self, path):
        """Read in file order, the trace could have happened: a pointer is freed
        only while live and handed out only while not; nothing is left live."""
        live = set()
        for number, row in enumerate(read_csv(path)[1:], start=2):
            if row[2] == "allocate":
                self.assertNotIn(row[3], live, f"line {number}: {row} while that pointer is live")
                live.add(row[3])
            elif row[2] == "free":
                self.assertIn(row[3], live, f"line {number}: {row} of a pointer not live")
                live.remove(row[3])
        self.assertEqual(live, set())

    def test_a_device_reset_frees_what_the_program_held_in_the_trace(self):
        # test-lifecycle reset leaves a 2 MiB block to cudaDeviceReset and
        # frees all else: the trace frees it at the reset, so that what comes
        # after (which may reuse its address) follows a history.
        run, path = self.trace(["test-lifecycle", "reset"])
        self.assertSucceeded(run)
        self.assertHistory(path)

    def test_a_reset_does_not_free_again_a_block_freed_on_another_devices_stream(self):
        # The block was traced freed at its cudaFreeAsync on device 1's stream;
        # it still waits in device 0's pool when device 0 is reset.
        run, path = self.trace(["test-devices", "owner-reset"], env={"SIMCUDA_DEVICES": "2"})
        self.assertSucceeded(run)
        self.assertNotIn("nothing checked", run.stdout)
        self.assertHistory(path)

    def test_frees_alone_reach_the_file_as_they_fill_the_buffer(self):
        # A free is recorded under the pool's lock, which must not wait for
        # the file: the buffer it fills is written after the lock goes. Frees
        # in a row must not pile up in memory until the next allocation.
        path = os.path.join(self.workdir, "trace.csv")
        run = self.run_program(["test-lifecycle", "trace-written", "60000"], env={"GPUPOOL_TRACE": path})
        self.assertSucceeded(run)
        with open(path) as f:
            text = f.read()
        frees = sum(len(line) + 1 for line in text.splitlines() if ",free," in line)
        self.assertGreater(frees, 2 << 20)  # more than the 1 MiB buffer holds, twice over
        unwritten = len(text) - run.output_json()["written"]
        self.assertGreaterEqual(unwritten, 0)
        self.assertLess(unwritten, (1 << 20) + 160)  # at most one buffer and a line

    def test_trace_times_follow_the_clock(self):
        # 1.1 s between the last allocation and the first free: the time of
        # day is kept per thread between lines, and must move on.
        path = os.path.join(self.workdir, "trace.csv")
        run = self.run_program(["test-lifecycle", "trace-written", "50", "1100"], env={"GPUPOOL_TRACE": path})
        self.assertSucceeded(run)
        rows = read_csv(path)[1:]

        def seconds(row):
            hours, minutes, rest = row[1].split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(rest)

        last_allocation = seconds(rows[49])
        first_free = seconds(rows[50])
        self.assertEqual((rows[49][2], rows[50][2]), ("allocate", "free"))
        apart = (first_free - last_allocation) % 86400  # across midnight too
        self.assertGreaterEqual(apart, 1.1)
        self.assertLess(apart, 1.6)
        times = [seconds(r) for r in rows]
        self.assertTrue(all(0 <= (b - a) % 86400 < 2 for a, b in zip(times, times[1:])), times)

    def trace_into_fifo(self, args, read):
        """Runs the program with GPUPOOL_TRACE naming a FIFO that read(file)
        reads from another thread; returns the run and the FIFO's path."""
        fifo = os.path.join(self.workdir, "trace.fifo")
        os.mkfifo(fifo)
        opened = threading.Event()

        def reader_side():
            with open(fifo, "rb", buffering=0) as f:
                opened.set()
                read(f)

        reader = threading.Thread(target=reader_side)
        reader.start()
        try:
            run = self.run_program(args, env={"GPUPOOL_TRACE": fifo})
        finally:
            if not opened.is_set():
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # never opened: let the reader go
            reader.join(timeout=60)
        return run, fifo

    def test_a_trace_to_a_pipe_loses_no_line_to_signals(self):
        # A slow reader keeps gpupool's writes blocked on the pipe while the
        # program's own signal handler (no SA_RESTART) interrupts them.
        received = []

        def drain(f):
            while chunk := f.read(1 << 16):
                received.append(chunk)
                time.sleep(0.001)

        run, _ = self.trace_into_fifo(["test-lifecycle", "trace-interrupted", "40000"], drain)
        self.assertSucceeded(run)
        self.assertGreater(run.output_json()["signals"], 10)
        lines = b"".join(received).decode().splitlines()
        self.assertEqual(lines[0], "Thread,Time,Action,Pointer,Size,Stream")
        rows = list(csv.reader(lines[1:]))
        self.assertTrue(all(len(r) == 6 for r in rows))
        self.assertEqual(sum(r[2] == "allocate" for r in rows), 40000)
        self.assertEqual(sum(r[2] == "free" for r in rows), 40000)

    def test_a_trace_reader_that_goes_away_ends_the_trace_not_the_program(self):
        # The reader closes the pipe after its first read: gpupool's next
        # write raises SIGPIPE, which would end the program.
        first = []
        run, fifo = self.trace_into_fifo(["test-lifecycle", "trace-written", "60000"],
                                         lambda f: first.append(f.read(1 << 16)))
        self.assertSucceeded(run)
        self.assertTrue(first[0].startswith(b"Thread,Time,Action,Pointer,Size,Stream\n"))
        self.assertEqual(run.stderr.count(f"GPUPOOL_TRACE: cannot write '{fifo}' (Broken pipe); "
                                          "the rest of the trace is lost"), 1, run.stderr)
        self.assertEqual(run.report()["trace_problems"],
                         [f"gpupool: GPUPOOL_TRACE: cannot write '{fifo}' (Broken pipe); the rest of the trace is lost"])

    def test_failures_are_recorded(self):
        run, path = self.trace(["test-oom", "full"], env={"SIMCUDA_MEMORY": "64M"})
        self.assertSucceeded(run)
        self.assertEqual(sum(r[2] == "allocate failure" for r in read_csv(path)[1:]), 1)


    def test_a_process_driving_two_devices_gets_a_trace_per_device(self):
        # The CSV layout has no device column and a trace replays as one
        # device: %d in the path gives each device its own file.
        env = {"SIMCUDA_DEVICES": "2", "GPUPOOL_TRACE": os.path.join(self.workdir, "trace-%p-dev%d.csv")}
        run = self.run_program(["test-devices", "threads", "20"], env=env)
        self.assertSucceeded(run)
        traces = sorted(p for p in os.listdir(self.workdir) if p.startswith("trace-"))
        self.assertEqual([t[-9:] for t in traces], ["-dev0.csv", "-dev1.csv"], traces)
        devices = run.report()["devices"]
        pointers = []
        for device, name in enumerate(traces):
            path = os.path.join(self.workdir, name)
            rows = read_csv(path)[1:]
            allocations = sum(r[2] == "allocate" for r in rows)
            self.assertEqual(allocations, devices[str(device)]["stats"]["allocation.all.allocated"])
            pointers.append({r[3] for r in rows})
            replayed = subprocess.run([REPLAY, "--json", path], capture_output=True, text=True, check=True)
            self.assertEqual(json.loads(replayed.stdout)["unknown_frees"], 0)
        self.assertFalse(pointers[0] & pointers[1])  # each device's blocks in its own file
        self.assertNotIn("mixes", run.stderr)

    def test_a_device_trace_that_cannot_be_written_is_said_once_and_the_program_runs_on(self):
        blocker = os.path.join(self.workdir, "a-file")  # where the folder should be
        with open(blocker, "w") as f:
            f.write("not a folder\n")
        env = {"SIMCUDA_DEVICES": "2", "GPUPOOL_TRACE": os.path.join(blocker, "t-%d.csv")}
        run = self.run_program(["test-devices", "threads", "5"], env=env)
        self.assertSucceeded(run)
        for device in (0, 1):
            self.assertEqual(run.stderr.count(f"t-{device}.csv'; device {device} not traced"), 1, run.stderr)
        # The report says so too, in the same words.
        told = [line for line in run.stderr.splitlines() if "GPUPOOL_TRACE" in line]
        self.assertEqual(sorted(run.report()["trace_problems"]), sorted(told))

    def test_one_trace_of_two_devices_says_it_mixes_them(self):
        run, path = self.trace(["test-devices", "threads", "5"], env={"SIMCUDA_DEVICES": "2"})
        self.assertSucceeded(run)
        self.assertIn("mixes 2 devices", run.stderr)
        self.assertIn("put %d in the path", run.stderr)
        told = [line for line in run.stderr.splitlines() if "GPUPOOL_TRACE" in line]
        self.assertEqual(len(told), 1, run.stderr)
        self.assertEqual(run.report()["trace_problems"], told)


class Replay(ShimTest):
    def write(self, name, text):
        path = os.path.join(self.workdir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def replay(self, *args):
        return subprocess.run([REPLAY] + list(args), capture_output=True, text=True)

    def test_malformed_lines_are_named_by_number(self):
        path = self.write("bad.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,512,0x0\n"
                          "1,00:00:00.000001,allocate,0x2000,lots,0x0\n")
        out = self.replay(path)
        self.assertEqual(out.returncode, 1)
        self.assertIn("bad.csv:3: bad size", out.stderr)
        self.assertIn("lots", out.stderr)
        for line, error in (("1,00:00:00.000001,allocate,0x2000,512,0x0,extra", "expected 6 fields"),
                            ("1,00:00:00.000001,allocate,0x2000,512", "expected 6 fields"),
                            ("1,00:00:00.000001,malloc,0x2000,512,0x0", "unknown action 'malloc'"),
                            ("1,00:00:00.00000x,allocate,0x2000,512,0x0", "bad time"),
                            ("1,0:00:00.000001,allocate,0x2000,512,0x0", "bad time"),
                            ("1,00:00:00.000001,allocate,0x20g0,512,0x0", "bad pointer"),
                            ("1,00:00:00.000001,allocate,0x,512,0x0", "bad pointer"),
                            ("1,00:00:00.000001,allocate,0x2000,-512,0x0", "bad size"),
                            ("1,00:00:00.000001,allocate,0x2000,512,stream", "bad stream")):
            with self.subTest(line=line):
                path = self.write("bad.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                                  "1,00:00:00.000000,allocate,0x1000,512,0x0\n" + line + "\n")
                out = self.replay(path)
                self.assertEqual(out.returncode, 1)
                self.assertIn(f"bad.csv:3: {error}", out.stderr)

    def test_a_trace_cut_partway_through_its_last_line_replays_the_lines_before_it(self):
        # A writer stopped partway leaves no newline after its last bytes. Cut
        # at each byte of a line: the events before it replay, the cut line is
        # named. The same line whole is replayed (and named when it has no
        # newline); a malformed line anywhere else is an error.
        whole = ("Thread,Time,Action,Pointer,Size,Stream\n"
                 "1,00:00:00.000000,allocate,0x1000,512,0x7\n"
                 "1,00:00:00.000001,free,0x1000,512,0x7\n")
        last = "1,00:00:00.000002,allocate,0x2000,4096,0x7"
        # Cut inside the stream's digits ("0x7" of "0x7f"), the line still
        # reads whole: it is replayed, and the replay says so.
        out = self.replay("--json", self.write("digits.csv", whole + last))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout)["allocations"], 2)
        self.assertIn("digits.csv:4: the trace's last line has no newline; replayed as read", out.stderr)
        for cut in range(1, len(last) - 2):
            with self.subTest(cut=cut):
                path = self.write("cut.csv", whole + last[:cut])
                out = self.replay("--json", path)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(json.loads(out.stdout)["allocations"], 1)
                self.assertIn("cut.csv:4: the trace ends partway through this line", out.stderr)
                self.assertIn("replaying the 2 events before it", out.stderr)
        out = self.replay("--json", self.write("whole.csv", whole + last + "\n"))
        self.assertEqual((out.returncode, out.stderr), (0, ""))
        self.assertEqual(json.loads(out.stdout)["allocations"], 2)
        # Cut short, but not the last line: an error as any other.
        out = self.replay(self.write("mid.csv", whole + last[:20] + "\n" + last + "\n"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("mid.csv:4: expected 6 fields", out.stderr)
        # A file of one line without its newline is more likely no trace at all.
        out = self.replay(self.write("one.csv", "not a trace"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("one.csv:1: expected 6 fields", out.stderr)

    def test_a_trace_without_allocations_is_an_error(self):
        # Nothing to measure: a table of zeros and a recommendation would mislead.
        for name, text in (("empty.csv", ""), ("header.csv", "Thread,Time,Action,Pointer,Size,Stream\n"),
                           ("failures.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                                            "1,00:00:00.000000,allocate failure,0x0,1099511627776,0x0\n")):
            with self.subTest(name=name):
                out = self.replay("--tune", self.write(name, text))
                self.assertEqual(out.returncode, 1)
                self.assertIn(f"{name}: no allocation to replay", out.stderr)
                self.assertEqual(out.stdout, "")

    def test_unknown_frees_are_counted_and_skipped(self):
        path = self.write("t.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,4096,0x0\n"
                          "1,00:00:00.000001,free,0x9999,4096,0x0\n"
                          "1,00:00:00.000002,allocate failure,0x0,1099511627776,0x0\n"
                          "1,00:00:00.000003,free,0x1000,4096,0x0\n")
        out = self.replay("--json", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        self.assertEqual((r["allocations"], r["frees"], r["unknown_frees"]), (1, 1, 1))
        self.assertEqual((r["trace_allocation_failures"], r["ooms"]), (1, 0))  # counted, not replayed

    def test_an_allocation_of_a_pointer_still_live_frees_the_earlier_block_first(self):
        # The trace lost a free: the address was free again when the second
        # allocation got it. Both blocks live at once would make a peak the
        # run never had, and the earlier block would never be freed.
        path = self.write("l.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,4096,0x0\n"
                          "1,00:00:00.000001,allocate,0x1000,8192,0x0\n"
                          "1,00:00:00.000002,free,0x1000,8192,0x0\n")
        r = json.loads(self.replay("--json", "--passes", "2", path).stdout)
        self.assertEqual((r["allocations"], r["frees"], r["unknown_frees"], r["lost_frees"]), (4, 2, 0, 2))
        self.assertEqual(r["peak_live_bytes"], 8192)
        self.assertIn("(1 allocation of a pointer still live", self.replay(path).stdout)
        self.assertIn("(2 allocations of pointers still live", self.replay("--passes", "2", path).stdout)

    def test_the_free_of_an_allocation_that_failed_in_the_replay_is_no_unknown_free(self):
        # --capacity 64M: the 100 MiB request fails (the trace's did not), and
        # its free is of a pointer the trace did allocate.
        path = self.write("c.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,104857600,0x0\n"
                          "1,00:00:00.000001,allocate,0x8000000,4096,0x0\n"
                          "1,00:00:00.000002,free,0x1000,104857600,0x0\n"
                          "1,00:00:00.000003,free,0x8000000,4096,0x0\n")
        r = json.loads(self.replay("--json", "--capacity", "64M", path).stdout)
        self.assertEqual((r["allocations"], r["ooms"], r["frees"], r["unknown_frees"]), (2, 1, 2, 0))
        table = self.replay("--capacity", "64M", path).stdout
        self.assertNotIn("never allocated", table)

    def test_streams_in_the_trace_are_honoured(self):
        # A block freed on one stream and a request on another: cross-stream
        # reuse (the default) serves it, "never" does not (fixed segments, so
        # that page recycling does not hand the memory over either).
        path = self.write("s.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,104857600,0x7000\n"
                          "1,00:00:00.000001,free,0x1000,104857600,0x7000\n"
                          "1,00:00:00.000002,allocate,0x2000,104857600,0x8000\n")
        fixed = ["--set", "expandable_segments=0"]
        shared = json.loads(self.replay("--json", *fixed, path).stdout)
        apart = json.loads(self.replay("--json", *fixed, "--set", "cross_stream_reuse=never", path).stdout)
        self.assertEqual(shared["peak_reserved_bytes"], 100 << 20)
        self.assertEqual(apart["peak_reserved_bytes"], 200 << 20)

    def test_plain_replay_orders_each_reuse_with_a_barrier(self):
        # Freed and taken again on one stream: stream order suffices. Replayed
        # as plain cudaFree/cudaMalloc, the reuse needs the device barrier.
        path = self.write("p.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,1048576,0x7000\n"
                          "1,00:00:00.000001,free,0x1000,1048576,0x7000\n"
                          "1,00:00:00.000002,allocate,0x2000,1048576,0x7000\n")
        ordered = json.loads(self.replay("--json", path).stdout)
        plain = json.loads(self.replay("--json", "--plain", path).stdout)
        self.assertEqual((ordered["plain"], ordered["barriers"], ordered["events_recorded"]), (False, 0, 0))
        self.assertEqual((plain["plain"], plain["barriers"], plain["events_recorded"]), (True, 1, 1))
        self.assertEqual(plain["peak_reserved_bytes"], ordered["peak_reserved_bytes"])

    def test_idle_streams_are_asked_by_every_barrier(self):
        # Plain pairs of one size: each reuse after the first is a barrier,
        # and each barrier asks every idle stream. The replay's device keeps
        # up, so the legacy stream's event, recorded first, has completed by
        # then: no stream is made to wait.
        path = self.write("i.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
            f"1,00:00:00.{i:06d},{'allocate' if i % 2 == 0 else 'free'},{0x1000 * (i // 2 + 1):#x},1048576,0x0\n"
            for i in range(40)))
        alone = json.loads(self.replay("--json", "--plain", path).stdout)
        beside = json.loads(self.replay("--json", "--plain", "--idle-streams", "32", path).stdout)
        self.assertGreater(alone["barriers"], 0)
        self.assertEqual((alone["stream_waits"], alone["stream_queries"]), (0, 0))
        self.assertEqual(beside["barriers"], alone["barriers"])
        self.assertEqual(beside["stream_waits"], 0)
        self.assertEqual(beside["stream_queries"], 32 * beside["barriers"])  # idle: no event recorded on them
        self.assertEqual(beside["events_recorded"], alone["events_recorded"])
        self.assertEqual(beside["event_queries"], alone["event_queries"] + beside["barriers"])
        self.assertEqual(beside["peak_reserved_bytes"], alone["peak_reserved_bytes"])
        self.assertEqual(self.replay("--idle-streams", "-1", path).returncode, 2)

    def test_a_sweep_weighs_ordering_calls_against_memory(self):
        # Fixed segments of 32 MiB and 256 MiB, both freed; then plain pairs of
        # 32 MiB. Each reuse of the just freed 32 MiB needs a new barrier;
        # plain_reuse_search takes the 256 MiB block's covered front instead,
        # every other pair. A 32 MiB block then held while 256 MiB are asked
        # for costs a new segment where it sits in the large one (an odd
        # number of pairs), and nothing where it is the small one (even).
        def trace(pairs):
            mib = 1 << 20
            events = [("allocate", 0x1000, 32), ("allocate", 0x2000, 256), ("free", 0x2000, 256),
                      ("free", 0x1000, 32)]
            events += [e for _ in range(pairs) for e in (("allocate", 0x3000, 32), ("free", 0x3000, 32))]
            events += [("allocate", 0x4000, 32), ("allocate", 0x5000, 256), ("free", 0x5000, 256),
                       ("free", 0x4000, 32)]
            return self.write(f"refit-{pairs}.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
                f"1,00:00:00.{i:06d},{a},{p:#x},{s * mib},0x0\n" for i, (a, p, s) in enumerate(events)))

        def sweep(path):
            out = self.replay("--plain", "--conf", "expandable_segments:0", "--sweep", "plain_reuse_search=0,16", path)
            self.assertEqual(out.returncode, 0, out.stderr)
            header = next(line for line in out.stdout.splitlines() if line.startswith("configuration "))
            self.assertEqual(header.split()[-2:], ["sync/alloc", "ns/op"])
            sync = {line.split()[0].split(":")[-1]: float(line.split()[-2]) for line in out.stdout.splitlines()
                    if line.startswith("expandable_segments:0,")}
            return out.stdout, sync

        out, sync = sweep(trace(41))
        self.assertLess(sync["16"] * 2, sync["0"] * 1.1, out)  # about half the calls
        self.assertIn("best for refit-41.csv: GPUPOOL_CONF=expandable_segments:0,plain_reuse_search:0\n", out)
        self.assertRegex(out, r"half the ordering calls or fewer: GPUPOOL_CONF=expandable_segments:0,"
                              r"plain_reuse_search:16 \(0\.\d\d per allocation against 0\.\d\d; 1\.8889\)")
        # The same memory either way: the fewer calls win.
        out, sync = sweep(trace(40))
        self.assertLess(sync["16"], sync["0"], out)
        self.assertIn("best for refit-40.csv: GPUPOOL_CONF=expandable_segments:0,plain_reuse_search:16\n", out)
        self.assertIn("recommended for this trace: GPUPOOL_CONF=expandable_segments:0,plain_reuse_search:16 ", out)
        self.assertNotIn("half the ordering calls", out)

    def test_sweep_recommends_a_setting(self):
        path = self.write("w.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
            f"1,00:00:00.{i:06d},{'allocate' if i % 2 == 0 else 'free'},{0x1000 * (i // 2 + 1):#x},"
            f"{(i // 2 % 7 + 1) * 3 << 20},0x0\n" for i in range(200)))
        out = self.replay("--passes", "2", "--sweep", "expandable_segments=0,1",
                          "--sweep", "max_split_size_mb=unlimited,64", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.count("expandable_segments:"), 4 + 2)  # 4 rows, best and recommended
        self.assertRegex(out.stdout, r"recommended for this trace: GPUPOOL_CONF=expandable_segments:\d,max_split_size_mb:\w+")
        # The split limit is ignored in expandable segments, and said so once.
        self.assertEqual(out.stderr.count("max_split_size_mb (64) applies to fixed segments only"), 1)
        rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()
                if line.startswith("expandable_segments:1,")}
        self.assertEqual(rows["expandable_segments:1,max_split_size_mb:64"],
                         rows["expandable_segments:1,max_split_size_mb:unlimited"][:-1] +
                         rows["expandable_segments:1,max_split_size_mb:64"][-1:])  # all but ns/op
        # The figures line up under their headings, however long the configurations.
        lines = out.stdout.splitlines()
        header = next(line for line in lines if line.startswith("configuration "))
        allocs_end = header.index("allocs") + len("allocs")
        for line in lines:
            if line.startswith("expandable_segments:"):
                self.assertRegex(line[:allocs_end + 1], r"\d $", (header, line))

    def test_a_sweep_ranks_settings_that_run_out_of_memory_last(self):
        # Refusing the 4 MiB request, the 2 MiB limit reserves nothing: the
        # lowest peak, and the worst setting.
        path = self.write("o.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                          "1,00:00:00.000000,allocate,0x1000,4194304,0x0\n"
                          "1,00:00:00.000001,free,0x1000,4194304,0x0\n")
        out = self.replay("--sweep", "memory_limit=2M,64M", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("memory_limit:")]
        self.assertEqual(rows, ["memory_limit:64M", "memory_limit:2M"])
        self.assertIn("best for o.csv: GPUPOOL_CONF=memory_limit:64M\n", out.stdout)
        self.assertIn("recommended for this trace: GPUPOOL_CONF=memory_limit:64M ", out.stdout)

    def test_tune_tries_each_segment_mode_with_its_own_settings_and_recommends_the_lowest(self):
        # Sizes from 0.5 to 18.5 MiB; after every second allocation the one before it is freed.
        lines, live = [], []
        for i in range(400):
            lines.append(f"1,00:00:00.{i:06d},allocate,{0x1000 * (i + 1):#x},{(i * 7919 % 37 + 1) << 19},0x0")
            live.append(0x1000 * (i + 1))
            if i % 2 == 1:
                lines.append(f"1,00:00:00.{i:06d},free,{live.pop(-2):#x},0,0x0")
        path = self.write("w.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "\n".join(lines) + "\n")
        out = self.replay("--passes", "3", "--tune", "--json", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        self.assertEqual(len(rows), 10)
        for r in rows:
            self.assertEqual((r["allocations"], r["frees"], r["unknown_frees"]), (1200, 600, 0))
            conf = dict(kv.split(":", 1) for kv in r["conf"].split(","))
            fixed = conf["expandable_segments"] == "0"
            self.assertEqual("max_split_size_mb" in conf, fixed, r["conf"])
            self.assertEqual("recycle_pages" in conf, not fixed, r["conf"])
            self.assertEqual(r["upstream_mallocs"] > 0, fixed, r["conf"])
            self.assertEqual(r["page_maps"] > 0, not fixed, r["conf"])
        table = self.replay("--passes", "3", "--tune", path)
        self.assertEqual(table.returncode, 0, table.stderr)
        lowest = min(rows, key=lambda r: r["peak_reserved_bytes"])
        recommended = re.search(r"recommended for this trace: GPUPOOL_CONF=(\S+)", table.stdout).group(1)
        best = next(r for r in rows if r["conf"] == recommended)
        self.assertEqual(best["peak_reserved_bytes"], lowest["peak_reserved_bytes"])
        # On this trace the lowest peak comes from recycling every idle page, which goes on
        # remapping past the first pass: the other end of the trade is named.
        def churn_ms(r):
            return r["last_pass_page_maps"] * 0.5 + r["last_pass_page_unmaps"] * 0.3
        self.assertGreater(churn_ms(best), 0)
        self.assertIn("past the first pass it keeps remapping pages", table.stdout)
        calm = [r for r in rows if churn_ms(r) < churn_ms(best) and churn_ms(r) <= max(1.0, churn_ms(best) / 10)]
        calmest = min(calm, key=lambda r: r["peak_reserved_bytes"])
        named = re.search(r"  remapping a tenth as much or less: GPUPOOL_CONF=(\S+)  \(mean", table.stdout).group(1)
        self.assertEqual(next(r for r in rows if r["conf"] == named)["peak_reserved_bytes"],
                         calmest["peak_reserved_bytes"])
        # One pass has no "past the first pass".
        single = [json.loads(line) for line in self.replay("--tune", "--json", path).stdout.splitlines()]
        self.assertTrue(all(r["last_pass_page_maps"] == r["last_pass_page_unmaps"] == 0 for r in single))
        self.assertNotIn("past the first pass", self.replay("--tune", path).stdout)

    def test_tune_keeps_the_settings_given_with_set(self):
        # Under a 24 MiB limit, each tuned configuration of a trace that holds 48 MiB
        # at once runs out of memory; without the limit none would.
        lines = [f"1,00:00:00.000000,allocate,{0x1000 * (i + 1):#x},{4 << 20},0x0" for i in range(12)]
        lines += [f"1,00:00:00.000000,free,{0x1000 * (i + 1):#x},0,0x0" for i in range(12)]
        path = self.write("s.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "\n".join(lines) + "\n")
        rows = [json.loads(line) for line in
                self.replay("--tune", "--json", "--set", "memory_limit=24M", path).stdout.splitlines()]
        self.assertEqual(len(rows), 10)
        for r in rows:
            self.assertTrue(r["conf"].startswith("memory_limit:24M,"), r["conf"])
            self.assertGreater(r["ooms"], 0, r["conf"])
            self.assertLessEqual(r["peak_reserved_bytes"], 24 << 20, r["conf"])

    def test_a_last_pass_that_calls_cudamalloc_is_costed_too(self):
        # 40 blocks of 2 MiB, then one of 90 MiB that no split may serve, under a
        # 100 MiB limit: fixed segments give their cache back and take it again
        # every pass.
        lines = [f"1,00:00:00.000000,allocate,{0x1000 * (i + 1):#x},{2 << 20},0x0" for i in range(40)]
        lines += [f"1,00:00:00.000000,free,{0x1000 * (i + 1):#x},0,0x0" for i in range(40)]
        lines += ["1,00:00:00.000000,allocate,0x900000,94371840,0x0", "1,00:00:00.000000,free,0x900000,0,0x0"]
        path = self.write("c.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "\n".join(lines) + "\n")
        table = self.replay("--passes", "3", "--set", "expandable_segments=0", "--set", "max_split_size_mb=64",
                            "--sweep", "memory_limit=100M,400M", path)
        self.assertEqual(table.returncode, 0, table.stderr)
        said = re.search(r"about (\d+\.\d) ms per pass on an H200\), and makes (\d+) cudaMalloc and (\d+) cudaFree",
                         table.stdout)
        self.assertIsNotNone(said, table.stdout)
        ms, mallocs, frees = float(said.group(1)), int(said.group(2)), int(said.group(3))
        self.assertGreater(mallocs, 0)
        self.assertAlmostEqual(ms, 0.045 * (mallocs + frees), delta=0.051)
        # The limit that lets the cache stay is the other end of the trade.
        self.assertRegex(table.stdout, r"remapping a tenth as much or less: GPUPOOL_CONF=\S*memory_limit:400M \(")

    def test_bad_settings_are_refused(self):
        path = self.write("t.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,allocate,0x1000,512,0x0\n")
        out = self.replay("--set", "max_split_size_mb=tiny", path)
        self.assertEqual(out.returncode, 2)
        self.assertIn("GPUPOOL_CONF:max_split_size_mb", out.stderr)


class Snapshot(ShimTest):
    def snapshot(self, data):
        path = os.path.join(self.workdir, "snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(data, f)
        return path

    def test_a_snapshot_becomes_a_trace_with_earlier_blocks_allocated_first(self):
        events = [
            {"action": "segment_alloc", "addr": 0x7000, "size": 2 << 20, "stream": 0, "time_us": 100},
            {"action": "alloc", "addr": 0x7000, "size": 4096, "stream": 0, "time_us": 110, "frames": []},
            {"action": "free_requested", "addr": 0x9000, "size": 8192, "stream": 0, "time_us": 120},
            {"action": "free_completed", "addr": 0x9000, "size": 8192, "stream": 0, "time_us": 120},
            {"action": "free_requested", "addr": 0x7000, "size": 4096, "stream": 0, "time_us": 2_000_130},
            {"action": "free_completed", "addr": 0x7000, "size": 4096, "stream": 0, "time_us": 2_000_130},
            {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": 2_000_200},
        ]
        path = self.snapshot({"segments": [], "device_traces": [events]})
        out = os.path.join(self.workdir, "trace.csv")
        done = subprocess.run([sys.executable, IMPORT, path, "-o", out], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        rows = read_csv(out)
        self.assertEqual(rows[1][2:5], ["allocate", "0x9000", "8192"])  # live before recording
        self.assertEqual(rows[1][1], "00:00:00.000000")
        self.assertEqual([r[2] for r in rows[2:]], ["allocate", "free", "free", "allocate failure"])
        self.assertEqual(rows[4][1], "00:00:02.000030")
        replayed = subprocess.run([REPLAY, "--json", out], capture_output=True, text=True)
        self.assertEqual(json.loads(replayed.stdout)["unknown_frees"], 0)

    def test_blocks_held_since_before_recording_are_allocated_first(self):
        # Weights allocated before _record_memory_history() and never freed
        # appear only in the snapshot's segments: 0xa000 and 0xe000 (its
        # address from the sizes of the blocks before it). 0xb000 was allocated
        # in the trace, and 0xd000's free was asked for but has not completed.
        events = [
            {"action": "alloc", "addr": 0xb000, "size": 4096, "stream": 0, "time_us": 10},
            {"action": "alloc", "addr": 0xc000, "size": 4096, "stream": 0, "time_us": 11},
            {"action": "free_requested", "addr": 0xc000, "size": 4096, "stream": 0, "time_us": 12},
            {"action": "free_completed", "addr": 0xc000, "size": 4096, "stream": 0, "time_us": 12},
        ]
        blocks = [{"address": 0xa000, "size": 4096, "requested_size": 4000, "state": "active_allocated"},
                  {"address": 0xb000, "size": 4096, "requested_size": 4096, "state": "active_allocated"},
                  {"size": 4096, "requested_size": 4096, "state": "inactive"},
                  {"size": 4096, "requested_size": 4096, "state": "active_pending_free"},
                  {"size": 8192, "requested_size": 8192, "state": "active_allocated"}]
        other_device = {"device": 1, "address": 0x100000, "total_size": 4096, "stream": 0,
                        "blocks": [{"size": 4096, "state": "active_allocated"}]}
        path = self.snapshot({"segments": [{"device": 0, "address": 0xa000, "total_size": 5 * 4096, "stream": 0,
                                            "blocks": blocks}, other_device],
                              "device_traces": [events, []]})
        out = os.path.join(self.workdir, "trace.csv")
        done = subprocess.run([sys.executable, IMPORT, path, "-o", out], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        rows = read_csv(out)[1:]
        head = [(r[2], r[3], r[4]) for r in rows if r[1] == "00:00:00.000000" and r[3] not in ("0xb000", "0xc000")]
        self.assertEqual(head, [("allocate", "0xa000", "4096"), ("allocate", "0xd000", "4096"),
                                ("allocate", "0xe000", "8192")])
        self.assertEqual(sum(r[3] == "0xb000" for r in rows), 1)  # not allocated twice
        replayed = json.loads(subprocess.run([REPLAY, "--json", out], capture_output=True, text=True).stdout)
        self.assertEqual(replayed["peak_live_bytes"], 4 * 4096 + 8192)

    def test_a_malicious_pickle_is_rejected_before_it_runs(self):
        marker = os.path.join(self.workdir, "pwned")

        class Exploit:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        path = self.snapshot({"device_traces": [[{"action": "alloc", "payload": Exploit()}]]})
        done = subprocess.run([sys.executable, IMPORT, path], capture_output=True, text=True)
        self.assertEqual(done.returncode, 1)
        self.assertIn("refused to load", done.stderr)
        self.assertFalse(os.path.exists(marker))

    def test_a_pickle_that_is_not_a_snapshot_is_named_so(self):
        path = self.snapshot([1, 2, 3])
        done = subprocess.run([sys.executable, IMPORT, path], capture_output=True, text=True)
        self.assertEqual(done.returncode, 1)
        self.assertIn("not a PyTorch memory snapshot", done.stderr)


class Install(ShimTest):
    def test_an_installed_prefix_works_on_its_own(self):
        prefix = os.path.join(self.workdir, "prefix")
        subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True, capture_output=True)
        gpupool = os.path.join(prefix, "bin", "gpupool")
        config = subprocess.run([sys.executable, gpupool, "config"], capture_output=True, text=True)
        self.assertEqual(config.returncode, 0, config.stderr)
        self.assertIn("GPUPOOL_EXPANDABLE_SEGMENTS", config.stdout)
        env = dict(os.environ)
        if sanitizer_runtime():  # the python running the command is not ours to check for leaks
            env.update(LD_PRELOAD=sanitizer_runtime(), ASAN_OPTIONS="detect_leaks=0")
        run = subprocess.run([sys.executable, gpupool, "run", "--sim", "--", os.path.join(BUILD, "bin", "test-repeat"), "3"],
                             capture_output=True, text=True, env=env)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(os.path.join(prefix, "lib", "gpupool", "sim"), run.stderr)
        self.assertIn("for 30 allocations", run.stdout)
        for doc in ("README.md", "report.schema.json"):
            self.assertTrue(os.path.exists(os.path.join(prefix, "share", "doc", "gpupool", doc)))

    def test_the_debian_package_holds_the_command_and_the_library(self):
        done = subprocess.run(["cpack", "-G", "DEB", "-B", self.workdir], cwd=BUILD, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        debs = [p for p in os.listdir(self.workdir) if p.endswith(".deb")]
        self.assertEqual(len(debs), 1)
        listing = subprocess.run(["dpkg-deb", "-c", os.path.join(self.workdir, debs[0])], capture_output=True,
                                 text=True, check=True).stdout
        for path in ("./usr/bin/gpupool", "./usr/bin/gpupool-replay", "./usr/lib/gpupool/libgpupool.so",
                     "./usr/lib/gpupool/libgpupool-core.so",
                     "./usr/lib/gpupool/sim/libcudart.so.13"):
            self.assertIn(path, listing)


class GpuPack(ShimTest):
    """scripts/gpu-pack: what a GPU lease carries, so that nothing is built there."""

    def pack(self, build):
        folder = os.path.join(self.workdir, "pack")
        done = subprocess.run([os.path.join(SOURCE, "scripts", "gpu-pack"), folder], capture_output=True, text=True,
                              env=dict(os.environ, BUILD_DIR=os.path.abspath(build), TRACES_DIR=self.workdir))
        return done, folder

    def test_the_pack_holds_every_program_the_gpu_scripts_run_within_the_carry_limit(self):
        done, folder = self.pack(BUILD)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(os.path.join(SOURCE, "scripts", "gpu-check.sh")) as f:
            programs = set(re.findall(r"build/bin/([A-Za-z0-9_-]+)", f.read()))
        self.assertIn("test-capture", programs)
        for program in programs | {"gpupool-bench-api"}:  # the bench's, named in Python
            self.assertTrue(os.access(os.path.join(folder, "build", "bin", program), os.X_OK), program)
        core = os.path.join(folder, "build", "lib", "libgpupool-core.so")
        self.assertTrue(os.path.exists(os.path.join(folder, "build", "lib", "libgpupool.so")))
        # The bench also runs on the simulated runtime there (both names the programs load).
        for name in ("libcudart.so.13", "libcuda.so.1"):
            self.assertTrue(os.path.exists(os.path.join(folder, "build", "sim", name)), name)
        sections = subprocess.run(["readelf", "-S", "-W", core], capture_output=True, text=True, check=True).stdout
        self.assertNotIn(".debug_info", sections)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
        self.assertLess(total, 64 << 20)

    def test_a_build_without_gpupool_is_refused(self):
        done, folder = self.pack(os.path.join(self.workdir, "no-build"))
        self.assertEqual(done.returncode, 1)
        self.assertIn("build it first", done.stderr)
        self.assertFalse(os.path.exists(folder))


class Scripts(ShimTest):
    def test_every_shell_script_parses(self):
        # bash reads a script as it runs it: a fault past the point where a
        # script stops without a GPU (gpu-check.sh exits 77 at once) would
        # first show on a lease.
        scripts = os.path.join(SOURCE, "scripts")
        shell = []
        for name in sorted(os.listdir(scripts)):
            with open(os.path.join(scripts, name), "rb") as f:
                if f.readline().rstrip().endswith(b"bash"):
                    shell.append(name)
        self.assertIn("gpu-check.sh", shell)
        for name in shell:
            done = subprocess.run(["bash", "-n", os.path.join(scripts, name)], capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, f"{name}: {done.stderr}")

    def test_every_python_script_compiles(self):
        # The same for the Python ones, some of which run only on a GPU
        # machine (bench/torch_steps.py, tests/gpu/torch_smoke.py).
        paths = [os.path.join(SOURCE, d, n) for d in ("bench", "scripts", "tests/gpu")
                 for n in sorted(os.listdir(os.path.join(SOURCE, d)))
                 if os.path.isfile(os.path.join(SOURCE, d, n))]
        python = []
        for path in paths:
            with open(path, "rb") as f:
                if path.endswith(".py") or f.readline().rstrip().endswith(b"python3"):
                    python.append(path)
        self.assertIn(os.path.join(SOURCE, "bench", "torch_steps.py"), python)
        for path in python:
            with open(path) as f:
                compile(f.read(), path, "exec")  # a SyntaxError fails the test, naming the file


class BenchScript(ShimTest):
    """bench/run_benchmarks.py writes BENCHMARKS.md, by hand, a few times a month: run it whole here (--quick) on a
    small trace, so that a change to a program it runs, or to the report keys it reads, shows at once."""

    def test_the_bench_script_runs_whole_and_judges_every_target(self):
        if sanitizer_runtime():
            self.skipTest("the bench preloads gpupool alone, without a sanitizer's runtime")
        if not os.path.exists(os.path.join(BUILD, "bin", "gpupool-bench")):
            self.skipTest("gpupool-bench is not built here (GPUPOOL_BUILD_BENCH is off)")
        committed = os.path.join(SOURCE, "BENCHMARKS.md")
        with open(committed) as f:
            before = f.read()
        traces = os.path.join(self.workdir, "traces")
        os.mkdir(traces)
        # Two streams taking turns over a few sizes, some blocks held across others' frees.
        lines = ["Thread,Time,Action,Pointer,Size,Stream"]
        for i in range(200):
            ptr, size, stream = 0x100000 * (i % 7 + 1), (i % 5 + 1) * 300_000, 0x10 * (i % 2)
            lines.append(f"1,00:00:00.{i:06d},allocate,{ptr:#x},{size},{stream:#x}")
            if i % 7 == 6 or i == 199:
                for j in range(i - i % 7, i + 1):
                    lines.append(f"1,00:00:00.{i:06d},free,{0x100000 * (j % 7 + 1):#x},{(j % 5 + 1) * 300_000},"
                                 f"{0x10 * (j % 2):#x}")
        with open(os.path.join(traces, "small.csv"), "w") as f:
            f.write("\n".join(lines) + "\n")
        env = clean_environment()
        env.update(BUILD_DIR=os.path.abspath(BUILD), TRACES_DIR=traces, OUT=self.workdir)
        done = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "run_benchmarks.py"), "--quick"],
                              env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        with open(os.path.join(self.workdir, "BENCHMARKS.md")) as f:
            text = f.read()
        self.assertIn("A quick run", text)
        for section in ("## 1. Cache-hit latency", "## 2. Scale", "## 3. Threads", "## 4. Preload cost",
                        "## 5. Memory", "## Ordering calls", "## Tracing cost", "## Targets"):
            self.assertIn(section, text)
        # Every figure the script reads from a program: the tables' rows and sentences hold numbers.
        number = r"\d[\d,]*(\.\d+)?"
        for row in (r"\| glibc `malloc`\+`free`, same sizes \| N \| 1\.00 \|",
                    r"\| pool, plain cudaMalloc/cudaFree, fixed segments \| N \| N \|",
                    r"\| `cudaMalloc`\+free through the shim \| N \| N \| N \| N \| N \|",
                    r"N ns of each plain pair and N ns of each stream-ordered pair",
                    r"N per plain pair and N per stream-ordered pair; N per plain pair with",
                    r"\| small\.csv \| N \|",
                    r"\| 1,000,000 \| N \|",
                    r"\| 64 \| 4 \| N \| N \| N \| N-N \| N MiB \|",
                    r"\| 4 \| N \| N \| N \|",
                    r"\| a shell script starting 100 `/bin/true` \| N \|",
                    r"\| small\.csv \| N GiB \| n/a \| N GiB \(N\) \| n/a \| N \| `[a-z_:0-9,]+` \|",
                    r"\| fixed \| 100 us \| N MiB \(N-N\) \| N% \| N \| N \|",
                    r"\| fixed \| 10000 us, a busy stream \| N MiB \(N-N\) \| N% \| N \|",
                    r"\| small\.csv( \| N){10} \|",
                    r"records N events over its N pairs",
                    r"N event records and N stream waits per pair",
                    r"\| with `GPUPOOL_TRACE` \| N \|"):
            self.assertRegex(text, row.replace("N", number))
        self.assertRegex(text, r"The loop of plain pairs .* records (\d+) events over its (\d+) pairs")
        # The judgement of each target, as the issue lists them.
        for target in ("Cache-hit pair <= 100 ns, within 5x of malloc+free",
                       "Growth <= 2x from 1 thousand to 1 million live blocks", "2 threads >= 1.5x one thread",
                       "Preload cost <= 1.2x", "Default reserves no more than PyTorch on every trace",
                       "Best swept configuration within 3% of peak live on every trace"):
            self.assertRegex(text, re.escape(f"| {target} | ") + r"(met|not met)[^|]* \| [^|]+ \|")
        self.assertIn("The GPU benchmarks below come from `scripts/gpu-bench.sh`", text)
        with open(committed) as f:
            self.assertEqual(f.read(), before, "a quick run wrote the committed BENCHMARKS.md")


class GpuBench(ShimTest):
    """bench/gpu_bench.py runs only where a GPU is lent, which is seldom: run whole here on the simulated runtime
    (--quick), a fault in the script shows before it costs a lease."""

    def test_the_gpu_bench_runs_whole_on_the_simulated_runtime(self):
        if sanitizer_runtime():
            self.skipTest("the bench preloads gpupool alone, without a sanitizer's runtime")
        committed = os.path.join(SOURCE, "bench", "GPU.md")
        with open(committed) as f:
            before = f.read()
        env = clean_environment()
        # No traces (a fixed size mix), no compiler for the static-runtime program (its row says so), and
        # PyTorch's steps by a stand-in that makes cudaMalloc/cudaFree pairs through ctypes.
        standin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_steps_standin.py")
        env.update(BUILD_DIR=os.path.abspath(BUILD), LD_LIBRARY_PATH=os.path.join(BUILD, "sim"), OUT=self.workdir,
                   TRACES_DIR=self.workdir, CUDACXX="false", GPU_BENCH_TORCH_STEPS=standin)
        done = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "gpu_bench.py"), "--quick"], env=env,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        with open(os.path.join(self.workdir, "GPU.md")) as f:
            text = f.read()
        self.assertIn("A quick run", text)
        for row in ("`cudaMalloc`+`cudaFree` | 1 | 64", "`cudaMallocAsync`+`cudaFreeAsync` | 2 | 4",
                    "128 idle non-blocking streams | 1 | 64", "`cudaMalloc`+`cudaFree`, one size | 1 | 1"):
            self.assertRegex(text, re.escape(row) + r" \| \d+ \| \d+ \| [\d.]+x \|")
        self.assertIn("static runtime | 1 | 64 | nvcc failed", text)
        self.assertRegex(text, r"on the simulated runtime .*`cudaMalloc`\+`cudaFree` \d+ ns a pair .* \d+\.\d\dx one")
        self.assertRegex(text, r"Two threads .* \d+\.\d\dx one thread's pairs per second")
        self.assertIn("torch_steps_standin.py's", text)
        for row in ("PyTorch's caching allocator", "`PYTORCH_NO_CUDA_MEMORY_CACHING=1` under gpupool",
                    "the same with `GPUPOOL_PLAIN_REUSE_SEARCH=0` (no search)"):
            self.assertRegex(text, re.escape(row) + r" \| [\d.]+ \| [\d.]+ GiB \| [\d.]+ GiB \|")
        # Read from gpupool's reports of the stand-in's runs: a barrier now and then for its plain pairs.
        self.assertRegex(text, r"Per allocation under gpupool \(from its reports\): 0\.\d*[1-9]\d* barriers")
        for target in ("gpupool >= 100x faster than raw cudaMalloc/cudaFree",
                       "PyTorch under gpupool within 5% of its own allocator in step time",
                       "PyTorch under gpupool not above its own allocator in peak memory",
                       "The same with a side stream (PyTorch's stream pool) within 5% in step time"):
            self.assertRegex(text, re.escape(f"| {target} | ") + r"(met|not met) \| [\d.]+x \|")
        with open(committed) as f:
            self.assertEqual(f.read(), before, "the bench wrote bench/GPU.md though OUT was set")


if __name__ == "__main__":
    main()
