"""Dynamic batching benchmark (1,797 concurrent batch-1 calls of a digits-sized MLP against the per-row NumPy
loop): the same as `schedsvc bench batch`.

python scripts/bench_batch.py [--reps 5] [--json bench-batch.json]
"""

import sys

from schedsvc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "batch", *sys.argv[1:]]))
