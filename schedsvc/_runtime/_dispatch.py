"""Dispatch: the devices' side of the runtime -- taking ready work, running it, recording outcomes.

A thread device's workers ask ``next_task`` for work and park when there is
none; ``execute`` runs a task on the calling thread and records its outcome,
taking the next task under the same lock hold.  Devices that run work
elsewhere report through ``finish``, and asynchronous devices (CUDA streams)
through ``launched`` and ``complete``.  This is the hot path: each method is
written for speed.
"""

from __future__ import annotations

import time
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol

from .._core import FINAL_STATES, Task
from .._telemetry import Latencies
from ._scan import substitute, substitute_args
from ._threads import acquire_contended
from ._waiting import MAX_COST_KEYS, cost_key

if TYPE_CHECKING:
    from ._admission import Admission
    from ._device import Device
    from ._runtime import Runtime

__all__ = ["Dispatch", "Fusion", "Staging"]

#: how long tasks staged on the loop's thread wait for the loop to hand them over before a worker
#: with nothing to do takes them itself (the loop is busy: it has not come round to its flush)
_STALE_S = 0.002


class Staging(Protocol):
    """What a device with memory of its own gives a fused launch (``Fusion.launch``) to place arrays:
    its array module, and copies between host and device memory enqueued on the launch's stream."""

    #: the device's array module (CuPy's names), enqueueing on the launch's stream
    xp: Any

    def holds(self, obj: Any) -> bool:
        """Is ``obj`` an array in this device's memory?"""
        ...

    def to_device(self, host: Any) -> Any:
        """The host array ``host`` copied to the device (enqueued; staged through pinned memory that the
        launch keeps alive until its work has passed)."""
        ...

    def to_host(self, array: Any) -> Any:
        """The device array ``array`` copied to a new host array (enqueued: the values are there once the
        launch's work has passed)."""
        ...


class Fusion(Protocol):
    """What a task's ``fusion`` is: how the ready tasks that share it run as one, on the worker that took
    one of them (``Runtime.execute``), or launch as one on the device that took one of them (``launch``).
    It is compared by identity."""

    #: the most weight one run takes
    limit: int

    def weight(self, task: Task) -> int:
        """The share of ``limit`` that ``task`` takes (its rows, say)."""
        ...

    def run(
        self, tasks: list[Task], args: list[Any]
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        """Run ``tasks`` (their arguments, values in place of futures, are ``args``) as one; each one's
        (value, error), in order, and what the trace shows of the run.  Raises nothing."""
        ...

    def launch(
        self, tasks: list[Task], args: list[Any], staging: Staging
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        """Launch ``tasks`` as one on a device that queues work asynchronously, its stream current (``run``'s
        contract, on ``staging``'s device): each value is computed once the launch's work has passed."""
        ...


class Dispatch:
    """What the devices call: take ready tasks, run them here or report how they ran elsewhere.

    It holds its own references to what a task reads (the runtime's lock, core and shared tables:
    worker threads, queue waits, learned costs), and calls the runtime's ``collect`` through ``rt``;
    ``timeline`` and ``inline_threshold_s`` are set here together with the runtime's own (``Status``,
    ``Runtime.add_device``, ``Closing.after_fork``).
    """

    def __init__(
        self, rt: Runtime, staging: Admission, inline_threshold_s: float, costs: dict[Any, float]
    ) -> None:
        self.rt = rt
        self.lock = rt.lock
        self.core = rt.core
        self.worker_threads = rt.worker_threads
        self.queue_waits = rt.queue_waits
        self.latencies = rt.latencies
        #: record each task's wait and run time into the histograms (``Config.latency_histograms``)?
        self.record = rt.record_latencies
        self.add_wait = rt.latencies.waits.append  # bound once: a task appends its wait and run time
        self.add_run = rt.latencies.runs.append
        self.timeline = rt.timeline
        self.collect = rt.collect
        self.inline_threshold_s = inline_threshold_s  # learn costs only where a cheap task runs inline
        self._costs = costs  # (code, log2 input bytes) -> seconds, smoothed; read by Waiting
        self.staging = staging  # (a busy loop's staged tasks are taken here: next_task)
        #: (the core's count of admitted tasks, when a worker last saw it change): unchanged for _STALE_S
        #: with the flush still pending, the loop is blocked, not staging a burst
        self.staged_seen = (0, 0.0)
        #: a worker's fused task -> the ready tasks of its fusion taken with it, under the lock hold that took
        #: it: a second worker woken for the same burst finds none of them, so no batch shrinks to one call
        self.joined: dict[Task, list[Task]] = {}

    # -- taking work -----------------------------------------------------------------

    def worker_started(self) -> None:
        with self.lock:
            self.worker_threads.add(get_ident())

    def next_task(self, device: Device, worker: Any) -> Task | bool | float | None:
        """A worker of ``device`` asks for work: a task (running now), None (it is parked: wait for
        its wake-up), False (it leaves: ``device.leaving`` said so), or a number of seconds: it is
        parked, but tasks staged on the loop's thread wait to be handed over -- if no wake-up comes
        within that time, it says so (``unpark``) and asks again.  Staged tasks are taken here once the
        engine has admitted nothing new for ``_STALE_S`` and the loop has not come round to its flush: a loop kept
        busy (a long synchronous handler, a notebook cell that does not await) does not hold back the
        work queued before, and a loop staging a burst is not raced for the GIL."""
        after = None
        park = None
        with self.lock:
            core = self.core
            if device.leaving(worker, core.queues[device.name].count):
                self.worker_threads.discard(get_ident())
                return False
            task = core.take(device.name)
            if task is not None and task.fusion is not None:
                self._join(task)
            if task is None and device.parks_timed and self.staging.flush_scheduled:
                count, now = core.submitted, time.perf_counter()
                if count != self.staged_seen[0]:  # the loop is submitting (a burst): look again later
                    self.staged_seen = (count, now)
                    park = _STALE_S
                elif (waited := now - self.staged_seen[1]) < _STALE_S:
                    park = _STALE_S - waited
                elif core.staged:  # nothing staged for _STALE_S, and no flush: the loop is blocked
                    core.publish()
                    task = core.take(device.name)
                    if task is not None and task.fusion is not None:
                        self._join(task)
                    after = self.collect()  # (the other devices' workers, for what was theirs)
                else:
                    park = _STALE_S * 5  # (until the loop stages, or its flush comes)
            if task is None:  # parked: dispatch() wakes it
                device.idle.append(worker)
                device.hungry = True
        if after is not None:
            after()
        return task if task is not None else park

    def unpark(self, device: Device, worker: Any) -> bool:
        """A worker parked with a time limit (``next_task``) woke without being notified: True if it is
        no longer parked; False if it was notified meanwhile -- its wake-up is on its way, and the
        worker must take it (acquire its park lock) before it asks for work again."""
        with self.lock:
            if worker not in device.idle:
                return False
            device.idle.remove(worker)
            device.hungry = bool(device.idle)
            return True

    def take_all(self, device: Device) -> list[Task]:
        """Every ready task of ``device``, taken (running now); the device is ``hungry``
        again, under the same lock hold, so no task made ready later goes unnoticed."""
        tasks = []
        with self.lock:
            take = self.core.take
            while (task := take(device.name)) is not None:
                tasks.append(task)
            device.hungry = True
        return tasks

    def claim(self, task: Task) -> bool:
        """Take a queued ready task to run on this thread (ready -> running)."""
        with self.lock:
            return self.core.claim(task)

    # -- running one task here ---------------------------------------------------------

    def execute(self, task: Task, chain: bool = True) -> Task | None:
        """Run a ``running`` task here, record the outcome; return the task to run next.

        On a worker (``chain=True``) that is a dependent this task made ready,
        or else the next queued task of the device, taken under the same lock
        hold as the finish (one lock round trip per task, not two).
        ``chain=False`` (a thread that is not a worker, or one that runs a task it
        waits on): dependents go to the queue and nothing is taken.  On a worker, a
        task with a ``fusion`` runs with the others of it that are ready (``_execute_fused``).
        """
        if task.fusion is not None and chain:  # hot path: the one check a task pays for fusion
            return self._execute_fused(task)
        t0 = time.perf_counter()
        self.queue_waits.append(t0 - task.t_ready)
        key = None
        if self.inline_threshold_s and (task.watchers is not None or not chain):
            try:
                key = cost_key(task)
                hash(key)
            except Exception:  # user code raising in __hash__/__getattr__: just do not learn
                key = None
        guest = not chain and self._enter_guest()
        try:
            if task.deps:
                if task.kwargs:
                    value = task.fn(*substitute_args(task.args), **substitute(task.kwargs))
                else:
                    value = task.fn(*substitute_args(task.args))
            elif task.kwargs:
                value = task.fn(*task.args, **task.kwargs)
            else:
                value = task.fn(*task.args)
            error = None
        except BaseException as exc:  # the task's failure is its result, whatever it is
            value, error = None, exc
            if exc.__traceback__ is not None:  # without this frame, whose `task` would make a cycle
                exc.__traceback__ = exc.__traceback__.tb_next  # (error -> frame -> task -> error)
        if guest:
            self.worker_threads.discard(get_ident())
        timeline = self.timeline
        record = self.record  # (off by default: two appends a task are 4% of the hot path)
        if key is not None or timeline is not None or record:  # (no clock read otherwise)
            t1 = time.perf_counter()
            if timeline is not None:
                timeline.span(task, t0, t1, error)
            if key is not None:
                elapsed = t1 - t0
                old = self._costs.get(key)
                if old is None and len(self._costs) >= MAX_COST_KEYS:
                    self._costs.clear()
                self._costs[key] = elapsed if old is None else 0.7 * old + 0.3 * elapsed
        lock = self.lock
        if not lock.acquire(False):
            acquire_contended(lock)
        try:
            if record:
                self.add_wait(t0 - task.t_ready)
                self.add_run(t1 - t0)
                if len(self.latencies.waits) >= Latencies.FOLD:
                    self.latencies.fold()
            nxt = self.core.finish(task, value, error, chain)
            if nxt is None and chain:
                nxt = self.core.take(task.device)
                if nxt is not None and nxt.fusion is not None:
                    self._join(nxt)
            after = self.collect()
        finally:
            lock.release()
        if after is not None:
            after()
        return nxt

    def _execute_fused(self, first: Task) -> Task | None:
        """On a worker: take the ready tasks of ``first``'s fusion too, run them as one, and finish each
        with its own outcome; return the task to run next, as ``execute`` does."""
        fusion: Fusion = first.fusion
        core = self.core
        with self.lock:
            tasks = [first, *self.joined.pop(first, ())]
            room = fusion.limit - sum(map(fusion.weight, tasks))
            tasks += core.take_like(first.device, fusion, room, fusion.weight)
        t0 = time.perf_counter()
        waits = [t0 - task.t_ready for task in tasks]
        self.queue_waits.extend(waits)
        try:
            args = [substitute_args(t.args) if t.deps else t.args for t in tasks]
            outcomes, described = fusion.run(tasks, args)
        except BaseException as exc:  # (run raises nothing; were it to, no task may stay running)
            outcomes, described = [(None, exc)] * len(tasks), {}
        t1 = time.perf_counter()
        timeline = self.timeline
        if timeline is not None:
            timeline.fused_span(first, t0, t1, described)
        lock = self.lock
        if not lock.acquire(False):
            acquire_contended(lock)
        try:
            if self.record:
                for wait in waits:
                    self.add_wait(wait)
                    self.add_run(t1 - t0)
                if len(self.latencies.waits) >= Latencies.FOLD:
                    self.latencies.fold()
            nxt = core.finish_all(tasks, outcomes)  # (the last one may hand on a dependent to run here)
            if nxt is None:
                nxt = core.take(first.device)
                if nxt is not None and nxt.fusion is not None:
                    self._join(nxt)
            after = self.collect()
        finally:
            lock.release()
        if after is not None:
            after()
        return nxt

    def _join(self, first: Task) -> None:
        """With the lock held, a worker took ``first``: the ready tasks of its fusion go with it."""
        fusion: Fusion = first.fusion
        room = fusion.limit - fusion.weight(first)
        self.joined[first] = self.core.take_like(first.device, fusion, room, fusion.weight)

    def _enter_guest(self) -> bool:
        """A thread that is not a worker runs a task: submissions it makes meanwhile are nested."""
        ident = get_ident()
        if ident in self.worker_threads:
            return False
        self.worker_threads.add(ident)
        return True

    # -- outcomes of work run elsewhere ------------------------------------------------

    def finish(self, task: Task, value: Any, error: BaseException | None, cancelled: bool = False) -> str:
        """Record the outcome of a task that ran elsewhere; returns the state it was in.

        Only a ``running`` task is finished (``cancelled``: the device dropped it unrun, and it ends
        as an unstarted task cancelled here would).  A final one (failed through a parent, cancelled)
        is left alone; a task not yet running (sent ahead) is the device's to keep until it is.
        """
        with self.lock:
            state = task.state
            if state != "running":
                return state
            if self.rt.metered:
                self.rt.meter()
            if cancelled:
                self.core.finish_cancelled(task)
            else:
                self.core.finish(task, value, error, False)
            after = self.collect()
        if after is not None:
            after()
        return state

    def take_ready(self, device: Device) -> tuple[Task, list[Task] | None] | None:
        """With the runtime's lock held (a device's ``dispatch``): the next ready task of ``device`` (running
        now), with what it goes behind, for the thread that will launch it once the lock is released; or
        None.  Saves that thread a round trip through the lock (``launch_first``)."""
        core = self.core
        task = core.take(device.name)
        return None if task is None else (task, list(core.ahead(task)))

    def launch_first(self, device: Device) -> tuple[Task, list[Task] | None] | None:
        """A device that launches on the thread its ``dispatch`` ran on starts its launches: the next ready
        task of ``device`` (running now), with the launched parents it goes behind (as ``ahead`` gives
        them); or None, and the device is ``hungry`` again under the same lock hold, so a task made ready
        later is dispatched anew."""
        with self.lock:
            core = self.core
            task = core.take(device.name)
            if task is None:
                device.hungry = True
                return None
            return task, list(core.ahead(task))

    def take_like(self, device: Device, first: Task) -> list[tuple[Task, list[Task] | None]]:
        """A device that launches ``first`` (running) takes the other ready tasks of its ``fusion`` too
        (running now, oldest first, within the fusion's limit), each with what it goes behind."""
        fusion: Fusion = first.fusion
        with self.lock:
            core = self.core
            room = fusion.limit - fusion.weight(first)
            return [
                (t, list(core.ahead(t))) for t in core.take_like(device.name, fusion, room, fusion.weight)
            ]

    def launched(
        self, task: Task, value: Any, device: Device | None = None
    ) -> tuple[Task, list[Task] | None] | None:
        """An asynchronous device queued ``task``'s work (behind its parents' work): dependents on the
        same device may now be launched behind it, taking ``value`` (a device array whose contents are
        still being computed) in its place.

        Given the ``device`` whose launches this thread is making, returns what it launches next, under
        the same lock hold: the first dependent this launch made ready, else the next ready task of the
        device (running now, with what it goes behind); or None, and the device is ``hungry`` again."""
        with self.lock:
            task.value = value  # what a dependent launched behind it receives; final at complete
            core = self.core
            if device is None:
                core.launch(task, False)
                behind = None
            else:
                nxt = core.launch(task, True)
                if nxt is None and core.queues[device.name].count:
                    nxt = core.take(device.name)
                if nxt is None:
                    device.hungry = True
                    behind = None
                else:
                    behind = (nxt, list(core.ahead(nxt)))
            after = self.collect()
        if after is not None:
            after()
        return behind

    def complete(self, task: Task, value: Any, error: BaseException | None = None) -> None:
        """A launched task's result is visible to the host (or its device reported ``error``)."""
        self.complete_all([(task, value, error)])

    def complete_all(self, outcomes: list[tuple[Task, Any, BaseException | None]]) -> None:
        """``complete`` for each ``(task, value, error)``, in order, under one hold of the lock (a
        device's sweep of the tasks whose work passed together)."""
        with self.lock:
            if self.rt.metered:
                self.rt.meter()
            complete = self.core.complete
            for task, value, error in outcomes:
                complete(task, value, error)
            after = self.collect()
        if after is not None:
            after()

    def ahead(self, task: Task) -> list[Task]:
        """The launched parents on its device that a ready or running ``task`` launches behind."""
        with self.lock:
            return list(self.core.ahead(task))

    def data_parents(self, task: Task) -> list[Task] | None:
        """The unfinished data parents of a waiting ``task``, if they are all it waits for (no hazard
        edge holds it); None otherwise."""
        with self.lock:
            if task.state != "waiting":
                return None
            parents = [d for d in task.deps if d.state not in FINAL_STATES]
            return parents if len(parents) == task.n_waiting else None
