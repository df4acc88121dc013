# Sourced as `. scripts/_device.sh NAME` by gpu_check.sh and serve_check.sh, from the checkout's root on a
# machine that reaches no package index: OUT (created; default ./NAME), PY ($PYTHON, default python3);
# `step`, which runs one step of the check; and the wheels of .whl/ (copied from ../shared/gpu-wheels/ next to
# the checkout) or of that folder installed into ~/site, which goes on PYTHONPATH with the checkout (the
# checkout alone if there are none).
OUT="${OUT:-$PWD/$1}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0

step() {  # step NAME COMMAND...: run it, keep its output in $OUT/NAME.log, remember a failure in `status`
    local name="$1"
    shift
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "== $name: exit $rc" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || status=1
}

wheels=""
for dir in .whl ../shared/gpu-wheels; do
    if compgen -G "$dir/*.whl" >/dev/null; then wheels="$dir"; break; fi
done
if [ -n "$wheels" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$HOME/site" "$wheels"/*.whl || { echo "installing the wheels failed" >&2; exit 1; }
    export PYTHONPATH="$HOME/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
