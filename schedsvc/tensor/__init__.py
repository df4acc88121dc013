"""The lazy Tensor facade: array operations queued as engine tasks, shapes known at once."""

from ._ops import OPS, Op
from ._tensor import ArrayOps, Tensor, apply, concrete

__all__ = ["OPS", "ArrayOps", "Op", "Tensor", "apply", "concrete"]
