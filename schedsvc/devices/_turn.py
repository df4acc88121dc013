"""Who launches on a CUDA device: the thread that made its tasks ready, or the device's own thread.

One thread at a time launches on a device: the one whose ``dispatch`` found it hungry (``launch_here``,
run once the runtime's lock is released).  It takes the ready tasks one by one (``rt.launch_first``,
then what each ``rt.launched`` hands on) until none is left, and the device is hungry again.  A task
whose launch may block goes to the device's own thread together with that turn to launch
(``hand_over``), and that thread launches it and what is ready after it.

What may block is learned per kind of launch -- the function, and its arguments' dtypes and ranks (CuPy
compiles a kernel per such signature at its first use; host arrays count by their size too: a copy
stages them): a kind not launched before, or whose last launch took ``inline_s`` or more, or waited for
the device, is launched on the device's thread.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from math import inf
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np

from .._runtime import SCALAR_TYPES, Task

if TYPE_CHECKING:
    from .cuda import CudaDevice

__all__ = ["Next", "Turn"]

#: what a thread launches next: a running task of the device, and the launched parents it goes behind
#: (None: asked of the runtime at launch)
Next = tuple[Task, "list[Task] | None"]

_MAX_KINDS = 4096  # kinds whose last launch time is remembered (past it, the table starts again)
_ndarray = np.ndarray


class Turn:
    """The turn to launch on one CUDA device, and the device's own thread it goes to when a launch may
    block."""

    def __init__(self, device: CudaDevice, inline_s: float) -> None:
        self.device = device
        #: kind of launch -> how long its last launch took (``kind``): a kind whose last launch took less
        #: than ``inline_s`` is launched on the thread that made it ready (``Config.cuda_launch_inline_us``)
        self.launch_s: dict[Any, float] = {}
        self.inline_s = inline_s
        #: what the device's thread starts with, handed over with the turn to launch (``hand_over``)
        self.handed: Callable[[], Next | None] | None = None
        self.handing = threading.Lock()  # (guards handed and ended)
        self.ended = False  # the device's thread has ended (closing)
        self.wake = threading.Semaphore(0)
        #: the task ``dispatch`` took for the thread it runs on, with the turn (set and read by that thread)
        self.first: Next | None = None
        self.thread = threading.Thread(target=self._main, name=f"schedsvc-{device.name}", daemon=True)
        self._first = functools.partial(device.rt.launch_first, device)

    def launch_here(self) -> None:
        """On the thread that made tasks ready, once the runtime's lock is released: launch them here."""
        device = self.device
        rt = device.rt
        nxt, self.first = self.first, None
        if nxt is None:
            nxt = rt.launch_first(device)
            if nxt is None:
                return
        api = device.api
        ident = get_ident()
        guest = ident not in rt.worker_threads  # (a task launched here that submits work submits it nested)
        if guest:
            rt.worker_threads.add(ident)
        began = api.begin_launches(device.index)
        try:
            while nxt is not None:
                task, ahead = nxt
                try:
                    kind: Any = self.kind(task)
                    quick = self.launch_s.get(kind, inf) < self.inline_s
                except TypeError:  # an unhashable callable: never timed, always on the device's thread
                    kind, quick = None, False
                if not quick:
                    self.hand_over(functools.partial(_given, nxt))
                    return
                nxt = None  # (from here on the task is the device's: launched, or failed)
                nxt = device.launch_one(task, ahead, kind, True)
        except BaseException:  # an interrupt of this thread (Ctrl-C): the device's thread carries on
            self.hand_over(functools.partial(_given, nxt) if nxt is not None else self._first)
            raise
        finally:
            api.end_launches(device.index, began)
            if guest:
                rt.worker_threads.discard(ident)

    def hand_over(self, launch: Callable[[], Next | None]) -> None:
        """Give the turn to launch to the device's thread, which starts with ``launch()`` (or, once that
        thread has ended, closing, launch here)."""
        with self.handing:
            if not self.ended:
                self.handed = launch
                self.wake.release()
                return
        self._launch_all(launch)

    def _main(self) -> None:
        """The device's thread: the launches that may block, and what is ready after them."""
        device = self.device
        device.api.use_device(device.index)
        device.rt.worker_started()
        while True:
            self.wake.acquire()
            with self.handing:
                launch, self.handed = self.handed, None
                if launch is None and device.stopping:
                    self.ended = True
                    return
            if launch is not None:
                self._launch_all(launch)
            del launch  # (holds nothing while it sleeps: a result lives as long as its users keep it)

    def _launch_all(self, launch: Callable[[], Next | None]) -> None:
        """Launch ``launch()`` and every task ready after it (this thread has the turn), timing each."""
        nxt = launch()
        while nxt is not None:
            task, ahead = nxt
            try:
                kind: Any = self.kind(task)
            except TypeError:
                kind = None
            nxt = self.device.launch_one(task, ahead, kind, False)

    def kind(self, task: Task) -> Any:
        """What launches alike: the function, and its arguments' dtypes and ranks (a kernel is compiled per
        such signature; host arrays by their size too: they are staged by a copy).  TypeError if unhashable."""
        ndarray = self.device.api.ndarray
        key: list[Any] = [task.fn]
        for arg in task.args:
            if isinstance(arg, Task):
                arg = arg.value
            kind = type(arg)
            if kind is ndarray:
                key += (arg.dtype, arg.ndim)
            elif kind is _ndarray:
                key += (arg.dtype, arg.ndim, arg.nbytes.bit_length())
            else:
                key.append(kind)
        if task.kwargs:
            key.append(tuple((k, v if type(v) in SCALAR_TYPES else type(v)) for k, v in task.kwargs.items()))
        kind_key = tuple(key)
        hash(kind_key)
        return kind_key

    def learn(self, kind: Any, seconds: float) -> None:
        """A launch of ``kind`` took ``seconds`` (``inf``: it waited for the device)."""
        if kind is None:
            return
        launch_s = self.launch_s
        if len(launch_s) >= _MAX_KINDS and kind not in launch_s:
            launch_s.clear()
        launch_s[kind] = seconds


def _given(nxt: Next) -> Next:
    """What a launch handed over starts with: the task it had taken."""
    return nxt
