#!/usr/bin/env bash
# Instructions per task on the hot path (scripts/hot_path.py), counted by callgrind, all threads.
# Usage: scripts/hot_path.sh [N] [python]   -- prints N, the two totals and instructions per task.
set -euo pipefail
N="${1:-10000}"
PY="${2:-python}"
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# one BLAS thread: idle OpenBLAS threads spin for a while after NumPy starts them, and how long
# varies from run to run (np.add never calls BLAS)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
total() {
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1.%p" -q "$PY" "$HERE/hot_path.py" "$1" >/dev/null 2>&1
  # the summary line of each output file (one per process): instructions, all threads
  awk '/^summary:/ {s += $2} END {printf "%.0f\n", s}' "$OUT"/cg."$1".*
}
with=$(total "$N")
without=$(total 0)
echo "N=$N total=$with base=$without per_task=$(( (with - without) / (2 * N) ))"
