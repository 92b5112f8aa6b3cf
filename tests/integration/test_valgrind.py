"""The shim under valgrind. Memcheck sees what the sanitizers do not (reads of
uninitialized memory) in real programs under LD_PRELOAD. And valgrind places
mappings itself, unaligned: the simulated driver must still keep the driver's
promises that gpupool relies on (address reservations start on a granule)."""
import os
import shutil
import unittest

from harness import ShimTest, main, native_only, program, sanitizer_runtime

VALGRIND = shutil.which("valgrind")


@unittest.skipIf(VALGRIND is None, "valgrind is not installed (scripts/deps.sh installs it)")
@unittest.skipIf(sanitizer_runtime() is not None, "a sanitizer build does not run under valgrind")
@native_only
class UnderValgrind(ShimTest):
    def valgrind(self, tool, args, env=None):
        command = [VALGRIND, "-q", f"--tool={tool}", "--error-exitcode=99", program(args[0])] + list(args[1:])
        return self.run_program(command, env=env, timeout=300)

    def test_memcheck_finds_no_error(self):
        fixed = {"GPUPOOL_EXPANDABLE_SEGMENTS": "0"}
        static = {"GPUPOOL_STATIC_RUNTIME": "1"}  # through the dlsym hook and the driver's entry points
        for args, env in ((["test-repeat", "20"], {}), (["test-threads", "2", "200"], {}),
                          (["test-patterns", "500", "3"], {}), (["test-patterns", "300", "5"], fixed),
                          (["test-static-runtime", "pairs", "30"], static),
                          (["test-static-runtime", "async", "10"], static)):
            with self.subTest(args=args, **env):
                run = self.valgrind("memcheck", args, env)
                self.assertSucceeded(run)
                self.assertTrue(run.reports(), "gpupool wrote no report: was it loaded?")
                for path in run.reports():
                    os.remove(path)

    def test_expandable_segments_work_where_mappings_are_unaligned(self):
        run = self.valgrind("none", ["test-fidelity"])
        self.assertSucceeded(run)
        self.assertIn("fidelity: all checks passed", run.stdout)


if __name__ == "__main__":
    main()
