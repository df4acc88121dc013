"""The thread -> loop bridge: the loop is woken only for awaited futures, once per burst."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import schedsvc as ss

from ..helpers import TIMEOUT, Gate, within


@contextmanager
def recording_calls(
    loop: asyncio.AbstractEventLoop, method: str, keep: Callable[[Any], bool] = lambda callback: True
) -> Iterator[list[Any]]:
    """Record the callback of every ``loop.<method>(callback, ...)`` made while the block runs (those
    ``keep`` accepts)."""
    calls: list[Any] = []
    original = getattr(loop, method)

    def recording(callback: Any, *args: Any, **kwargs: Any) -> Any:
        if keep(callback):
            calls.append(callback)
        return original(callback, *args, **kwargs)

    setattr(loop, method, recording)
    try:
        yield calls
    finally:
        delattr(loop, method)  # back to the class's method


def counting_threadsafe_calls(loop: asyncio.AbstractEventLoop) -> Any:
    """Record every loop.call_soon_threadsafe made while the block runs."""
    return recording_calls(loop, "call_soon_threadsafe")


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


async def test_an_awaited_cheap_task_of_a_modules_builtin_runs_in_the_awaiting_coroutine_once_known() -> None:
    # a threshold of 1 s: "cheap" must not depend on how busy the machine is when the first run is timed
    async with ss.Engine(cpu_workers=1, inline_threshold_us=1e6) as eng:
        here = threading.get_ident()
        assert await within(eng.run(threading.get_ident)) != here  # first time: unknown cost, on a worker
        assert await within(eng.run(threading.get_ident)) == here  # now known to be cheap: right here


async def test_a_users_function_never_runs_in_the_awaiting_coroutine() -> None:
    """However cheap it was: it may wait for something only the event loop gives (a queue a coroutine
    feeds), and waiting there would stop the loop for ever."""
    async with ss.Engine(cpu_workers=1, inline_threshold_us=1e6) as eng:
        threads: list[int] = []

        def where() -> int:
            threads.append(threading.get_ident())
            return 1

        for _ in range(3):
            assert await within(eng.run(where)) == 1
        assert threading.get_ident() not in threads


@pytest.mark.parametrize("kind", ["queue", "event", "lock"])
async def test_a_cheap_task_that_waits_for_the_loop_this_time_does_not_block_it(kind: str) -> None:
    """A queue's get, an event's wait, a lock's acquire: instant while what they wait for is there.  Awaited
    while queued behind a busy worker, such a task ran in the awaiting coroutine, and waited there for what
    only another coroutine could give: the loop stopped for ever.  It now waits for a worker."""
    fed = queue.Queue[int]()
    event, lock = threading.Event(), threading.Lock()
    wait: Any = {"queue": fed.get, "event": event.wait, "lock": lock.acquire}[kind]
    feed: Any = {"queue": lambda: fed.put(1), "event": event.set, "lock": lock.release}[kind]
    async with ss.Engine(cpu_workers=1, inline_threshold_us=1e6) as eng:
        for _ in range(3):  # instant (what it waits for is there), and timed: it is cheap
            gate = Gate()
            eng.submit_nowait(gate.hold())
            await gate.wait_started(1)
            if kind != "lock":
                feed()
            learnt = eng.submit_nowait(wait)
            waiting = asyncio.ensure_future(learnt.wait())  # awaited: its run is timed
            await asyncio.sleep(0)
            gate.open()
            await within(waiting)
            if kind == "lock":
                feed()  # (the lock was free: taken at once; given back)
        if kind == "lock":
            lock.acquire()  # held: the next acquire waits for the coroutine's release
        else:
            event.clear()
        gate = Gate()
        eng.submit_nowait(gate.hold())
        await gate.wait_started(1)
        task = eng.submit_nowait(wait)  # queued behind the held worker

        async def feeder() -> None:
            await asyncio.sleep(0)
            feed()
            gate.open()

        feeding = asyncio.ensure_future(feeder())
        await within(task)  # (this await is what ran a cheap queued task right here)
        await within(feeding)


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


def wakeups_scheduled(loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[Any]]) -> Any:
    """Record every loop.call_soon made while the block runs that schedules the next step of one of
    ``tasks`` (their wake-up: a callback bound to the task)."""
    return recording_calls(
        loop, "call_soon", lambda callback: any(getattr(callback, "__self__", None) is t for t in tasks)
    )


@pytest.mark.parametrize("what", ["future", "batched call"])
async def test_the_drain_steps_the_coroutines_it_wakes_itself(what: str) -> None:
    """A coroutine of the engine's loop that awaits a task, or a batched call, is stepped by the drain that
    learns the task is final, in that turn of the loop: no callback scheduled per await (an asyncio
    future's result would schedule one, for the next turn)."""
    import numpy as np

    loop = asyncio.get_running_loop()
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        gate, last_done = threading.Event(), threading.Event()
        eng.submit_nowait(gate.wait, TIMEOUT)
        negative = eng.compile(np.negative, batch_axis=0)

        async def awaits(i: int) -> Any:
            if what == "future":
                return await eng.submit_nowait(int, i)
            return (await negative(np.full((1, 2), float(i))))[0, 0]

        tasks = [asyncio.ensure_future(awaits(i)) for i in range(20)]
        await asyncio.sleep(0)  # every coroutine now waits
        last = eng.submit_nowait(last_done.set)
        with wakeups_scheduled(loop, tasks) as wakeups:
            gate.set()
            assert last_done.wait(TIMEOUT), "the worker did not finish the burst"
            values = await within(asyncio.gather(*tasks))
        await within(last)
        assert values == ([*range(20)] if what == "future" else [-float(i) for i in range(20)])
        assert wakeups == []


async def test_a_coroutine_cancelled_while_it_awaits_a_task_gets_its_cancellation_and_the_task_is_dropped() -> (
    None
):
    async with ss.Engine(cpu_workers=1) as eng:
        gate = Gate()
        held = eng.submit_nowait(gate.hold())
        queued = eng.submit_nowait(int, 5)
        awaiting = asyncio.ensure_future(_await(queued))
        await asyncio.sleep(0)  # it waits
        awaiting.cancel("enough")
        with pytest.raises(asyncio.CancelledError, match="enough"):
            await within(awaiting)
        assert queued.cancelled()
        gate.open()
        await within(held)


async def _await(fut: Any) -> Any:
    return await fut


def test_a_ctrl_c_in_a_coroutine_the_drain_woke_stops_the_loop_and_the_others_are_woken_after() -> None:
    """The drain steps the coroutines it wakes itself: a KeyboardInterrupt out of one stops the loop, as
    it would out of the callback of a task's step, and the coroutines the drain had yet to wake are
    woken once the loop runs again."""
    loop = asyncio.new_event_loop()
    eng = ss.Engine(cpu_workers=1)
    try:
        loop.run_until_complete(eng.__aenter__())
        gate, last_done = threading.Event(), threading.Event()
        eng.submit_nowait(gate.wait, TIMEOUT)
        first, second = eng.submit_nowait(int, 1), eng.submit_nowait(int, 2)
        eng.submit_nowait(last_done.set)

        async def interrupted() -> None:
            await first
            raise KeyboardInterrupt

        tasks = [loop.create_task(interrupted()), loop.create_task(_await(second))]
        loop.run_until_complete(asyncio.sleep(0))  # both wait
        gate.set()
        assert last_done.wait(TIMEOUT), "the worker did not finish"  # one drain wakes both
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(within(tasks[1]))
        assert loop.run_until_complete(within(tasks[1])) == 2
        assert isinstance(tasks[0].exception(), KeyboardInterrupt)
    finally:
        loop.run_until_complete(eng.__aexit__(None, None, None))
        loop.close()


async def test_a_loop_waiter_speaks_asyncios_future_protocol() -> None:
    from schedsvc._runtime import LoopWaiter

    loop = asyncio.get_running_loop()
    waiter = LoopWaiter(loop)
    assert not waiter.done() and waiter.get_loop() is loop
    with pytest.raises(asyncio.InvalidStateError):
        waiter.result()
    awaiting = asyncio.ensure_future(_await(waiter))
    await asyncio.sleep(0)  # it waits
    await asyncio.to_thread(waiter.settle)  # from another thread: woken on the loop
    assert await within(awaiting) is None and waiter.done() and not waiter.cancelled()
    called = asyncio.Event()
    waiter.add_done_callback(lambda w: called.set())  # once done: called soon, as asyncio's
    await within(called.wait())

    failing = LoopWaiter(loop)
    awaiting = asyncio.ensure_future(_await(failing))
    await asyncio.sleep(0)
    failing.settle(ValueError("no"))  # in a task of the loop: its Task steps in a callback
    with pytest.raises(ValueError, match="no"):
        await within(awaiting)

    cancelled = LoopWaiter(loop)
    assert cancelled.cancel("why") and not cancelled.cancel()
    with pytest.raises(asyncio.CancelledError, match="why"):
        await within(_await(cancelled))
    cancelled.settle()  # too late: stays cancelled
    assert cancelled.cancelled()


async def test_a_coroutine_the_drain_wakes_holds_the_only_reference_to_its_task() -> None:
    """The drain steps the coroutines it wakes once it holds nothing of the burst: a coroutine that
    drops its future frees it then and there, as when it is woken in a callback of its own."""
    import weakref

    class Marker:
        pass

    def same(marker: Marker) -> Marker:
        return marker

    async with ss.Engine(cpu_workers=1) as eng:
        gate, last_done = threading.Event(), threading.Event()
        eng.submit_nowait(gate.wait, TIMEOUT)
        freed: list[bool] = []

        async def awaits() -> None:
            marker = Marker()
            ref = weakref.ref(marker)
            fut = eng.submit_nowait(same, marker)
            del marker
            await fut.wait()  # (awaited here, not in a task of wait_for's)
            del fut
            freed.append(ref() is None)  # no garbage collection: freed as the last reference goes

        task = asyncio.ensure_future(awaits())
        await asyncio.sleep(0)  # it waits
        eng.submit_nowait(last_done.set)
        gate.set()
        assert last_done.wait(TIMEOUT), "the worker did not finish"  # (and holds nothing of `same`'s)
        await within(task)
        assert freed == [True]
