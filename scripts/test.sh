#!/usr/bin/env bash
# Install what the tests need and run them, then the algorithm-ranking regression check.
# This is the README's test command and exactly what CI runs (.ci/run), from a clean clone on a
# possibly brand-new machine.
set -euo pipefail
cd "$(dirname "$0")/.."

# The report test renders a page in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
    fi
fi

# The Ray tests run their cluster in a network namespace of their own (unshare -n, then ip link
# set lo up): iproute2 provides ip.
if ! command -v ip >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq iproute2 >/dev/null
    fi
fi

python3 -m pip install -q -e ".[test]"
# One pytest worker per core, at most 4 (each holds 2-3 GB once numba has compiled its kernels):
# most of a cold run is numba compiling kernels, one core at a time per process, so a worker
# per core shortens it (the figures are in docs/performance.md's note on the suite's time).
# Whole files go to one worker (their module fixtures, a Ray cluster, start once).
workers=$(python3 -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")
python3 -m pytest -n "$workers" --dist loadfile

# Rankings of the small CI suite against the shipped baseline (docs/regression.md): single
# threaded, because parallel kernels' times on a shared 2-core machine are too noisy to compare.
# Baselines are per machine: rankings move with the instruction set (register_tiled's tiles are
# sized for AVX-512), so the baseline of this machine's ISA level is taken where one is shipped
# (caches/ci-baseline-<isa>.msgpack), else the AVX-512 one (caches/ci-baseline.msgpack).
# numba's threading layer is pinned to TBB (a dependency, so always there), the layer the
# baselines were recorded with: fastrun prefers OpenMP where libgomp is installed, and under
# OpenMP the parallel kernels at one thread pay another region cost, which moved
# blocked_direct on the depthwise conv from 6x to 12x depthwise's time and failed 2 of 3 checks
# of unchanged code.
isa=$(python3 -c "from fastrun.devices.cpu import CPUDevice; from fastrun.category import \
parse_device; print(dict(parse_device(CPUDevice(1).category))['isa'])")
baseline=caches/ci-baseline.msgpack
if [ -f "caches/ci-baseline-$isa.msgpack" ]; then
    baseline="caches/ci-baseline-$isa.msgpack"
fi
NUMBA_THREADING_LAYER=tbb OPENBLAS_NUM_THREADS=1 python3 -m fastrun.cli.main regress --baseline "$baseline" \
    --suite ci --device cpu:1 --budget 0.01 --margin 0.5
