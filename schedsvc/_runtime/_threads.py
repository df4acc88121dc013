"""Threads and the runtime: what a thread that is not the event loop's waits on, which worker runs on
this thread, and how a worker takes the runtime's lock when another thread holds it.

``ThreadToken``: what a thread that is not the event loop's waits on, woken without the loop.

A coroutine waits on an asyncio future that the bridge settles on its loop.  A
plain thread (a ``concurrent.futures`` caller, ``eng.executor()``) may have no
loop at all, and the engine's loop may be busy: its token is settled directly
by the thread that produced the instruction, once the runtime's lock is
released (``settle`` in ``_bridge``, ``Runtime.collect``).  Two uses:

* ``ThreadToken()``: a submission blocked at the limits waits on it (``wait``);
  ``("admitted", token)`` releases it, a close that cancels pending work
  settles it with the error to raise.
* ``ThreadToken(then)``: a watcher of a task, ``then()`` called where the task
  becomes final (a ``concurrent.futures.Future`` completed off the loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ._bridge import Token, report

__all__ = ["ThreadToken", "acquire_contended", "current_worker", "set_worker"]

_SPINS = 16  # GIL yields before a contended acquire blocks
_local = threading.local()


#: makes settling once-only when two threads settle one token (a blocked submission's token is
#: settled by its admission, and by its task ending if that is cancelled meanwhile)
_SETTLING = threading.Lock()


class ThreadToken(Token):
    """A one-shot for a thread: a lock it blocks on, or a call made where it is settled."""

    __slots__ = ("_gate", "_settled", "_then", "error")
    home = None  # no loop's: always woken where it is settled (``Bridge.foreign``)

    def __init__(self, then: Callable[[], object] | None = None) -> None:
        self.error: BaseException | None = None
        self._settled = False
        self._then = then
        self._gate: threading.Lock | None = None
        if then is None:
            self._gate = threading.Lock()
            self._gate.acquire()

    def done(self) -> bool:
        """Was it settled?"""
        return self._settled

    def settle(self, error: BaseException | None = None) -> None:
        """Settle it (with ``error`` for the waiter to raise): release the waiter, or make the call.  Once."""
        with _SETTLING:
            if self._settled:
                return
            self._settled = True
            self.error = error
            then, self._then = self._then, None  # the callable is let go
        if then is not None:
            try:
                then()
            # (done-callbacks of a concurrent.futures.Future): whatever they raise, never a worker's end
            except BaseException as exc:
                report(exc, f"exception in a done callback of a task's future ({then!r})")
        elif self._gate is not None:
            self._gate.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until settled (once: one thread waits on a token); False if ``timeout`` seconds passed first."""
        assert self._gate is not None, "a ThreadToken with a call is not waited on"
        return self._gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))

    def __repr__(self) -> str:
        return f"<ThreadToken {'settled' if self._settled else 'pending'}>"


def set_worker(worker: Any) -> None:
    """This thread is ``worker``'s (a device's thread): ``current_worker`` returns it here."""
    _local.worker = worker


def current_worker() -> Any:
    """The worker object running on this thread, or None outside workers."""
    return getattr(_local, "worker", None)


def acquire_contended(lock: threading.Lock) -> None:
    """Take a lock another thread holds, without queueing on it while this thread lacks the GIL.

    A blocked ``acquire`` can be granted the lock while the thread still waits for
    the GIL; the holder of the GIL then blocks on the lock, and two workers
    convoy, trading the GIL and the lock on every task.  ``sleep(0)`` gives up
    the GIL so the holder can finish, and the lock is only taken with the GIL.
    """
    for _ in range(_SPINS):
        time.sleep(0)
        if lock.acquire(False):
            return
    lock.acquire()
