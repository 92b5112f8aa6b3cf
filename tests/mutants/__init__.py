# Mutations of the rules that keep gpupool from handing out memory still in
# use (or from losing track of it), and of those that keep blocks whole, the
# memory limit kept and the report's figures exact (size rules, splitting,
# merging, giving memory back, the configuration's limits), for
# scripts/mutants. Each entry breaks one rule in a copy of the source: its
# suite must then fail. A rule whose mutation no test notices has no test.
#   (rule, file, text, replaced by, suite)
# Suites: "unit" (the unit tests and the saved fuzz inputs), "shim" (the
# shim's integration tests: shim, devices, memory_pools, runtimes and
# lifecycle), "streams" (the streams and capture integration tests),
# "tools" (the trace, replay and project_scripts integration tests, with the
# saved trace inputs), "report" (the unit tests and the report, report_paths
# and command integration tests), "host_oom" (gpupool's own host
# allocations failing), "aarch64" (the shim and runtimes integration tests on
# an AArch64 build under qemu: scripts/cross-test).
# Mutations that change nothing a program could see are left out (for
# instance a barrier check made twice).
#
# The rules live in one file per part of the source they break, each a
# MUTANTS list of its own, in the order they were added.
from . import pool_blocks, pool_ordering, report_config, shim_calls, shim_runtime, tools_scripts

MUTANTS = (pool_ordering.MUTANTS + pool_blocks.MUTANTS + shim_runtime.MUTANTS + shim_calls.MUTANTS +
           report_config.MUTANTS + tools_scripts.MUTANTS)
