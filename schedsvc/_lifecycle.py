"""Noticing an engine left open: its event loop ended, the interpreter exited, the process forked, or it was collected."""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from ._port import LOOP_CLOSED, warn_unclosed

if TYPE_CHECKING:
    from ._port import Port

__all__ = ["STARTED", "finish", "on_asyncio_end", "watch_loop_end"]

STARTED: weakref.WeakSet[Port] = (
    weakref.WeakSet()
)  # ports of engines started in this process (not kept alive)


def watch_loop_end(port: Port) -> Any:
    """Notice the engine's loop (or trio run) ending while the engine is open; a handle for ``finish``.

    It holds the engine weakly, so a forgotten engine is still garbage-collected (and warns then,
    in ``__del__``).
    """
    ref = weakref.ref(port)

    def ended() -> None:
        alive = ref()
        if alive is not None:
            _loop_ended(alive)

    return port.watch_end(ended)


def on_asyncio_end(callback: Callable[[], None]) -> AsyncGenerator[None, None]:
    """An async generator, started and left suspended, that the running loop closes when it shuts down.

    asyncio has no hook for a loop's end, but ``asyncio.run`` (and every Runner) closes the async
    generators still suspended on its loop (``shutdown_asyncgens``) before it closes the loop: the
    generator's ``finally`` is the moment an engine that was never closed is found out.
    """

    async def watch() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            callback()

    gen = watch()
    with contextlib.suppress(StopIteration):  # run to its yield: the loop's hooks now track it
        gen.asend(None).send(None)
    return gen


def _loop_ended(port: Port) -> None:
    """The engine's loop is shutting down (``asyncio.run`` returned) and the engine is still open."""
    if port.open:
        what = f"{port.describe()} was still open when its event loop ended"  # (described while running)
        port.abandon(LOOP_CLOSED, warn=False)
        warn_unclosed(what)


def finish(handle: Any) -> None:
    """Stop watching (``watch_loop_end``'s handle): close asyncio's suspended generator now (its
    ``finally`` has nothing to await), or take trio's callback off."""
    if isinstance(handle, AsyncGenerator):
        with contextlib.suppress(StopIteration, RuntimeError):
            handle.aclose().send(None)
    elif handle is not None:
        handle.cancel()


def _at_exit() -> None:
    """The interpreter exits with engines still open on a loop that never ended: IPython's and Jupyter's.

    ``asyncio.run`` ends its loop (``watch_loop_end``); IPython runs each cell with ``run_until_complete`` on
    one loop that it never closes, and a kernel exits with its loop still running.  Warn, and tell the
    threads to end (they are daemons: the exit does not wait for them).
    """
    for port in list(STARTED):
        if port.open:
            what = f"{port.describe()} was still open when the interpreter exited"  # described while running
            port.abandon(_EXITED, warn=False)
            warn_unclosed(what)


_EXITED = "the interpreter exited"
# atexit runs its hooks last in, first out: this one before IPython's, which clear its namespace
atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    for port in list(STARTED):
        port.after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
