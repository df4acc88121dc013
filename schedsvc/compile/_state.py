"""Compile's state that Tensor operations consult: is this thread tracing a compiled function?

A leaf module (it imports nothing of schedsvc), so ``schedsvc.tensor`` can
read it on every operation without importing the compiler.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ACTIVE", "Counts", "tracing"]


class _Tracing(threading.local):
    """The trace recording on this thread (``schedsvc.compile``), if any."""

    depth = 0
    trace: Any = None


class Counts:
    """Traces and replays of one engine's compiled functions (``eng.stats()``).  Replays are counted
    under the runtime's lock; traces without a shared lock, so two traces at the same moment on two
    threads may count once (a figure for stats, not for control)."""

    __slots__ = ("batch_rows", "batch_sizes", "batches", "replays", "traces")

    def __init__(self) -> None:
        self.traces = 0
        self.replays = 0
        self.batches = 0  # batched calls' replays (``eng.compile(fn, batch_axis=...)``)
        self.batch_rows = 0
        self.batch_sizes: dict[int, int] = {}  # rows -> batches of that many rows


tracing = _Tracing()
#: traces running on any thread: checked first, so that no trace costs one list read
ACTIVE = [0]
