"""The runtime: the one door to the scheduling core and its lock.

Frontend calls (submit, cancel, throttle, waitall, stats) and device reports
(take, finish) arrive here; each takes the lock, applies core events, and
routes what they produced (``Runtime.collect``): wake a parked worker, resolve
a future, admit a waiter.  Nothing outside ``_runtime/`` and ``_core/`` touches
the core or the lock.

``Runtime`` holds what every part shares (the core, the lock, the bridge, the
devices) and routes the core's instructions; each job is a part of its own,
sharing that lock and core:

* ``Admission`` (``_admission``, the runtime's ``door``): the door every submission goes through
  (``rt.door.admit``: the frontends call it directly, on the hot path), the
  admission queue and ``throttle``, and the staging of the loop thread's
  submissions;
* ``DeviceCopies`` (``_copies``): the copy tasks a submission needs on devices
  with memory of their own, made as part of its admission;
* ``Dispatch`` (``_dispatch``): the devices' side -- take ready work, run
  it, record how it ended;
* ``Waiting`` (``_waiting``): for a task (or running it on the waiting thread),
  for every task, for a state;
* ``Closing`` (``_closing``): close, drain or cancel, stop the devices;
* ``Status`` (``_status``): counts, load and limits for the frontend, and the
  trace being recorded.

The frontend and the devices call the runtime only: its entry points are the
parts' own methods, bound on it once (no frame of the runtime's in between).
The parts call one another, and ``collect``, directly.

What the event loop must learn goes through the bridge (``_bridge``).
Threads blocked in ``result()`` wait on a plain lock that the finishing
worker releases directly, and a coroutine awaiting on another event loop is
woken on its own loop directly (``settle``), so neither needs the engine's
loop.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core import Scheduler, Task
from .._errors import EngineClosed
from .._telemetry import Latencies
from .._timeline import Timeline
from ._admission import Admission
from ._bridge import Bridge, open_bridge, settle, unwatch
from ._closing import Closing
from ._copies import DeviceCopies
from ._dispatch import Dispatch
from ._scan import register_buffer_types
from ._status import Status
from ._waiting import Waiting

if TYPE_CHECKING:
    from ._device import Device

__all__ = ["Runtime"]

_LockType = type(threading.Lock())


# what every part shares
_SHARED = (
    "core",
    "sync_mode",
    "lock",
    "metered",
    "bridge",
    "loop",
    "devices",
    "_pools",
    "anywhere",
    "forwarding",
    "preparers",
    "timeline",
    "worker_threads",
    "loop_thread",
    "queue_waits",
    "latencies",
    "record_latencies",
    "forked",
    "other_loops",
    "remote",
    "_costs",
    "_conditions",
    "_recheck_soon",
)
# the parts
_PARTS = (
    "door",
    "_dispatch",
    "_waiting",
)
# the entry points: the parts' methods, bound once
_ENTRY_POINTS = (
    "wait",
    "running_loop",
    "admit",
    "hold",
    "admission",
    "admitted",
    "throttle",
    "flush",
    "worker_started",
    "next_task",
    "unpark",
    "take_all",
    "claim",
    "execute",
    "finish",
    "launch_first",
    "take_ready",
    "take_like",
    "launched",
    "complete",
    "complete_all",
    "ahead",
    "data_parents",
    "run_inline",
    "wait_blocking",
    "watch_off_loop",
    "add_done_callback",
    "remove_done_callback",
    "on_loop_thread",
    "barrier",
    "until",
    "shutdown",
    "join",
    "close",
    "settled",
    "cancel_pending",
    "stop",
    "stop_when_idle",
    "aclose_devices",
    "after_fork",
    "counts",
    "running",
    "describe",
    "has_room",
    "may_run_now",
    "writer_of",
    "limits_text",
    "device_full",
    "launches",
    "sweeps",
    "busy_seconds",
    "latency_histograms",
    "attach",
    "detach",
)


class Runtime:
    """Scheduler + lock + devices + loop bridge: the one door to the core, for the frontend and the
    devices alike.  Each entry point takes the lock, applies core events, and acts on what they
    produced (``collect``) once the lock is released.

    Its attributes are slots: what the frontend reads on every submission and await (``sync_mode``,
    ``bridge``, ``worker_threads``, ...) and the parts' entry points bound here stay a slot read
    however many there are (an instance dict past 30 keys makes every attribute read and method
    call on it slower)."""

    __slots__ = (*_SHARED, *_PARTS, *_ENTRY_POINTS, "__weakref__")

    def __init__(
        self,
        core: Scheduler,
        inline_threshold_s: float = 0.0,
        refusal: Callable[[], BaseException] | None = None,
        sync_mode: bool = False,
        latency_histograms: bool = False,
        gone: Callable[[], BaseException] | None = None,
    ) -> None:
        self.core = core
        self.record_latencies = latency_histograms  # record each task's wait and run time (Dispatch)
        self.sync_mode = sync_mode  # debugging: every task runs at its submission, in the caller
        self.lock = threading.Lock()
        #: the bridge for the async library that runs the engine's start (asyncio, trio)
        self.bridge = open_bridge(self)
        self.loop = self.bridge.loop  # the asyncio loop; None on trio
        #: ``await rt.wait(task)``: wait on the event loop until ``task`` is final (the bridge's own
        #: method, bound here: no frame of the runtime's on the path of every await)
        self.wait = self.bridge.wait
        #: ``asyncio._get_running_loop()``, read without its system call where the engine's loop runs here
        self.running_loop = self.bridge.running_loop
        self.devices: dict[str, Device] = {}
        self._pools: list[tuple[Device, Any]] = []  # (device, its ready queue), for collect()
        #: devices with a byte budget: their allocators are read (``meter``) before admissions and
        #: completions, so the budget counts the results user code still references
        self.metered: list[tuple[str, Device]] = []
        self.anywhere: set[str] = set()  # devices whose queued task any thread may run itself
        self.forwarding: dict[str, Device] = {}  # devices told of tasks admitted waiting (admitted)
        self.timeline: Timeline | None = None  # set while a trace is recorded (eng.trace)
        self.worker_threads: set[int] = set()  # idents of threads that run tasks
        self.loop_thread = threading.get_ident()
        self.queue_waits: deque[float] = deque(maxlen=8192)
        self.latencies = Latencies()  # every task run here: waits and run times, by bucket (under the lock)
        self.forked = False  # this is a child process forked after the engine started: nothing runs here
        #: has a coroutine on another event loop awaited a task of this engine, or a thread (a ThreadToken,
        #: a gate of ``result()``) waited for one?  From then on, collect looks for watchers to wake off this loop
        self.other_loops = False
        self.remote = False  # tasks run in other processes (Dask): values are Remote handles

        # the parts, each sharing the lock and the core
        copies = DeviceCopies()
        #: devices with memory of their own (``DeviceCopies.prepare``)
        self.preparers = copies.preparers
        #: (code, log2 input bytes) -> seconds, smoothed: learned by Dispatch, read by Waiting
        costs: dict[Any, float] = {}
        self._costs = costs
        #: why a closed engine takes no work (the frontend's message), raised by the door with the lock
        #: held: it must have no side effect (never take the lock)
        refusal = refusal or (lambda: EngineClosed("the engine is closed"))
        #: why the engine takes no work once its loop has closed, raised by the door without the lock (the
        #: frontend stops the engine first: it may take the lock)
        gone = gone or refusal
        admission = self.door = Admission(self, copies, refusal, gone)
        dispatch = self._dispatch = Dispatch(self, admission, inline_threshold_s, costs)
        waiting = self._waiting = Waiting(self, dispatch, costs)
        closing = Closing(self, admission, dispatch, waiting)
        status = Status(self, dispatch)
        self._conditions = waiting.conditions  # (collect: does anybody wait for a state?)
        self._recheck_soon = waiting.recheck_soon

        # the entry points, bound once
        # -- submissions
        self.admit = admission.admit
        self.hold = admission.hold
        self.admission = admission.admission
        self.admitted = admission.admitted
        self.throttle = admission.throttle
        self.flush = admission.flush
        # -- the devices' door
        self.worker_started = dispatch.worker_started
        self.next_task = dispatch.next_task
        self.unpark = dispatch.unpark
        self.take_all = dispatch.take_all
        self.claim = dispatch.claim
        self.execute = dispatch.execute
        self.finish = dispatch.finish
        self.launch_first = dispatch.launch_first
        self.take_ready = dispatch.take_ready
        self.take_like = dispatch.take_like
        self.launched = dispatch.launched
        self.complete = dispatch.complete
        self.complete_all = dispatch.complete_all
        self.ahead = dispatch.ahead
        self.data_parents = dispatch.data_parents
        # -- waiting
        self.run_inline = waiting.run_inline
        self.wait_blocking = waiting.wait_blocking
        self.watch_off_loop = waiting.watch_off_loop
        self.add_done_callback = waiting.add_done_callback
        self.remove_done_callback = waiting.remove_done_callback
        self.on_loop_thread = waiting.on_loop_thread
        self.barrier = waiting.barrier
        self.until = waiting.until
        # -- closing
        self.shutdown = closing.shutdown
        self.join = closing.join
        self.close = closing.close
        self.settled = closing.settled
        self.cancel_pending = closing.cancel_pending
        self.stop = closing.stop
        self.stop_when_idle = closing.stop_when_idle
        self.aclose_devices = closing.aclose_devices
        self.after_fork = closing.after_fork
        # -- state, for the frontend
        self.counts = status.counts
        self.running = status.running
        self.describe = status.describe
        self.has_room = status.has_room
        self.writer_of = status.writer_of
        self.may_run_now = status.may_run_now
        self.limits_text = status.limits_text
        self.device_full = status.device_full
        self.launches = status.launches
        self.sweeps = status.sweeps
        self.busy_seconds = status.busy_seconds
        self.latency_histograms = status.latency_histograms
        self.attach = status.attach
        self.detach = status.detach

    def add_device(self, name: str, device: Device) -> None:
        self.devices[name] = device
        if name in self.core.max_device_bytes:
            self.metered.append((name, device))
        self._pools.append((device, self.core.queues[name]))
        self.door.eager_left += device.eager
        if not device.staged:
            self.door.unstaged.add(name)
        register_buffer_types(device.buffer_types)
        if device.runs_anywhere:
            self.anywhere.add(name)
        if device.forwards:
            self.forwarding[name] = device
        if device.prepares:
            self.preparers[name] = device
        door = self.door
        door.plain = not (door.sync_mode or self.preparers or self.metered or self.forwarding)
        if not device.local:
            self.remote = True
            # no task runs in this process: none runs inline
            self._dispatch.inline_threshold_s = self._waiting.inline_threshold_s = 0.0

    @property
    def closed(self) -> bool:
        """Does the engine take no more work (nested work of running tasks still gets in)?"""
        return self.door.closed

    @property
    def claim_writes(self) -> Callable[[Task, Any], None]:
        """The frontend's own registration of a task's writes (``claim(task, claims)``: the Tensors it
        writes), made by the door once the task is admitted or queued, never for one it refuses."""
        return self.door.claim_writes

    @claim_writes.setter
    def claim_writes(self, claim: Callable[[Task, Any], None]) -> None:
        self.door.claim_writes = claim

    @property
    def pending(self) -> int:
        """Tasks admitted and not final (read without the lock: one int)."""
        return self.core.pending - self.core.riding  # (the copies made for them ride on their slots)

    # -- routing the core's instructions ------------------------------------------------

    def collect(self) -> Callable[[], None] | None:
        """Route the core's instructions; return what to do once the lock is released."""
        core = self.core
        timeline = self.timeline
        if timeline is not None:  # Timeline.sample, inlined: this runs at every scheduling event
            timeline.counters.extend((time.perf_counter(), core.pending, core.pending_bytes))
        wakes: list[Callable[[], None]] | None = None  # hot path: most calls route nothing
        if core.out:
            wakes = []
            bridge = self.bridge
            items = core.drain()
            foreign = False
            elsewhere = self.other_loops  # (hot path: nobody waits off the loop, no look per task)
            for item in items:
                if item[0] == "resolve":
                    if elsewhere and self._resolve_elsewhere(item[1], wakes):
                        foreign = True  # nobody waits on the loop: it is not woken for this task
                elif bridge.foreign(item[1]):  # a token awaited on another loop: woken there
                    wakes.append(functools.partial(settle, item[1]))
                    foreign = True
            if foreign:
                items = _without_foreign(items, bridge)
            if items:
                bridge.post(items, wakes)
        for device, queue in self._pools:
            if not device.hungry or not (queue.count or queue.held):
                continue
            wake = device.dispatch(queue.runs() if queue.fusions else queue.count)
            if wake is not None:
                if wakes is None:
                    wakes = []
                wakes.append(wake)
        if self._conditions:  # somebody waits for a state (until): re-check it on the loop, off the lock
            if wakes is None:
                wakes = []
            wakes.append(self._recheck_soon)
        if not wakes:
            return None
        if len(wakes) == 1:
            return wakes[0]
        return functools.partial(_call_all, wakes)  # (a lambda would make `wakes` a cell at every call)

    def meter(self) -> None:
        """With the lock held: tell the core what each budgeted device's memory holds now."""
        core = self.core
        for name, device in self.metered:
            core.device_used(name, device.used_bytes())

    def under_lock(self, event: Callable[..., Any], *args: Any) -> Any:
        """Apply one core event (off the hot path), then act on what it produced."""
        with self.lock:
            result = event(*args)
            after = self.collect()
        if after is not None:
            after()
        return result

    def _resolve_elsewhere(self, task: Task, wakes: list[Callable[[], None]]) -> bool:
        """Wake who waits for ``task`` outside this loop (threads, other loops) directly, not through it;
        True if that was everyone (the loop has nothing to do for it).

        A thread's gate or token, or a future of another loop, is also taken off the task's watchers
        (rare), so this loop's drain fires only its own, and a task only threads wait for does not wake
        the loop at all.
        """
        elsewhere = False
        other_loops = self.other_loops
        for watcher in task.watchers or ():
            if type(watcher) is _LockType:
                wakes.append(watcher.release)
                elsewhere = True
            elif other_loops and self.bridge.foreign(watcher):
                wakes.append(functools.partial(settle, watcher))
                elsewhere = True
        if elsewhere:
            foreign = self.bridge.foreign
            task.watchers = [
                w for w in task.watchers or () if type(w) is not _LockType and not foreign(w)
            ] or None
            return task.watchers is None
        return False

    def unwatch(self, task: Task, watcher: Any) -> None:
        """``watcher`` gave up waiting on ``task`` (the await it was made for ended otherwise)."""
        with self.lock:
            unwatch(task, watcher)

    def cancel(self, task: Task) -> bool:
        """Cancel ``task`` (and what takes its value) if it has not started; True if it is cancelled,
        or its device cancelled it where it was sent."""
        self.under_lock(self.core.cancel, task)
        device = self.devices.get(task.device)
        sent = device is not None and device.cancel(task)  # (sent ahead while waiting, say)
        return task.state == "cancelled" or sent


def _without_foreign(items: list[tuple[str, Any]], bridge: Bridge) -> list[tuple[str, Any]]:
    """The instructions for the engine's loop: tokens of other loops (and threads' tokens) are woken
    directly, and a task whose every watcher was is left out."""
    return [
        item
        for item in items
        if (item[1].watchers is not None if item[0] == "resolve" else not bridge.foreign(item[1]))
    ]


def _call_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()
