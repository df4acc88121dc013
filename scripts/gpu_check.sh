#!/usr/bin/env bash
# The one command for a GPU machine that reaches no package index: the CUDA conformance suite on CuPy,
# every gpu-marked test, the CUDA executor's tests on real CuPy, `schedsvc bench gpu` and its peers
# (`--peers`: raw CuPy, PyTorch and JAX where they import), the differential tester on real CuPy
# ($DIFF_PROGRAMS programs, default 1000), G1's chain per op (scripts/gpu_probe.py), and the demo.
# Every output goes under $OUT when it is set (else ./gpu-check-out).  Exit status: non-zero if any step failed.
#
# The machine needs Python >= 3.11 with CuPy, NumPy, anyio, pytest, hypothesis; the other dependencies
# come as wheels from .whl/ (copied from ../shared/gpu-wheels/ next to the checkout) or that folder.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/_device.sh gpu-check-out  # (OUT, PY, step, and the wheels)

{
    date -u
    nvidia-smi 2>&1 | head -n 15
    "$PY" -c 'import sys, numpy, cupy; print(sys.version); print("numpy", numpy.__version__); cupy.show_config()'
} >"$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

# the conformance suite (simulator and CuPy against the same expectations) and every gpu-marked test
step gpu-tests "$PY" -m pytest -p no:cacheprovider -m gpu -rA -q tests
# the CUDA executor's and compile-on-cuda's tests (CUDA graphs), on real CuPy instead of the simulator
step executor-on-cupy env SCHEDSVC_TEST_CUDA=cupy "$PY" -m pytest -p no:cacheprovider -rA -q \
    tests/devices/test_cuda_executor.py tests/devices/test_cuda_conformance.py \
    tests/devices/test_cuda_compile.py tests/devices/test_cuda_batching.py
step info "$PY" -m schedsvc.cli info
# G1-G6 against raw CuPy (its table in bench-gpu.log, its figures in bench-gpu.json)
step bench-gpu "$PY" -m schedsvc.cli bench gpu --reps 5 --json "$OUT/bench-gpu.json"
# P1-P5 on schedsvc, raw CuPy, PyTorch and JAX, a process each (the table in bench-gpu-peers.log)
step bench-gpu-peers "$PY" -m schedsvc.cli bench gpu --peers --reps 3 --json "$OUT/bench-gpu-peers.json"
# random programs mixing CPU and cuda work (in-place writes, copies, compiled and batched calls) on CuPy
step difftest-on-cupy env SCHEDSVC_TEST_CUDA=cupy "$PY" scripts/difftest.py --programs "${DIFF_PROGRAMS:-1000}" \
    --families cuda,cuda_compile,cuda_batched,mixed_tensor,mixed --seed 1
# G1's chain timed per op on the CPU and the GPU: what a GPU op costs beyond CuPy's launch
step gpu-probe "$PY" scripts/gpu_probe.py chain 2000
step demo "$PY" -m schedsvc.cli demo --quick --json "$OUT/demo.json"
cat "$OUT/summary.txt"
exit "$status"
