"""A batch on a CUDA device: the ready calls of one fusion launched as one (``runtime.Fusion.launch``).

The thread that has the turn to launch takes one call of a batched function; it takes the other ready
calls of its group too (``rt.take_like``), orders the stream it picks after all their parents, and has
the group launch them as one with that stream current.  The group places its arrays through ``Staging``:
host rows joined on the host are copied in once through pinned memory, and host callers' rows copied out
once into pinned memory, both on the launch's stream.  One event after the launch stands for every call:
their flights share it, and what the launch staged stays alive until it passed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .._runtime import Task, substitute_args
from ._streams import Flight

if TYPE_CHECKING:
    from ._cudaapi import CudaApi
    from ._turn import Next
    from .cuda import CudaDevice

__all__ = ["Staging", "launch_batch"]


class Staging:
    """A CUDA device's side of a fused launch: its array module, and copies on the launch's stream."""

    def __init__(self, api: CudaApi, index: int, stream: Any) -> None:
        self.api = api
        self.index = index
        self.stream = stream
        self.xp = api.xp
        self.held: list[Any] = []  # pinned staging, alive until the launch's event passed

    def holds(self, obj: Any) -> bool:
        api = self.api
        return isinstance(obj, api.ndarray) and api.device_of(obj) == self.index

    def to_device(self, host: Any) -> Any:
        api = self.api
        pinned = api.empty_pinned(host.shape, host.dtype)
        pinned[...] = host
        self.held.append(pinned)
        array = api.empty(host.shape, host.dtype)  # (from the current stream's arena: the launch's)
        api.h2d(array, pinned, self.stream)
        return array

    def to_host(self, array: Any) -> np.ndarray[Any, Any]:
        pinned = self.api.empty_pinned(array.shape, array.dtype)
        self.api.d2h(array, pinned, self.stream)
        return pinned


def launch_batch(device: CudaDevice, first: Task, ahead: list[Task] | None, kind: Any) -> Next | None:
    """Launch ``first`` (a call with a ``fusion``) with the other ready calls of its fusion as one; what to
    launch next (``rt.launched``)."""
    rt = device.rt
    taken = [(first, ahead), *rt.take_like(device, first)]
    t0 = time.perf_counter()
    flying = device.flying
    parents = []
    for task, behind in taken:
        for parent in rt.ahead(task) if behind is None else behind:
            flight = flying.get(parent)
            if flight is not None:
                parents.append(flight)
    track = device.pick(first, parents)
    stream = track.stream
    for flight in parents:
        if flight.track is not track:
            stream.wait_event(flight.event)
    tasks = [task for task, _ in taken]
    args = [substitute_args(t.args) if t.deps else t.args for t in tasks]
    staging = Staging(device.api, device.index, stream)
    try:
        with stream:
            outcomes, _ = first.fusion.launch(tasks, args, staging)
    except BaseException as exc:  # (launch raises nothing; were it to, no call may stay running)
        outcomes = [(None, exc)] * len(tasks)
    event = device.api.event()  # a fresh one: the flights share it, and none recycles it
    event.record(stream)
    held = (args, staging.held)
    flights = []
    for task, (value, error) in zip(tasks, outcomes, strict=True):
        flight = Flight(task, track, event, value, held, t0)
        flight.error, flight.shared = error, True
        flying[task] = flight
        flights.append(flight)
    device.turn.learn(kind, time.perf_counter() - t0)
    for task, flight in zip(tasks[:-1], flights, strict=False):
        rt.launched(task, None if flight.error is not None else flight.value)
    nxt = rt.launched(tasks[-1], None if flights[-1].error is not None else flights[-1].value, device)
    for flight in flights:
        track.push(flight)
    return nxt
