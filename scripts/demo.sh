#!/usr/bin/env bash
# Create .venv (Python >= 3.11), install schedsvc with the cli extra, run the sources' experiments: `schedsvc demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_into_venv "[cli]"
exec .venv/bin/schedsvc demo "$@"
