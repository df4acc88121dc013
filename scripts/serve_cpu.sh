#!/usr/bin/env bash
# Where a server of `schedsvc bench serve` spends its CPU under wrk: µs of CPU per answered request, by thread.
# Usage: scripts/serve_cpu.sh MODEL SECONDS -- COMMAND...
#   COMMAND starts a server that prints "ready PORT" (python -m schedsvc.cli.bench._serve_app VARIANT MODEL)
# Reads each thread's user+system time from /proc/PID/task/*/stat before and after SECONDS of load by wrk
# (64 connections), and wrk's own; prints req/s and, per thread of the server and for wrk, µs per request.
# Linux only (/proc); needs wrk on PATH; binds 127.0.0.1 only.
set -euo pipefail
[ "$#" -ge 4 ] && [ "$3" = "--" ] || { sed -n '2,7p' "$0" >&2; exit 2; }
MODEL=$1 SECONDS_EACH=$2
shift 3
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$HERE/.venv/bin/python}"
. "$HERE/scripts/_serve_wrk.sh"
OUT="$(mktemp -d)"
"$@" > "$OUT/server.log" 2>&1 &
PID=$!
trap 'kill -INT $PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$OUT"' EXIT
PORT=$(ready_port "$OUT/server.log")
[ -n "$PORT" ] || { echo "the server did not start:" >&2; cat "$OUT/server.log" >&2; exit 1; }
write_post "$OUT" "$MODEL" "$PY"
wrk -t1 -c64 -d1s -s "$OUT/post.lua" "http://127.0.0.1:$PORT/predict" > /dev/null  # warm
snap() { for t in /proc/"$PID"/task/*; do echo "$(basename "$t") $(tr ' ' _ < "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"; done; }
snap > "$OUT/before"
/usr/bin/env time -f "%U %S" -o "$OUT/wrk.time" \
  wrk -t1 -c64 -d"$SECONDS_EACH"s -s "$OUT/post.lua" "http://127.0.0.1:$PORT/predict" > "$OUT/wrk.out"
snap > "$OUT/after"
"$PY" - "$OUT" "$(getconf CLK_TCK)" "$PID" <<'PY'
import sys
out, tck, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
wrk = open(f"{out}/wrk.out").read()
requests = int(next(line.split()[0] for line in wrk.splitlines() if "requests in" in line))
rate = next(line.split()[1] for line in wrk.splitlines() if line.startswith("Requests/sec"))
def read(name):
    return {f[0]: (f[1], int(f[2])) for f in (line.split() for line in open(f"{out}/{name}"))}
before, after = read("before"), read("after")
us = 1e6 / tck / requests
threads = [  # the process's main thread runs the event loop; the others are workers (and BLAS's own)
    ("loop" if tid == pid else "thread", (ticks - before.get(tid, (name, 0))[1]) * us)
    for tid, (name, ticks) in after.items()
]
user, system = map(float, open(f"{out}/wrk.time").read().split())
print(f"{float(rate):,.0f} req/s; CPU per request: server {sum(t for _, t in threads):.0f} µs", end="")
print(" (" + ", ".join(f"{name} {t:.0f}" for name, t in sorted(threads, key=lambda x: -x[1]) if t >= 1) + ")", end="")
print(f"; wrk {(user + system) * 1e6 / requests:.0f} µs")
PY
