#!/usr/bin/env bash
# Builds the benchmark preset and runs every CPU benchmark; rewrites BENCHMARKS.md.
# The traces are read from ../shared/traces (or TRACES_DIR). GPU benchmarks:
# scripts/gpu-bench.sh, on a machine with a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset bench >/dev/null
cmake --build --preset bench >/dev/null
exec /usr/bin/python3 bench/run_benchmarks.py
