#!/usr/bin/env bash
# Create .venv (Python >= 3.11), install schedsvc, run the sources' experiments: `schedsvc demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/schedsvc demo "$@"
