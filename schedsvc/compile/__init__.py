"""``eng.compile``: trace a function once on symbolic tensors, replay it as one fused task.

The names are imported on first use: the compiler is built on the Tensor
and on the engine's port, which import this package (``Counts``) while they
are themselves being imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._batchcall import BatchCall, check_exact
    from ._batched import Batched
    from ._compiled import Compiled, load
    from ._counts import Counts
    from ._graph import Graph

__all__ = ["BatchCall", "Batched", "Compiled", "Counts", "Graph", "check_exact", "load"]

_WHERE = {
    "Compiled": "._compiled",
    "load": "._compiled",
    "Counts": "._counts",
    "Graph": "._graph",
    "Batched": "._batched",
    "BatchCall": "._batchcall",
    "check_exact": "._batchcall",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
