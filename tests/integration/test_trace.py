"""Traces: GPUPOOL_TRACE records them and gpupool-import-snapshot converts
PyTorch snapshots to them."""
import csv
import json
import os
import pickle
import subprocess
import sys
import threading
import time

from harness import REPLAY, SOURCE, ShimTest, main


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


if __name__ == "__main__":
    main()
