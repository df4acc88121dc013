#!/usr/bin/env bash
# Create .venv (Python >= 3.11), install schedsvc with the test and docs extras, run ruff, mypy, the strict
# documentation build (into site/, ignored) and pytest.
# Any failing step fails the script.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_into_venv "[test,docs]"
echo "== ruff"
.venv/bin/ruff check schedsvc tests scripts examples
.venv/bin/ruff format --check schedsvc tests scripts examples
echo "== mypy"
.venv/bin/mypy
echo "== docs"
# --strict: a broken link, a missing page or an unresolved API reference fails the build
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
echo "== pytest"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
