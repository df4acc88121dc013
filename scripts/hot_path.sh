#!/usr/bin/env bash
# Instructions per task on the hot path, counted by callgrind, all threads.
# Usage: scripts/hot_path.sh [N] [python] [workload]   -- prints N, the two totals and instructions per task.
#   workload hot_path (default): scripts/hot_path.py, N independent tasks then an N-link chain (per 2 N tasks)
#   workload w4: scripts/w4_sync.py, N x 'await eng.run(np.add, x, 1)' run inline (per eng.run)
set -euo pipefail
N="${1:-10000}"
PY="${2:-python}"
WORKLOAD="${3:-hot_path}"
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
case "$WORKLOAD" in
  hot_path) ARGS=("$HERE/hot_path.py"); PER=$((2 * N)) ;;
  # a threshold that keeps the native decision to run inline under callgrind's slow-down (w4_sync.py)
  w4) ARGS=("$HERE/w4_sync.py" 1e6); PER=$N ;;
  *) echo "unknown workload: $WORKLOAD (hot_path or w4)" >&2; exit 2 ;;
esac
# one BLAS thread: idle OpenBLAS threads spin for a while after NumPy starts them, and how long
# varies from run to run (np.add never calls BLAS)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
total() {
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1.%p" -q "$PY" "${ARGS[0]}" "$1" "${ARGS[@]:1}" >/dev/null 2>"$OUT/err.$1"
  # the summary line of each output file (one per process): instructions, all threads
  awk '/^summary:/ {s += $2} END {printf "%.0f\n", s}' "$OUT"/cg."$1".*
}
with=$(total "$N")
without=$(total 0)
echo "N=$N total=$with base=$without per_task=$(( (with - without) / PER ))"
grep -h "check:" "$OUT/err.$N" || true  # (w4: did the tasks run inline?)
