"""Tensor benchmark (MLP and fancy_func: NumPy, eager Tensors, compiled): the same as `schedsvc bench tensor`.

python scripts/bench_tensor.py [--reps 5] [--json bench-tensor.json]
"""

import sys

from schedsvc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "tensor", *sys.argv[1:]]))
