"""Runs the test programs under LD_PRELOAD=libgpupool.so on the simulated CUDA
runtime and collects what came out: exit code, output, the JSON report and the
simulated runtime's call counters."""
import concurrent.futures
import glob
import json
import os
import platform
import shutil
import subprocess
import tempfile
import unittest

BUILD = os.environ.get("POOLTEST_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SOURCE = os.environ.get("POOLTEST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
LIBRARY = os.path.join(BUILD, "lib", "libgpupool.so")
CORE = os.path.join(BUILD, "lib", "libgpupool-core.so")
SIM = os.path.join(BUILD, "sim")
GPUPOOL = os.path.join(SOURCE, "scripts", "gpupool")  # the user's command
REPLAY = os.path.join(BUILD, "bin", "gpupool-replay")
SMALL_DEVICE = {"SIMCUDA_MEMORY": "64M"}  # a simulated device the tests fill
# The ways a program reaches one of the driver's functions (the test programs'
# driver_ways.hpp): called directly, linked with the driver; fetched with
# dlsym from the driver or the global scope, through the driver's
# cuGetProcAddress, by a library with dlsym or through its own
# cuGetProcAddress; through the runtime's cudaGetDriverEntryPoint (at the
# runtime's version) or cudaGetDriverEntryPointByVersion.
DRIVER_WAYS = ("driver-linked", "driver-dlsym", "driver-global", "driver-proc-address", "driver-library",
               "driver-library-proc-address", "runtime-entry-point", "runtime-entry-point-by-version")


def _elf_machine(path):
    """The machine a library was built for, from its ELF header's e_machine."""
    with open(path, "rb") as f:
        e_machine = int.from_bytes(f.read(20)[18:20], "little")
    return {62: "x86_64", 183: "aarch64"}.get(e_machine, f"machine {e_machine}")


BUILD_MACHINE = _elf_machine(LIBRARY) if os.path.exists(LIBRARY) else platform.machine()
# gpupool exports dlsym (shim/driver_hook.c) on these machines only.
EXPORTS_DLSYM = BUILD_MACHINE in ("x86_64", "aarch64")
# A build for another machine runs under an emulator (scripts/cross-test): its
# programs do, but this machine's own (python3, the shell, valgrind, a program
# nvcc builds here) cannot load its library.
NATIVE = BUILD_MACHINE == platform.machine()
native_only = unittest.skipUnless(NATIVE, f"runs this machine's programs under a library built for {BUILD_MACHINE}")


def program(name):
    return os.path.join(BUILD, "bin", name)


def sanitizer_runtime():
    """A sanitizer build's runtime must be preloaded ahead of the library."""
    out = subprocess.run(["ldd", LIBRARY], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libasan" in line or "libtsan" in line:
            return line.split("=>")[1].split("(")[0].strip()
    return None


class Run:
    def __init__(self, proc, workdir):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.workdir = workdir

    def reports(self):
        return sorted(glob.glob(os.path.join(self.workdir, "report-*")))

    def report(self):
        paths = self.reports()
        if len(paths) != 1:
            raise AssertionError(f"expected one report, found {paths}\nstderr:\n{self.stderr}")
        with open(paths[0]) as f:
            if not paths[0].endswith(".json"):
                return f.read()
            report = json.load(f)
        check_books(report)
        self.check_reserved_against_device(report)
        return report

    def check_reserved_against_device(self, report):
        """The simulated runtime counts the memory it gave out itself (all its
        devices together): no device's peak reserved in the report may exceed
        that peak."""
        path = os.path.join(self.workdir, "counters.json")
        if not os.path.exists(path):
            return
        with open(path) as f:
            device_peak = json.load(f)["peak_bytes_in_use"]
        for device, d in report.get("devices", {}).items():
            reserved = d["stats"]["reserved_bytes.all.peak"]
            if reserved > device_peak:
                raise AssertionError(f"device {device}: peak reserved {reserved} bytes in the report, but the "
                                     f"device's peak in use was {device_peak}")

    def counters(self):
        with open(os.path.join(self.workdir, "counters.json")) as f:
            return json.load(f)

    def output_json(self):
        return json.loads(self.stdout.strip().splitlines()[-1])


def human_bytes(b):
    """The report's byte figures, as report/diagnosis.cpp writes them."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    unit, value = 0, abs(float(b))
    while value >= 1024.0 and unit < 5:
        value /= 1024.0
        unit += 1
    sign = "-" if b < 0 else ""
    return f"{sign}{value:.0f} B" if unit == 0 else f"{sign}{value:.2f} {units[unit]}"


def check_books(report):
    """Every test that reads a JSON report checks its books: for each figure
    of each device, allocated - freed == current, and the peak is at least
    the current. The current allocations, their bytes and the bytes asked
    for them must also be those of the blocks the pool holds allocated (the
    report's "leaks", found by walking the blocks, not from the figures),
    unless gpupool stepped aside (its figures then stop where they were).
    The stream rows hold every cached block once: they add up to the cache."""
    for device, d in report.get("devices", {}).items():
        s = d["stats"]
        rows = (sum(st["cached_blocks"] for st in d["streams"]), sum(st["cached_bytes"] for st in d["streams"]))
        cache = (d["fragmentation"]["free_blocks"], d["fragmentation"]["free_bytes"])
        if rows != cache:
            raise AssertionError(f"device {device}: the stream rows hold {rows} cached blocks and bytes, "
                                 f"the cache {cache}")
        if "stepped_aside" not in report:
            counted = (s["allocation.all.current"], s["allocated_bytes.all.current"], s["requested_bytes.all.current"])
            walked = (d["leaks"]["blocks"], d["leaks"]["bytes"], d["leaks"]["requested_bytes"])
            if counted != walked:
                raise AssertionError(f"device {device}: current allocations, bytes and requested bytes {counted} "
                                     f"are not those of the blocks allocated in the pool {walked}")
        for key, current in s.items():
            name = key[:-len(".current")]
            if not key.endswith(".current") or f"{name}.allocated" not in s:
                continue
            allocated, freed, peak = s[f"{name}.allocated"], s[f"{name}.freed"], s[f"{name}.peak"]
            if allocated - freed != current or peak < current:
                raise AssertionError(f"device {device}: {name}: allocated {allocated} - freed {freed} != current "
                                     f"{current}, or peak {peak} below it")


def clean_environment():
    """This process's environment without gpupool's and the simulated runtime's
    settings, which a test gives its programs itself."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "SIMCUDA_"))}


class ShimTest(unittest.TestCase):
    """Each test gets a fresh directory for reports and counters."""

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="gpupool-test-")
        self.addCleanup(shutil.rmtree, self.workdir, True)

    def run_program(self, args, env=None, preload=True, fmt="json", timeout=120, log=True, library=LIBRARY,
                    cwd=None, stderr=subprocess.PIPE, before_exec=None, close_fds=True, workdir=None):
        workdir = workdir or self.workdir
        e = clean_environment()
        e["LD_LIBRARY_PATH"] = SIM
        e["SIMCUDA_COUNTERS_FILE"] = os.path.join(workdir, "counters.json")
        runtime = sanitizer_runtime() if preload else None
        if preload:
            preloads = [p for p in (runtime, library) if p]
            e["LD_PRELOAD"] = ":".join(preloads)
            if log:
                e["GPUPOOL_LOG"] = os.path.join(workdir, "report-%p." + fmt)
            e["GPUPOOL_LOG_FORMAT"] = fmt
        e.update(env or {})
        if runtime and "libtsan" in runtime:  # the suppressions, and any options the test gave
            supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tsan.supp")
            e["TSAN_OPTIONS"] = f"suppressions={supp} " + e.get("TSAN_OPTIONS", "")
        if isinstance(args, str):
            args = [args]
        args = [program(args[0]) if not os.path.isabs(args[0]) and "/" not in args[0] and
                os.path.exists(program(args[0])) else args[0]] + list(args[1:])
        proc = subprocess.run(args, env=e, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=timeout, cwd=cwd,
                              preexec_fn=before_exec, close_fds=close_fds)
        return Run(proc, workdir)

    def run_programs(self, runs, timeout=120):
        """Runs several programs at once, each (args, env) in a folder of its
        own for its reports and counters; their Runs, in order. For programs
        that mostly wait on the simulated device's delays, never for a check
        that a hazard shows (contention can hide one). Under a sanitizer, two
        at a time: there the programs are busy."""
        def one(args, env):
            workdir = tempfile.mkdtemp(dir=self.workdir)
            return self.run_program(args, env=env, timeout=timeout, workdir=workdir)
        workers = 2 if sanitizer_runtime() else 8
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda run: one(*run), runs))

    def remove_reports(self):
        for path in glob.glob(os.path.join(self.workdir, "report-*")):
            os.remove(path)

    def assertSucceeded(self, run):
        self.assertEqual(run.code, 0, f"exit {run.code}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}")


def main():
    unittest.main(verbosity=2)
