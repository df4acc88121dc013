"""``Runtime.until``: a wait for the engine's state, re-checked at each scheduling event, never polled."""

from __future__ import annotations

import asyncio
import operator

import pytest

import schedsvc as ss
from schedsvc._runtime import Runtime

from ..helpers import TIMEOUT, occupied, within


def runtime(eng: ss.Engine) -> Runtime:
    rt = eng._rt
    assert rt is not None
    return rt


async def test_until_returns_at_once_when_the_state_holds(engine: ss.Engine) -> None:
    rt = runtime(engine)
    await within(rt.until(lambda: engine.stats().pending == 0, TIMEOUT))
    assert rt._conditions == []


async def test_until_fires_when_a_scheduling_event_reaches_the_state() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        rt = runtime(eng)
        async with occupied(eng, 1):
            queued = asyncio.ensure_future(eng.submit(operator.add, 1, 2))  # waits for room
            await within(rt.until(lambda: eng.stats().waiting_admission == 1, TIMEOUT))
            assert not queued.done()
        fut = await within(queued)  # the held task finished: the queued one got in
        assert await within(fut) == 3
        await within(rt.until(lambda: eng.stats().pending == 0, TIMEOUT))
        assert rt._conditions == []


async def test_until_sees_a_state_reached_on_worker_threads(engine: ss.Engine) -> None:
    """Completions happen on worker threads: their scheduling events wake the waiter on the loop."""
    rt = runtime(engine)
    futs = [engine.submit_nowait(operator.add, i, 1) for i in range(50)]
    await within(rt.until(lambda: engine.stats().completed == 50, TIMEOUT))
    assert all(f.done() for f in futs)


async def test_until_sees_a_thread_start_waiting_on_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread blocked on a task (its ``result()`` off the loop) is state an ``until`` can wait for: it is
    re-checked when the thread starts waiting, though no scheduling event follows.  (The thread's hand-over
    of staged work, which could make an event of its own, is taken out: nothing is staged here.)"""
    async with ss.Engine(cpu_workers=1) as eng:
        rt = runtime(eng)
        async with occupied(eng, 1) as (_, held):
            monkeypatch.setattr(rt, "flush", lambda: None)
            checked = asyncio.Event()

            def waited_on() -> bool:
                checked.set()
                return bool(held[0].watchers)

            watching = asyncio.ensure_future(rt.until(waited_on, TIMEOUT))
            await within(checked.wait())  # its first check: nobody waits on the task yet
            blocked = asyncio.ensure_future(asyncio.to_thread(held[0].result, TIMEOUT))
            await within(watching)
            monkeypatch.undo()
        await within(blocked)


async def test_until_sees_the_engine_close() -> None:
    eng = await ss.Engine(cpu_workers=1).start()
    rt = runtime(eng)
    closing = asyncio.ensure_future(eng.aclose())
    await within(rt.until(lambda: eng.closed and rt.closed, TIMEOUT))
    await within(closing)


async def test_until_times_out_and_leaves_no_waiter(engine: ss.Engine) -> None:
    rt = runtime(engine)
    with pytest.raises(TimeoutError, match=r"did not hold within 0\.05 s"):
        await rt.until(lambda: engine.stats().pending == 7, 0.05)
    assert rt._conditions == []
    await within(engine.run(operator.add, 1, 1))  # a later event finds nobody to re-check for
    assert rt._conditions == []


async def test_a_cancelled_until_leaves_no_waiter(engine: ss.Engine) -> None:
    rt = runtime(engine)
    waiting = asyncio.ensure_future(rt.until(lambda: False, TIMEOUT))
    await asyncio.sleep(0)  # it has registered and suspended
    assert len(rt._conditions) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert rt._conditions == []


async def test_a_predicate_that_raises_at_once_propagates(engine: ss.Engine) -> None:
    rt = runtime(engine)

    def broken() -> bool:
        raise ZeroDivisionError("at once")

    with pytest.raises(ZeroDivisionError, match="at once"):
        await within(rt.until(broken, TIMEOUT))
    assert rt._conditions == []


async def test_a_predicate_that_raises_on_a_recheck_propagates(engine: ss.Engine) -> None:
    rt = runtime(engine)
    calls = []

    def breaks_later() -> bool:
        calls.append(1)
        if len(calls) > 1:
            raise KeyError("on a recheck")
        return False

    waiting = asyncio.ensure_future(rt.until(breaks_later, TIMEOUT))
    await asyncio.sleep(0)  # checked once, false: it waits
    await within(engine.run(operator.add, 1, 1))  # scheduling events: the predicate is re-checked
    with pytest.raises(KeyError, match="on a recheck"):
        await within(waiting)
    assert rt._conditions == []


async def test_predicates_run_on_the_loop_thread_without_the_lock(engine: ss.Engine) -> None:
    rt = runtime(engine)
    seen: list[bool] = []

    def where() -> bool:
        seen.append(rt.on_loop_thread())
        return engine.stats().completed >= 20  # stats() takes the lock: it must not be held here

    futs = [engine.submit_nowait(operator.add, i, 1) for i in range(20)]
    await within(rt.until(where, TIMEOUT))
    assert seen and all(seen)
    assert await within(asyncio.gather(*futs)) == list(range(1, 21))


async def test_nobody_waiting_adds_nothing_to_a_scheduling_event(engine: ss.Engine) -> None:
    """The hot path's cost: with no waiter, collect() schedules no re-check."""
    rt = runtime(engine)
    scheduled = []
    rt._recheck_soon = lambda: scheduled.append(1)  # type: ignore[method-assign]
    await within(engine.run(operator.add, 1, 1))
    assert scheduled == []
