"""The thread -> loop bridge: the loop is woken only for awaited futures, once per burst."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import schedsvc as ss

from ..helpers import TIMEOUT, within


@contextmanager
def counting_threadsafe_calls(loop: asyncio.AbstractEventLoop) -> Iterator[list[Any]]:
    """Record every loop.call_soon_threadsafe made while the block runs."""
    calls: list[Any] = []
    original = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(callback)
        return original(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del loop.call_soon_threadsafe  # back to the class's method


async def test_tasks_nobody_awaits_never_wake_the_loop() -> None:
    loop = asyncio.get_running_loop()
    async with ss.Engine(cpu_workers=1) as eng:
        gate = threading.Event()
        eng.submit_nowait(gate.wait, TIMEOUT)
        futures = [eng.submit_nowait(int, i) for i in range(100)]
        with counting_threadsafe_calls(loop) as calls:
            done = asyncio.ensure_future(eng.waitall())
            await asyncio.sleep(0)  # waitall registers its barrier
            gate.set()
            await within(done)
        assert [f.result() for f in futures] == list(range(100))
        # the 101 completions reach the loop through one wake-up: the barrier's
        assert len(calls) == 1, calls


async def test_a_burst_of_awaited_completions_wakes_the_loop_once() -> None:
    loop = asyncio.get_running_loop()
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        gate, last_done = threading.Event(), threading.Event()
        eng.submit_nowait(gate.wait, TIMEOUT)
        futures = [eng.submit_nowait(int, i) for i in range(50)]
        futures.append(eng.submit_nowait(last_done.set))
        gathered = asyncio.gather(*futures)
        await asyncio.sleep(0)  # every future now has an awaiter
        with counting_threadsafe_calls(loop) as calls:
            gate.set()
            # block the loop thread until the worker has finished the whole burst
            assert last_done.wait(TIMEOUT), "the worker did not finish the burst"
            values = await within(gathered)
        assert values == [*range(50), None]
        assert len(calls) == 1, calls


async def test_an_awaited_cheap_task_runs_in_the_awaiting_coroutine_once_known() -> None:
    # a threshold of 1 s: "cheap" must not depend on how busy the machine is when the first run is timed
    async with ss.Engine(cpu_workers=1, inline_threshold_us=1e6) as eng:
        threads: list[int] = []

        def where() -> int:
            threads.append(threading.get_ident())
            return 1

        assert await within(eng.run(where)) == 1  # first time: unknown cost, runs on a worker
        assert threads[-1] != threading.get_ident()
        assert await within(eng.run(where)) == 1  # now known to be cheap: runs right here
        assert threads[-1] == threading.get_ident()


async def test_inline_runs_can_be_turned_off() -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        here = threading.get_ident()
        for _ in range(3):
            assert await within(eng.run(threading.get_ident)) != here


def test_a_contended_finish_waits_for_the_lock_and_then_takes_it() -> None:
    """The worker's finish path yields the GIL a few times, then blocks: it never takes a held lock."""
    from schedsvc._runtime._threads import acquire_contended

    lock = threading.Lock()
    lock.acquire()  # held by this thread, as a worker would hold it mid-finish
    started, got = threading.Event(), threading.Event()

    def contender() -> None:
        started.set()
        acquire_contended(lock)
        got.set()
        lock.release()

    thread = threading.Thread(target=contender)
    thread.start()
    assert started.wait(TIMEOUT)
    assert not got.wait(0.05)  # past its yields it waits: the lock is still ours
    lock.release()
    assert got.wait(TIMEOUT), "the contender never took the released lock"
    thread.join(TIMEOUT)
    assert not thread.is_alive() and not lock.locked()
