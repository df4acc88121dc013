"""Host-to-device copy tasks, found again for the same buffer version while one is in flight."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .._core import Task

__all__ = ["Copies", "CopyTask"]


class CopyTask(Task):
    """A copy between host and device memory that a submission needed (a task the engine made)."""

    __slots__ = ("__weakref__",)


_IN_FLIGHT = frozenset({"waiting", "ready", "running", "launched"})


class Copies:
    """Host-to-device copy tasks shared by the tasks in flight that read one buffer version.

    A copy is found again while it is in flight and its host array is the same object; any write
    the engine sees to that memory (a task's ``out=``/``writes=``, a Tensor op) drops it, so a later
    reader copies the new version.
    """

    def __init__(self) -> None:
        self.by_key: dict[int, dict[str, tuple[weakref.ref[Any], weakref.ref[Task]]]] = {}

    def find(self, array: np.ndarray[Any, Any], device: str) -> Task | None:
        """The copy of ``array`` to ``device`` still in flight, if any: once a copy has completed, the
        host may have written the array (without the engine seeing it), so a later reader copies again."""
        entry = self.by_key.get(id(array), {}).get(device)
        if entry is None:
            return None
        copy = entry[1]()
        if entry[0]() is not array or copy is None or copy.state not in _IN_FLIGHT:
            return None
        return copy

    def add(self, array: np.ndarray[Any, Any], device: str, copy: CopyTask) -> None:
        by_key = self.by_key
        if len(by_key) > 4096:  # forget the entries no reader can find again (their copies are done)
            for key in [k for k, v in by_key.items() if not any(_in_flight(c) for _, c in v.values())]:
                del by_key[key]
        by_key.setdefault(id(array), {})[device] = (weakref.ref(array), weakref.ref(copy))

    def written(self, task: Task) -> None:
        by_key = self.by_key
        for key, _, write in task.buffers:
            if write:
                by_key.pop(key, None)


def _in_flight(ref: weakref.ref[Task]) -> bool:
    copy = ref()
    return copy is not None and copy.state in _IN_FLIGHT
