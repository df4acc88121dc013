"""``eng.compile``: trace a function once on symbolic tensors, replay it as one fused task."""

from ._compiled import Compiled, load
from ._graph import Graph

__all__ = ["Compiled", "Graph", "load"]
