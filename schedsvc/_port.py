"""``Port``: the declared interface between an Engine and the frontend parts built on it.

Futures, Tensors, compiled functions and ``eng.map`` pipelines hold an
engine's Port, not the Engine: everything they may ask of it is a method or
attribute here -- the runtime's entry points they call while the engine runs
(or why it does not), its devices, the Tensor memory tracking, the compile
counters.  The Port starts the runtime and holds it; nothing above it holds
the runtime object.  The Engine owns the Port and drives its life (``start``,
``closed``, ``abandon``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._core import Scheduler, Task
from ._errors import FORKED, DeviceError, EngineClosed, InvalidTask
from ._runtime import Runtime
from .compile import Counts
from .devices import Device, check_device, device_class_for, resolve, scheduler_options

if TYPE_CHECKING:
    from ._config import Config
    from ._engine import Engine
    from ._timeline import Timeline
    from .tensor import TensorMemory

__all__ = ["LOOP_CLOSED", "Port", "port_of", "warn_unclosed"]

LOOP_CLOSED = "loop closed"
_FORKED = "forked"

#: the runtime's entry points the frontend calls, bound on the Port when the engine starts (before, each
#: raises why the engine takes no work); ``Runtime`` documents each
_CALLS = (
    "add_done_callback",
    "admission",
    "admit",
    "attach",
    "barrier",
    "busy_seconds",
    "cancel",
    "counts",
    "detach",
    "device_full",
    "has_room",
    "hold",
    "join",
    "latency_histograms",
    "launches",
    "limits_text",
    "may_run_now",
    "on_loop_thread",
    "remove_done_callback",
    "run_inline",
    "running_loop",
    "shutdown",
    "sweeps",
    "throttle",
    "unwatch",
    "wait",
    "wait_blocking",
    "watch_off_loop",
    "writer_of",
)


class Port:
    """An engine's state as its Futures, Tensors, compiled functions and pipelines see it."""

    __slots__ = (
        "__weakref__",
        "_rt",
        "abandoned",
        "base_loop",
        "compile_counts",
        "config",
        "default_device",
        "host_device",
        "loop",
        "loop_thread",
        "loop_watch",
        "memory_devices",
        "queue_waits",
        "remote",
        "state",
        "tensors",
        "vet",
        "worker_threads",
        *_CALLS,
    )

    # the runtime's entry points (``_CALLS``), as the frontend calls them
    add_done_callback: Callable[[Task, Callable[[Any], Any], contextvars.Context | None], None]
    #: ``admission(task, token, riders=())`` (``Admission.admission``)
    admission: Callable[..., Awaitable[None]]
    #: the door: ``admit(task, tid, how, claims=None, counted=None, timeout=None, riders=None)``
    #: (``Admission.admit``)
    admit: Callable[..., Any]
    attach: Callable[[Timeline], None]
    barrier: Callable[[], Awaitable[None]]
    busy_seconds: Callable[[], dict[str, float]]
    cancel: Callable[[Task], bool]
    counts: Callable[[], tuple[int, int, int, int, int, int, int, int, int, int]]
    detach: Callable[[], Timeline]
    device_full: Callable[[Task], tuple[int, int] | None]
    #: ``has_room(nbytes, device=None)`` (``Status.has_room``)
    has_room: Callable[[int, str | None], bool]
    #: ``hold(task, tid)``: a batched call admitted the short way, or False (``Admission.hold``)
    hold: Callable[[Task, int], bool]
    join: Callable[[float], Awaitable[list[threading.Thread]]]
    latency_histograms: Callable[[], tuple[Mapping[float, int], float, Mapping[float, int], float]]
    launches: Callable[[], dict[str, int]]
    may_run_now: Callable[[int, int], bool]
    limits_text: Callable[[Task | None], str]
    on_loop_thread: Callable[[], bool]
    remove_done_callback: Callable[[Task, Callable[[Any], Any]], int]
    run_inline: Callable[[Task], bool]
    #: the asyncio loop running on this thread, or None (``Bridge.running_loop``: no system call where it
    #: is the engine's)
    running_loop: Callable[[], Any]
    shutdown: Callable[[bool, float], Awaitable[list[threading.Thread]]]
    sweeps: Callable[[], dict[str, int]]
    unwatch: Callable[[Task, Any], None]
    throttle: Callable[[], Awaitable[None]]
    wait: Callable[[Task], Awaitable[None]]
    wait_blocking: Callable[[Task, float | None], bool]
    watch_off_loop: Callable[[Task, Callable[[], object]], None]
    writer_of: Callable[[int], Task | None]

    def __init__(self, config: Config, tensors: TensorMemory) -> None:
        self.config = config
        self._rt: Runtime | None = None
        self.state = "new"  # new -> running -> closing -> closed
        self.abandoned = ""  # why the engine stopped without aclose(): its loop closed, or a fork
        self.default_device = config.default_device
        self.tensors = tensors
        self.compile_counts = Counts()  # traces, replays of this engine's compiled functions
        #: a suspended async generator its loop closes when it shuts down (``_lifecycle``)
        self.loop_watch: Any = None
        #: the devices with memory of their own (cuda): a Tensor there is copied in by a task of its own
        self.memory_devices: frozenset[str] = frozenset()
        #: the device a batched call of host arrays alone runs on: the engine's first whose memory is the
        #: host's (else its default device)
        self.host_device = config.default_device
        self.vet: list[Device] = []  # devices that check each task at submission (``check_task``)
        self.loop: Any = None  # the asyncio loop it runs on (None on trio)
        #: that loop is an ``asyncio.BaseEventLoop``, whose ``_thread_id`` says it runs on this thread now
        #: (``running_loop``, inlined where every await comes)
        self.base_loop = False
        self.loop_thread = -1  # that loop's thread
        self.remote = False  # tasks run in other processes (Dask): values are Remote handles
        self.worker_threads: set[int] = set()  # threads that run tasks (their submissions are nested)
        self.queue_waits: Any = ()  # the last tasks' seconds from ready to started
        refuse = _Refuse(self)
        for name in _CALLS:
            setattr(self, name, refuse)

    async def start(self, timeline: Timeline | None) -> None:
        """Start the runtime and the devices of ``config`` on the running event loop."""
        config = self.config
        kinds = resolve(config)
        core = Scheduler(
            max_pending=config.max_pending,
            max_pending_bytes=config.max_pending_bytes,
            devices=config.devices,
            clock=time.perf_counter,
            **scheduler_options(kinds, config),
        )
        rt = Runtime(
            core,
            config.inline_threshold_us / 1e6,
            _refusal(self),
            config.sync_mode,
            latency_histograms=config.latency_histograms,
            gone=_gone(self),
        )
        rt.claim_writes = self.tensors.claim
        for name, kind in kinds.items():
            rt.add_device(name, await kind.open(rt, name, config))
        for device in rt.devices.values():
            device.start()
        self.vet = [d for d in rt.devices.values() if d.vets_tasks]
        for name in _CALLS:
            setattr(self, name, getattr(rt, name))
        self.loop, self.loop_thread, self.remote = rt.loop, rt.loop_thread, rt.remote
        self.base_loop = rt.bridge.base_loop
        self.memory_devices = memory = frozenset(rt.preparers)
        self.host_device = next((d for d in config.devices if d not in memory), config.default_device)
        self.worker_threads, self.queue_waits = rt.worker_threads, rt.queue_waits
        self._rt, self.state = rt, "running"
        if timeline is not None:  # the engine's whole life, written at aclose()
            rt.attach(timeline)

    def __del__(self) -> None:
        """The Engine and every Future, Tensor and compiled function of it are gone, and it was
        never closed: warn, and let its threads finish the queued work and end."""
        rt = self._rt
        if rt is None or self.state != "running":
            return
        text = f"unclosed {self.describe()}"
        self.state = "closed"
        # in a thread of its own: the last reference may go while this thread holds the engine's lock
        with contextlib.suppress(RuntimeError):  # at interpreter exit no thread starts: they die anyway
            threading.Thread(target=rt.stop_when_idle, name="schedsvc-stop", daemon=True).start()
        warn_unclosed(text, self)

    @property
    def started(self) -> bool:
        """Has the engine started (it may have closed since)?"""
        return self._rt is not None

    @property
    def open(self) -> bool:
        """Has the engine started and not closed (nor been abandoned)?"""
        return self._rt is not None and self.state == "running"

    def describe(self) -> str:
        """The engine, for its repr and messages."""
        rt = self._rt
        if rt is None:
            return f"<Engine {self.state} cpu_workers={self.config.cpu_workers}>"
        return f"<Engine {self.state} devices={','.join(self.config.devices)} {rt.describe()}>"

    # -- asked by the frontend ---------------------------------------------------------

    def running(self) -> None:
        """Raise EngineClosed (saying why) unless the engine runs."""
        rt = self._rt
        if rt is None or self.state != "running" or rt.bridge.closed():
            raise self.refusal()

    def in_task(self) -> bool:
        """Is this thread running one of the engine's tasks (its submissions are nested)?"""
        return threading.get_ident() in self.worker_threads

    @property
    def pending(self) -> int:
        """Tasks admitted and not yet final (0 before start)."""
        rt = self._rt
        return 0 if rt is None else rt.pending

    def running_tasks(self) -> int:
        """Tasks running now."""
        rt = self._rt
        return 0 if rt is None else rt.running()

    def window(self, device: str) -> int:
        """Tasks worth keeping in flight on ``device`` (``eng.map``'s default ``max_inflight``)."""
        assert self._rt is not None
        return self._rt.devices[device].window

    def holder(self, array: Any) -> str | None:
        """The engine's device whose own memory holds ``array`` (a device array), if any."""
        assert self._rt is not None
        for name, device in self._rt.preparers.items():
            if device.holds(array):
                return name
        return None

    def to_host(self, device: str) -> Callable[[Any], Any] | None:
        """What copies a value of ``device`` to the host, run on a host thread (None: its values are there)."""
        assert self._rt is not None
        source = self._rt.preparers.get(device)
        return None if source is None else source.to_host

    def loop_closed(self) -> bool:
        """Has the loop the engine started on closed?"""
        return self._rt is not None and self._rt.bridge.closed()

    def tracing_life(self) -> bool:
        """Is the trace of the engine's whole life (``Config.trace_path``) being recorded?"""
        return self._rt is not None and self._rt.timeline is not None

    def spawn(self, fn: Callable[[], Any], name: str, interruptible: bool = False) -> Any:
        """Run ``fn()`` in the background on the engine's loop (a ``Job``).  Under trio, a Ctrl-C that arrives
        while it runs goes to the run's main task, unless ``interruptible`` (``fn`` runs the user's code, and
        hands on what it raises): a job of the engine's own must not take the user's Ctrl-C."""
        assert self._rt is not None
        return self._rt.bridge.spawn(fn, name, interruptible=interruptible)

    def watch_end(self, callback: Callable[[], None]) -> Any:
        """Call ``callback`` when the engine's loop shuts down with the engine still open."""
        assert self._rt is not None
        return self._rt.bridge.watch_end(callback)

    def device(self, device: str | None) -> str:
        """The device a task or Tensor asked for (None: the default), checked against the engine's."""
        if device is None:
            return self.default_device
        if device not in self.config.devices:
            check_device(device, self.config)  # an unknown or unavailable device says so first
            raise DeviceError(
                f"device {device!r} is not one of this engine's devices {self.config.devices}; "
                f"add it with Config(devices=(..., {device!r}))"
            )
        return device

    def own_memory(self, device: str) -> bool:
        """Has ``device`` memory of its own (a CUDA device), so that its tasks take arrays there?"""
        return device_class_for(device, self.config, check=False).own_memory

    def local(self, what: str) -> None:
        """Raise unless tasks run in this process (Tensors and compiled functions need that)."""
        remote = (
            self.remote
            if self._rt is not None
            else not device_class_for(self.default_device, self.config, check=False).local
        )
        if remote:
            raise InvalidTask(
                f"{what}: Tensors and compiled functions run on this process's devices and are not "
                "available with backend='dask'; submit functions that take and return arrays "
                "(eng.submit(np.matmul, a, b)), or use backend='threads'"
            )

    def full_message(self, task: Any, waiting_form: str = "await eng.submit(...)") -> str:
        """Why ``task`` was not admitted (a QueueFull's message): the limit that is full, and what to do."""
        full = self.device_full(task)
        if full is None:
            return (
                f"engine at its limits ({self.limits_text(task)}): {task!r} was not admitted; "
                f"use '{waiting_form}' to wait for room"
            )
        device, (held, budget) = task.device, full
        return (
            f"{device} has no room in its byte budget: its unfinished tasks and the arrays in its memory hold "
            f"{held:,} of max_device_bytes={budget:,} bytes (engine: {self.limits_text(None)}): {task!r} was "
            f"not admitted; use '{waiting_form}' to wait until the work on {device} frees room, drop the "
            f"{device} results you no longer need (or move them to the host with .to('cpu')), or raise "
            "max_device_bytes"
        )

    # -- why it takes no work ------------------------------------------------------------

    def refusal(self) -> EngineClosed:
        """Why the engine takes no work, found without its lock: one whose loop has closed is stopped first."""
        rt = self._rt
        if rt is not None and self.state == "running" and rt.bridge.closed():
            self.abandon(LOOP_CLOSED)  # takes the lock: never call this with it held
        return self.closed_error()

    def closed_error(self) -> EngineClosed:
        """Why the engine takes no work (no side effect: safe with the lock held)."""
        if self.state == "new":
            return EngineClosed("the engine has not started; use 'async with Engine(...) as eng'")
        if self.abandoned == LOOP_CLOSED:
            return EngineClosed(
                "the event loop this engine was started on has closed (the engine was never closed with "
                "'await eng.aclose()'); create a new Engine on the running loop: 'async with ss.Engine() as eng'"
            )
        if self.abandoned == _FORKED:
            return EngineClosed(FORKED)
        return EngineClosed("the engine is closed; submit to an engine that is running")

    # -- its life, driven by the Engine ----------------------------------------------------

    def abandon(self, why: str, warn: bool = True) -> None:
        """The engine's loop closed while it was open: warn, and let its threads finish what is queued and end."""
        if warn:
            warn_unclosed(f"{self.describe()} was still open when its event loop closed")
        self.state, self.abandoned = "closed", why
        if self._rt is not None:
            self._rt.stop_when_idle()

    def after_fork(self) -> None:
        """In a forked child: the engine's threads did not come along; it refuses work from now on."""
        if self._rt is not None and self.state != "closed":
            self.state, self.abandoned = "closed", _FORKED
            self._rt.after_fork()


def warn_unclosed(what: str, source: Any = None) -> None:
    """The one ResourceWarning of an engine left open (its loop ended or closed, or it was collected),
    attributed to the first frame outside schedsvc: the user's line that found it out."""
    warnings.warn(
        f"{what}; its worker threads stop once the queued tasks ran. Close an engine with "
        "'async with ss.Engine() as eng' or 'await eng.aclose()'",
        ResourceWarning,
        _outside(),
        source=source,
    )


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _outside() -> int:
    """The ``stacklevel`` of ``warnings.warn`` (called from ``warn_unclosed``) that names the first
    frame outside this package (``skip_file_prefixes`` needs Python 3.12)."""
    frame = sys._getframe(2)  # warn_unclosed's caller
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


class _Refuse:
    """What an entry point of the runtime is on a Port whose engine has not started: a refusal."""

    __slots__ = ("port",)

    def __init__(self, port: Port) -> None:
        self.port = weakref.proxy(port)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self.port.closed_error()


def _refusal(port: Port) -> Callable[[], EngineClosed]:
    """Why the engine takes no work, for the runtime to raise with its lock held: the port's
    side-effect-free message, through a weak reference (the runtime does not keep the port alive)."""
    ref = weakref.ref(port)

    def refusal() -> EngineClosed:
        alive = ref()
        return EngineClosed("the engine is closed") if alive is None else alive.closed_error()

    return refusal


def _gone(port: Port) -> Callable[[], EngineClosed]:
    """For the runtime, when the engine's loop has closed, without its lock: the engine is stopped (it
    says so once), and the error to raise."""
    ref = weakref.ref(port)

    def gone() -> EngineClosed:
        alive = ref()
        return EngineClosed("the engine is closed") if alive is None else alive.refusal()

    return gone


def port_of(engine: Engine) -> Port:
    """The Port of ``engine`` (for ``ss.load(path, eng)``, which is given the Engine itself)."""
    return engine._port
