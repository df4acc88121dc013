"""Status: what the frontend reads of the runtime (counts, load, limits, busy time) and the trace it records."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import SchedsvcError
from .._timeline import Timeline

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._core import Task
    from ._device import Device
    from ._dispatch import Dispatch
    from ._runtime import Runtime

__all__ = ["Status"]


class Status:
    """The runtime's state as the frontend sees it (``eng.stats()``, a repr, a QueueFull message), and
    the attaching of a trace."""

    def __init__(self, rt: Runtime, dispatch: Dispatch) -> None:
        self.rt = rt
        self.core = rt.core
        self.dispatch = dispatch

    def counts(self) -> tuple[int, int, int, int, int, int, int, int, int, int]:
        """(submitted, completed, failed, cancelled, pending, running, waiting admission, pending bytes,
        peak pending bytes, copies made), read together.  The tasks submitted: the copies made for them
        (riding on their slots) are counted apart, their bytes with the rest."""
        core = self.core
        with self.rt.lock:
            copies = core.copies
            return (
                core.submitted - copies["admitted"],
                core.completed - copies["done"],
                core.failed - copies["failed"],
                core.cancelled - copies["cancelled"],
                core.pending - core.riding,
                core.running,
                core.waiting_admission,
                core.pending_bytes,
                core.peak_pending_bytes,
                copies["admitted"],
            )

    def running(self) -> int:
        with self.rt.lock:
            return self.core.running

    def describe(self) -> str:
        """The load, for a repr (read without the lock: a snapshot that may be a moment old)."""
        core = self.core
        return (
            f"pending={core.pending - core.riding}/{core.max_pending} running={core.running} "
            f"bytes={core.pending_bytes}/{core.max_pending_bytes}"
        )

    def writer_of(self, key: int) -> Task | None:
        """The last unfinished task queued to write the memory ``key`` (a Tensor made over it waits for it)."""
        with self.rt.lock:
            return self.core.writer_of(key)

    def may_run_now(self, key: int, nbytes: int) -> bool:
        """May a call that reads the memory ``key`` and holds ``nbytes`` run at once on its caller's thread:
        the engine is under its limits (a call made at them goes through the door, which refuses or queues
        it), and no unfinished task is queued to write that memory (it must run after it)?  Read without the
        lock: a hint, as any answer is once the lock is released; what it lets run holds nothing."""
        core = self.core
        return core.has_room(nbytes) and core.writer_of(key) is None

    def has_room(self, nbytes: int, device: str | None = None) -> bool:
        """Would a submission holding ``nbytes`` new bytes be admitted now: room under ``max_pending`` and
        ``max_pending_bytes``, nobody queued ahead, and room in the byte budget (``max_device_bytes``) of
        ``device`` -- or, with None, of every device that has one."""
        rt = self.rt
        with rt.lock:
            if not self.core.has_room(nbytes):
                return False
            for name, memory in rt.metered:  # (empty unless some device has a byte budget)
                if (device is None or name == device) and not self._device_room(name, memory, nbytes):
                    return False
            return True

    def _device_room(self, name: str, memory: Device, nbytes: int) -> bool:
        """With the lock held: room for ``nbytes`` more in ``name``'s byte budget, counted as admission
        counts it (its unfinished tasks' bytes and what its memory holds); a device with work in flight
        that is at its budget has none, as ``throttle`` sees it."""
        pending, held, budget = self._device_bytes(name, memory)
        return held + nbytes <= budget and (held < budget or not pending)

    def _device_bytes(self, name: str, memory: Device) -> tuple[int, int, int]:
        """With the lock held: ``name``'s pending bytes, the bytes held against its budget, its budget."""
        core = self.core
        pending = core.device_pending_bytes(name)
        return pending, pending + memory.used_bytes(), core.max_device_bytes[name]

    def _metered(self, name: str) -> Device | None:
        """The device ``name`` if it has a byte budget (``max_device_bytes``)."""
        for metered, memory in self.rt.metered:
            if metered == name:
                return memory
        return None

    def limits_text(self, task: Task | None = None) -> str:
        """The limits and what holds them, for a QueueFull message; with ``task``, also the byte budget
        of its device, if it has one."""
        core = self.core
        held = f", {core.reserved} slots held by throttle() callers" if core.reserved else ""
        text = (
            f"{core.pending - core.riding}/{core.max_pending} tasks{held}, "
            f"{core.pending_bytes}/{core.max_pending_bytes} bytes, {core.waiting_admission} waiting"
        )
        memory = None if task is None else self._metered(task.device)
        if task is None or memory is None:
            return text
        with self.rt.lock:
            _, device_held, budget = self._device_bytes(task.device, memory)
        return f"{text}; {task.device}: {device_held:,}/{budget:,} bytes of max_device_bytes"

    def device_full(self, task: Task) -> tuple[int, int] | None:
        """The bytes held against, and the byte budget of, ``task``'s device if that budget is what kept
        ``task`` out (the device is at its budget, or the engine's limits had room for all of its bytes);
        None if the engine's limits did."""
        memory = self._metered(task.device)
        if memory is None:
            return None
        footprint = task.out_bytes + sum(buffer[1] for buffer in task.buffers)
        with self.rt.lock:
            _, held, budget = self._device_bytes(task.device, memory)
            full = held >= budget or self.core.has_room(footprint)
        return (held, budget) if full else None

    def launches(self) -> dict[str, int]:
        """Tasks launched per stream, of every device."""
        found: dict[str, int] = {}
        for device in self.rt.devices.values():
            found.update(device.launches())
        return found

    def sweeps(self) -> dict[str, int]:
        """Completion reports per stream, of every device."""
        found: dict[str, int] = {}
        for device in self.rt.devices.values():
            found.update(device.sweeps())
        return found

    def busy_seconds(self) -> dict[str, float]:
        """Seconds spent running tasks per worker track, of every device."""
        busy: dict[str, float] = {}
        for device in self.rt.devices.values():
            busy.update(device.busy_seconds())
        return busy

    def latency_histograms(self) -> tuple[Mapping[float, int], float, Mapping[float, int], float]:
        """The tasks run here by queue wait and by run time, cumulative, with their sums (``Latencies``)."""
        with self.rt.lock:
            return self.rt.latencies.histograms()

    # -- a trace ---------------------------------------------------------------------

    def attach(self, timeline: Timeline) -> None:
        """Record into ``timeline`` from now on (one at a time)."""
        rt = self.rt
        with rt.lock:
            if rt.timeline is not None:
                raise SchedsvcError(
                    f"a trace is already being recorded to {rt.timeline.path!r}; one trace at a time "
                    "(Config(trace_path=...) records the whole life of the engine)"
                )
            self._record(timeline)
            self.core.edges = timeline.edges
            timeline.on_full = self._stop_edges  # past the cap: memory stays bounded
            timeline.loop_thread = rt.loop_thread
            timeline.sample(self.core)

    def detach(self) -> Timeline:
        """Stop recording; return the timeline."""
        rt = self.rt
        with rt.lock:
            timeline = rt.timeline
            assert timeline is not None
            timeline.sample(self.core)
            self._record(None)
            self.core.edges = None
        return timeline

    def _record(self, timeline: Timeline | None) -> None:
        """With the lock held: ``timeline`` is the one the scheduling events (``collect``) and the tasks
        run here (``Dispatch.execute``) are recorded into."""
        self.rt.timeline = self.dispatch.timeline = timeline

    def _stop_edges(self) -> None:
        """A trace reached its cap: the scheduler stops listing dependency edges (called without the lock)."""
        with self.rt.lock:
            self.core.edges = None
