"""Deterministic synchronisation for runtime tests: gates, probes and bounded waits, never sleeps."""

from __future__ import annotations

import asyncio
import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio

import schedsvc as ss

#: Any wait longer than this is a deadlock: the test fails instead of hanging.
TIMEOUT = 10.0

T = TypeVar("T")


def on_asyncio() -> bool:
    """Is an asyncio loop running this coroutine (else: trio)?"""
    return asyncio._get_running_loop() is not None


async def within(awaitable: Coroutine[Any, Any, T] | asyncio.Future[T] | Any, timeout: float = TIMEOUT) -> T:
    """Await with a deadline, so a deadlock fails the test quickly (on asyncio or trio)."""
    if on_asyncio():  # in a task of its own, as the asyncio tests were written against
        # (a future handed to wait_for as it is would be waited for past the deadline while its task runs,
        # which cannot be cancelled: Python 3.11's wait_for returns only once the future is done)
        return await asyncio.wait_for(_awaited(awaitable), timeout)
    with anyio.fail_after(timeout):
        return await awaitable  # type: ignore[no-any-return]


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Yield to the event loop until ``condition()`` holds: only for what is not the engine's state (a
    source's flag, a worker's busy time, garbage collection); the engine's state is awaited with ``state``."""

    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0)


@asynccontextmanager
async def started(**options: Any) -> AsyncIterator[ss.Engine]:
    """``async with ss.Engine(**options)``, with a bounded close: a wedged engine fails the test, never hangs it."""
    eng = await ss.Engine(**options).start()
    try:
        yield eng
    except BaseException:
        await within(eng.aclose(cancel_pending=True))
        raise
    await within(eng.aclose())


async def state(eng: ss.Engine, predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Wait until ``predicate()`` -- about the engine's state -- holds: re-checked by the runtime after each
    scheduling event (``Runtime.until``), never polled."""
    rt = eng._rt
    assert rt is not None, f"{eng!r} has not started"
    await rt.until(predicate, timeout)


async def wait_thread_event(event: threading.Event, timeout: float = TIMEOUT) -> None:
    """Wait for a threading.Event without blocking the event loop."""
    assert await anyio.to_thread.run_sync(event.wait, timeout), "timed out waiting for a worker"


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
            assert await anyio.to_thread.run_sync(self.started.acquire, True, TIMEOUT), (
                "a held task never started"
            )

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


class FileGate:
    """A gate that works across processes (Dask workers): tasks wait for a file the test creates.

    ``hold`` returns a picklable task body; it records that it started by creating a file
    in ``started/`` (one per start, so a retried task is seen twice) and waits, bounded by
    ``TIMEOUT``, until the test calls ``open``.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.opened = os.path.join(directory, "open")
        self.started_dir = os.path.join(directory, "started")
        os.makedirs(self.started_dir, exist_ok=True)

    def hold(self, value: Any = None) -> Callable[[], Any]:
        return functools.partial(_file_gate_body, self.opened, self.started_dir, value)

    def started(self) -> list[int]:
        """The process ids of the task bodies that have started so far."""
        return [int(name.split("-")[0]) for name in os.listdir(self.started_dir)]

    async def wait_started(self, n: int, timeout: float = TIMEOUT) -> None:
        with anyio.fail_after(timeout):
            while len(self.started()) < n:  # files written by other processes: nothing to await
                await anyio.sleep(0.002)  # yield the loop (and the CPU) to the Dask client

    def open(self) -> None:
        with open(self.opened, "w"):
            pass


def _file_gate_body(opened: str, started_dir: str, value: Any) -> Any:
    with open(os.path.join(started_dir, f"{os.getpid()}-{uuid.uuid4().hex}"), "w"):
        pass
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(opened):  # another process opens it: polling is the only way to see it
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        time.sleep(0.002)
    return value


def read_until(fd: int, text: str, deadline: float) -> str:
    """What ``fd`` gives until it has given ``text`` (or the deadline passes, or it ends)."""
    seen = b""
    while text.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            break
        seen += chunk
    return seen.decode()


def interrupted_twice(code: str) -> tuple[str, str, int | None]:
    """Run ``code`` in a Python process, Ctrl-C it once it printed "started" and again once the close said
    how a second Ctrl-C exits (checking it still ran then): what its stderr said up to that, the rest of
    it, and its exit status."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        deadline = time.monotonic() + TIMEOUT
        assert "started" in read_until(proc.stdout.fileno(), "started", deadline)
        os.kill(proc.pid, signal.SIGINT)
        said = read_until(proc.stderr.fileno(), "exit without waiting)", deadline)
        assert proc.poll() is None, said  # still waiting for the running task
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(TIMEOUT)
        rest = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return said, rest, proc.returncode
