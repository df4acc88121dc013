"""Core benchmark (W1-W6): the same as `schedsvc bench core`.

python scripts/bench_core.py [--reps 5] [--json bench-core.json]
"""

import sys

from schedsvc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "core", *sys.argv[1:]]))
