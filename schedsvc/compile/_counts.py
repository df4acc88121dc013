"""Traces and replays of one engine's compiled functions, as ``eng.stats()`` reports them."""

from __future__ import annotations

__all__ = ["Counts"]


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
