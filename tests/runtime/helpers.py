"""Deterministic synchronisation for runtime tests: gates, probes and bounded waits, never sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import schedsvc as ss

#: Any wait longer than this is a deadlock: the test fails instead of hanging.
TIMEOUT = 10.0

T = TypeVar("T")


async def within(awaitable: Coroutine[Any, Any, T] | asyncio.Future[T] | Any, timeout: float = TIMEOUT) -> T:
    """Await with a deadline, so a deadlock fails the test quickly."""
    return await asyncio.wait_for(awaitable, timeout)


async def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Yield to the event loop until ``condition()`` holds (for state the loop itself advances)."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), timeout)


async def wait_thread_event(event: threading.Event, timeout: float = TIMEOUT) -> None:
    """Wait for a threading.Event without blocking the event loop."""
    assert await asyncio.to_thread(event.wait, timeout), "timed out waiting for a worker"


class Gate:
    """Tasks that hold a worker until the test opens the gate."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.started = threading.Semaphore(0)

    def hold(self, then: Callable[[], T] | None = None) -> Callable[[], T | None]:
        """A task body: say it started, wait for the gate, then run ``then``."""

        def body() -> T | None:
            self.started.release()
            if not self.opened.wait(TIMEOUT):
                raise TimeoutError("the test never opened the gate")
            return None if then is None else then()

        return body

    async def wait_started(self, n: int) -> None:
        for _ in range(n):
            assert await asyncio.to_thread(self.started.acquire, True, TIMEOUT), "a held task never started"

    def open(self) -> None:
        self.opened.set()


@asynccontextmanager
async def occupied(
    eng: ss.Engine, n: int, **options: Any
) -> AsyncIterator[tuple[Gate, list[ss.Future[Any]]]]:
    """Hold ``n`` workers busy (their tasks have started) until the block exits."""
    gate = Gate()
    futures = [eng.submit_nowait(gate.hold(), **options) for _ in range(n)]
    try:
        await gate.wait_started(n)
        yield gate, futures
    finally:
        gate.open()


async def probe(eng: ss.Engine) -> None:
    """Run a no-op through the engine and wait for it.

    On a free worker, any task that is (wrongly) ready already is ahead of the no-op in FIFO order, so once
    the no-op has run, such a task has run too: a hazard violation becomes visible without sleeping.
    """
    await within(eng.run(_noop))


def _noop() -> None:
    return None
