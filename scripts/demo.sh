#!/usr/bin/env bash
# Create .venv (Python >= 3.11), install schedsvc, run the sources' experiments: `schedsvc demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_into_venv ""
exec .venv/bin/schedsvc demo "$@"
