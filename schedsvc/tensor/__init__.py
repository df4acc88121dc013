"""The lazy Tensor facade: array operations queued as engine tasks, shapes known at once."""

from ._arrayops import ArrayOps, Operand, apply
from ._ops import OPS, Op
from ._tensor import Array, Tensor, check_out, concrete
from ._tracking import TensorMemory, asarray, create, order_after, queue_op, rider, shape_arg

__all__ = [
    "OPS",
    "Array",
    "ArrayOps",
    "Op",
    "Operand",
    "Tensor",
    "TensorMemory",
    "apply",
    "asarray",
    "check_out",
    "concrete",
    "create",
    "order_after",
    "queue_op",
    "rider",
    "shape_arg",
]
