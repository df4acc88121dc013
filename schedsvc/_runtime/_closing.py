"""Closing: taking no more work, finishing or cancelling what is pending, and ending the devices.

``shutdown`` is the engine's close; ``stop_when_idle`` stops an engine that
was never closed (its loop ended); ``after_fork`` makes a forked child's copy
of the runtime refuse everything, since no worker or loop of it runs there.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._errors import EngineClosed
from ._bridge import settle

if TYPE_CHECKING:
    from ._admission import Admission
    from ._dispatch import Dispatch
    from ._runtime import Runtime
    from ._waiting import Waiting

__all__ = ["Closing"]


class Closing:
    """The end of a runtime's life: close, drain or cancel, stop and join the devices."""

    def __init__(self, rt: Runtime, admission: Admission, dispatch: Dispatch, waiting: Waiting) -> None:
        self.rt = rt
        self.admission = admission
        self.dispatch = dispatch
        self.waiting = waiting

    async def shutdown(self, cancel_pending: bool, timeout: float) -> list[threading.Thread]:
        """Take no more work; finish (or cancel) what is pending, stop the devices, and wait up to
        ``timeout`` for their threads; return those still alive.

        Nested work that running tasks submit meanwhile is admitted and waited
        for too.  If this is cancelled, unstarted work is cancelled and the
        devices are told to stop.
        """
        self.close()
        closed = functools.partial(EngineClosed, "the engine closed with cancel_pending=True")
        try:
            if cancel_pending:
                self.cancel_pending(closed)
            while True:  # nested work submitted by running tasks is admitted while closing
                await self.waiting.barrier()
                if self.settled():
                    break
        except BaseException:  # the close was cancelled (or failed): stop now
            self.cancel_pending(closed)
            self.stop()
            await self.aclose_devices()
            raise
        self.stop()
        await self.aclose_devices()
        return await self.join(timeout)

    async def join(self, timeout: float) -> list[threading.Thread]:
        """Wait, without blocking the loop, for the devices' threads to end; return those still alive."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [t for device in self.rt.devices.values() for t in device.join(0)]
            if not alive or time.monotonic() > deadline:
                return alive
            await anyio.sleep(0.001)  # they were told to stop; they exit within microseconds

    def close(self) -> None:
        """Take no more work (nested work of running tasks still gets in)."""
        with self.rt.lock:
            self.admission.closed = True
        if self.waiting.conditions:  # a state change that produces no scheduling event
            self.waiting.recheck_soon()

    def settled(self) -> bool:
        """Is nothing pending or waiting for admission?"""
        rt = self.rt
        with rt.lock:
            return not rt.core.pending and not rt.core.waiting_admission

    def cancel_pending(self, error: Callable[[], BaseException]) -> None:
        """Cancel every task not started; each submitter still queued gets an ``error()`` of its own."""
        rt = self.rt
        for token in rt.under_lock(rt.core.cancel_pending):
            settle(token, error())
        for device in rt.devices.values():
            device.cancel_all()

    def stop(self) -> None:
        """Tell the devices no more work comes; their threads end once idle."""
        for device in self.rt.devices.values():
            device.stop()

    def stop_when_idle(self) -> None:
        """Stop an engine that was never closed: staged work is handed over, then the threads end."""
        self.rt.under_lock(self.admission.close_and_publish)
        self.stop()

    async def aclose_devices(self) -> None:
        for device in self.rt.devices.values():
            await device.aclose()

    def after_fork(self) -> None:
        """In a forked child (one thread, a copy of memory): no worker or loop of the engine runs here."""
        rt, admission, dispatch, waiting = self.rt, self.admission, self.dispatch, self.waiting
        rt.forked = admission.closed = True
        # an await runs nothing inline: it raises the fork error
        dispatch.inline_threshold_s = waiting.inline_threshold_s = 0.0
        lock = threading.Lock()  # another thread of the parent may have held it at the fork
        rt.lock = admission.lock = dispatch.lock = lock
        rt.worker_threads.clear()
        rt.loop_thread = admission.loop_thread = -1
        waiting.conditions.clear()  # their loop does not run here
        rt.bridge.forget()
