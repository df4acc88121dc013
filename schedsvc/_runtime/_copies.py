"""Device copies: the copy tasks a submission needs on an engine with devices of their own memory.

``DeviceCopies.prepare`` runs with the runtime's lock held, as part of a task's
admission: the task's device moves host arguments in as copy
tasks, a task elsewhere taking such a device's value gets a copy task out
instead, and a write drops the copies of what it writes.  ``Copies`` finds a
host-to-device copy again for the same buffer version while it is in flight.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import Task
from ._scan import replace_leaves

if TYPE_CHECKING:
    from ._device import Device

__all__ = ["Copies", "CopyTask", "DeviceCopies"]


class DeviceCopies:
    """The copies in and out of devices with memory of their own that submissions need."""

    def __init__(self) -> None:
        #: devices with memory of their own, which rewrite tasks at submission so their
        #: arguments are copied in (and device values copied out for other devices' tasks): ``prepare``
        self.preparers: dict[str, Device] = {}
        self.copies = Copies()

    def prepare(self, task: Task) -> list[Task] | None:
        """With the lock held, before ``task`` is admitted, on an engine with devices of their own memory:
        its device moves host arguments in as copy tasks; a task elsewhere taking such a
        device's value gets a copy task out instead; a write drops the copies of what it writes.
        Returns the copy tasks made for it (admitted with it, or not at all), if any."""
        copies = self.copies
        if task.buffers:
            copies.written(task)
        along: list[Task] = []
        preparer = self.preparers.get(task.device)
        if preparer is not None:
            preparer.prepare(task, along.append, copies)
            return along or None
        for owner in self.preparers.values():
            if task.fn == owner.to_host:  # a copy out is not copied out again
                return None
        # the values it takes that live on such a device (its results, or its arrays passed as they
        # are) are copied out first, each by a copy task that reads that memory (so it is ordered
        # after writes to it); its other dependencies on them only order it
        swapped: dict[int, Task] = {}
        out_of_devices = functools.partial(self._copy_out, task, swapped)
        args = replace_leaves(task.args, out_of_devices)
        kwargs = replace_leaves(task.kwargs, out_of_devices) if task.kwargs else task.kwargs
        if not swapped:
            return None
        task.args, task.kwargs = args, kwargs
        task.deps = (*(d for d in task.deps if id(d) not in swapped), *swapped.values())
        return list(swapped.values())

    def _copy_out(self, task: Task, swapped: dict[int, Task], value: Any) -> Any:
        """``value`` as ``task`` (elsewhere) takes it: if it lives on a device of its own memory (a task
        of that device, or one of its arrays), the copy task bringing it to the host, made once per
        value (``swapped``, by the id of what it copies)."""
        if isinstance(value, Task):
            owner = self.preparers.get(value.device)
        else:
            for owner in self.preparers.values():
                if owner.holds(value):  # a device array passed as it is
                    break
            else:
                return value
        if owner is None:
            return value
        copy = swapped.get(id(value))
        if copy is None:
            copy = swapped[id(value)] = owner.host_copy(value, task)
        return copy


class CopyTask(Task):
    """A copy between host and device memory that a submission needed (a task the engine made)."""

    __slots__ = ("__weakref__",)
    rides = True  # on the slot of the submission it was made for


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
