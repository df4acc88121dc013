#!/usr/bin/env bash
# Paired runs of two servers of `schedsvc bench serve` under wrk: both up, wrk driving A then B, N times.
# Usage: scripts/serve_pair.sh MODEL N SECONDS -- A-COMMAND... -- B-COMMAND...
#   each command starts a server that prints "ready PORT" (the bench's app: python -m
#   schedsvc.cli.bench._serve_app VARIANT MODEL; prefix `env X=1` or `env -C DIR` to vary it)
# Prints each pair's req/s and B/A, and the median and range of B/A: on a shared machine a figure moves by
# ±15% from run to run, so compare two servers by the ratios of runs made side by side.
# Needs wrk on PATH; binds 127.0.0.1 only; the servers stop when this script ends (they watch their parent).
set -euo pipefail
[ "$#" -ge 6 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
MODEL=$1 N=$2 SECONDS_EACH=$3
shift 3
[ "$1" = "--" ] || { echo "expected -- before A's command" >&2; exit 2; }
shift
A=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do A+=("$1"); shift; done
[ "$#" -gt 1 ] || { echo "expected -- and B's command" >&2; exit 2; }
shift
B=("$@")
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$HERE/.venv/bin/python}"
. "$HERE/scripts/_serve_wrk.sh"
OUT="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT
"${A[@]}" > "$OUT/a.log" 2>&1 & pids+=($!)
"${B[@]}" > "$OUT/b.log" 2>&1 & pids+=($!)
PA=$(ready_port "$OUT/a.log"); PB=$(ready_port "$OUT/b.log")
[ -n "$PA" ] && [ -n "$PB" ] || { echo "a server did not start:"; cat "$OUT/a.log" "$OUT/b.log"; exit 1; } >&2
write_post "$OUT" "$MODEL" "$PY"
rps() { wrk -t1 -c64 -d"$2"s -s "$OUT/post.lua" "http://127.0.0.1:$1/predict" | awk '/Requests\/sec/{print $2}'; }
rps "$PA" 1 > /dev/null; rps "$PB" 1 > /dev/null  # warm: both traced, both caches hot
for i in $(seq 1 "$N"); do echo "$(rps "$PA" "$SECONDS_EACH") $(rps "$PB" "$SECONDS_EACH")"; done > "$OUT/pairs"
"$PY" - "$OUT/pairs" <<'PY'
import statistics, sys
pairs = [tuple(map(float, line.split())) for line in open(sys.argv[1]) if line.strip()]
ratios = [b / a for a, b in pairs]
for (a, b), r in zip(pairs, ratios):
    print(f"A {a:9,.0f} req/s   B {b:9,.0f} req/s   B/A {r:.3f}")
print(f"B/A median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} pairs")
PY
