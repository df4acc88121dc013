#!/usr/bin/env bash
# Serving on a many-core machine that reaches no package index (the GPU machine's host): `schedsvc bench serve`
# as the batching goals are read -- both models with none, inline, handmade and batched, the server and the load
# sharing every core, then each on half of them; then the wide model's batched service as one process and as
# four (each with its own loop and engine), to read how it scales.  REPS rounds each (default 2), DURATION
# seconds of load each (default 3).  Every output goes under $OUT when it is set (else ./serve-check-out), the
# figures in $OUT/*.json.  Exit status: non-zero if any step failed.
#
# wrk comes from .bin/ (Debian's wrk and its LuaJIT library, copied from ../shared/gpu-bin/ next to the
# checkout) or from PATH; uvicorn, Starlette and httptools as wheels, as scripts/gpu_check.sh takes them.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/_device.sh serve-check-out  # (OUT, PY, step, and the wheels)

if [ -x .bin/wrk ]; then  # (a copy outside the checkout: the carried one may not keep its mode)
    mkdir -p "$OUT/bin" && cp .bin/wrk "$OUT/bin/" && chmod +x "$OUT/bin/wrk"
    export PATH="$OUT/bin:$PATH" LD_LIBRARY_PATH="$PWD/.bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
command -v wrk >/dev/null || { echo "no wrk: copy ../shared/gpu-bin/ to .bin/ (its README.md)" >&2; exit 1; }
wrk -v 2>&1 | head -n 1
cores=$(nproc)
halves="0-$((cores / 2 - 1)):$((cores / 2))-$((cores - 1))"
[ "$cores" -ge 4 ] || halves="0:1"
REPS="${REPS:-2}" DURATION="${DURATION:-3}"
serve() {  # serve NAME ARGS...: one run of the serve suite, its figures in $OUT/NAME.json
    local name="$1"
    shift
    step "$name" "$PY" -m schedsvc.cli bench serve --reps "$REPS" --duration "$DURATION" --json "$OUT/$name.json" "$@"
}

{ date -u; "$PY" -c 'import sys; print(sys.version)'; lscpu 2>&1 | head -n 20; } >"$OUT/environment.txt" 2>&1
serve serve-shared --model both --variants none,inline,handmade,batched
serve serve-halves --model both --variants none,inline,handmade,batched --cpus "$halves"
serve serve-1-process --model wide --variants none,batched
serve serve-4-processes --model wide --variants none,batched --processes 4
cat "$OUT/summary.txt"
exit "$status"
