"""``Port``: the declared interface between an Engine and the frontend parts built on it.

Futures, Tensors, compiled functions and ``eng.map`` pipelines hold an
engine's Port, not the Engine: everything they may ask of it is a method or
attribute here -- the runtime while the engine runs (or why it does not),
its devices, the Tensor memory tracking, the compile counters.  The Engine
owns the Port and drives its life (``started``, ``closed``, ``abandon``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any

from ._errors import FORKED, DeviceError, EngineClosed, InvalidTask
from .compile import Counts
from .devices import check_device, device_class_for

if TYPE_CHECKING:
    from ._config import Config
    from ._engine import Engine
    from ._runtime import Runtime
    from .tensor import TensorMemory

__all__ = ["LOOP_CLOSED", "Port", "port_of", "warn_unclosed"]

LOOP_CLOSED = "loop closed"
_FORKED = "forked"


class Port:
    """An engine's state as its Futures, Tensors, compiled functions and pipelines see it."""

    __slots__ = (
        "__weakref__",
        "abandoned",
        "compile_counts",
        "config",
        "default_device",
        "loop_watch",
        "rt",
        "state",
        "tensors",
    )

    def __init__(self, config: Config, tensors: TensorMemory) -> None:
        self.config = config
        self.rt: Runtime | None = None
        self.state = "new"  # new -> running -> closing -> closed
        self.abandoned = ""  # why the engine stopped without aclose(): its loop closed, or a fork
        self.default_device = config.default_device
        self.tensors = tensors
        self.compile_counts = Counts()  # traces, replays of this engine's compiled functions
        #: a suspended async generator its loop closes when it shuts down (``_lifecycle``)
        self.loop_watch: Any = None

    def __del__(self) -> None:
        """The Engine and every Future, Tensor and compiled function of it are gone, and it was
        never closed: warn, and let its threads finish the queued work and end."""
        rt = self.rt
        if rt is None or self.state != "running":
            return
        text = f"unclosed {self.describe()}"
        self.state = "closed"
        # in a thread of its own: the last reference may go while this thread holds the engine's lock
        with contextlib.suppress(RuntimeError):  # at interpreter exit no thread starts: they die anyway
            threading.Thread(target=rt.stop_when_idle, name="schedsvc-stop", daemon=True).start()
        warn_unclosed(text, self)

    def describe(self) -> str:
        """The engine, for its repr and messages."""
        rt = self.rt
        if rt is None:
            return f"<Engine {self.state} cpu_workers={self.config.cpu_workers}>"
        return f"<Engine {self.state} devices={','.join(self.config.devices)} {rt.describe()}>"

    # -- asked by the frontend ---------------------------------------------------------

    def running(self) -> Runtime:
        """The runtime of a running engine; EngineClosed (saying why) otherwise."""
        rt = self.rt
        if rt is None or self.state != "running" or rt.bridge.closed():
            raise self.refusal()
        return rt

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
        rt = self.rt
        remote = (
            rt.remote
            if rt is not None
            else not device_class_for(self.default_device, self.config, check=False).local
        )
        if remote:
            raise InvalidTask(
                f"{what}: Tensors and compiled functions run on this process's devices and are not "
                "available with backend='dask'; submit functions that take and return arrays "
                "(eng.submit(np.matmul, a, b)), or use backend='threads'"
            )

    def full_message(self, task: Any, waiting_form: str = "await eng.submit(...)") -> str:
        rt = self.rt
        assert rt is not None
        return (
            f"engine at its limits ({rt.limits_text()}): "
            f"{task!r} was not admitted; use '{waiting_form}' to wait for room"
        )

    # -- why it takes no work ------------------------------------------------------------

    def refusal(self) -> EngineClosed:
        """Why the engine takes no work, found without its lock: one whose loop has closed is stopped first."""
        rt = self.rt
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
        if self.rt is not None:
            self.rt.stop_when_idle()

    def after_fork(self) -> None:
        """In a forked child: the engine's threads did not come along; it refuses work from now on."""
        if self.rt is not None and self.state != "closed":
            self.state, self.abandoned = "closed", _FORKED
            self.rt.after_fork()


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


def port_of(engine: Engine) -> Port:
    """The Port of ``engine`` (for ``ss.load(path, eng)``, which is given the Engine itself)."""
    return engine._port
