"""``eng.executor()`` and ``ss.executor()``: the engine as a ``concurrent.futures.Executor``.

The first part ports the standard library's own executor tests (CPython's
``Lib/test/test_concurrent_futures/``: ExecutorTest, WaitTests,
AsCompletedTests, ExecutorShutdownTest), with events in place of sleeps; the
second tests what the engine adds: blocking admission from threads,
dependencies on executor futures, submissions from the loop and from tasks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import TIMEOUT, Gate, occupied, state, within

# -- the standard library's completed futures (test_concurrent_futures/util.py) ------------------


def _future(state: str, exception: BaseException | None = None, result: Any = None) -> cf.Future[Any]:
    f: cf.Future[Any] = cf.Future()
    f._state = state  # type: ignore[attr-defined]
    f._exception = exception  # type: ignore[attr-defined]
    f._result = result  # type: ignore[attr-defined]
    return f


PENDING_FUTURE = _future("PENDING")
RUNNING_FUTURE = _future("RUNNING")
CANCELLED_FUTURE = _future("CANCELLED")
CANCELLED_AND_NOTIFIED_FUTURE = _future("CANCELLED_AND_NOTIFIED")
EXCEPTION_FUTURE = _future("FINISHED", exception=OSError())
SUCCESSFUL_FUTURE = _future("FINISHED", result=42)


def mul(x: int, y: int) -> int:
    return x * y


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()


def wait_and_raise(e: threading.Event) -> None:
    assert e.wait(TIMEOUT)
    raise Exception("this is an exception")


def wait_event(e: threading.Event) -> bool:
    return e.wait(TIMEOUT)


WORKERS = 2


@pytest.fixture
def executor() -> Iterator[cf.Executor]:
    ex = ss.executor(max_workers=WORKERS)
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _gone(ref: weakref.ref[Any]) -> bool:
    """Has ``ref``'s object been freed?  The thread that completed its future lets go of that future
    a moment after waking its caller (as ThreadPoolExecutor's workers do): retry, bounded, as
    CPython's own test does now (``support.sleeping_retry``)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        gc.collect()
        if ref() is None:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


# -- ExecutorTest --------------------------------------------------------------------------------


def test_submit(executor: cf.Executor) -> None:
    future = executor.submit(pow, 2, 8)
    assert isinstance(future, cf.Future)
    assert future.result(TIMEOUT) == 256


def test_submit_keyword(executor: cf.Executor) -> None:
    assert executor.submit(mul, 2, y=8).result(TIMEOUT) == 16
    # every keyword goes to the callable, even those named like the engine's options
    future = executor.submit(capture, 1, self=2, fn=3, device="x", priority="y")
    assert future.result(TIMEOUT) == ((1,), {"self": 2, "fn": 3, "device": "x", "priority": "y"})
    with pytest.raises(TypeError):
        executor.submit(fn=capture, arg=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        executor.submit(arg=1)  # type: ignore[call-arg]


def test_map(executor: cf.Executor) -> None:
    expected = list(map(pow, range(10), range(10)))
    assert list(executor.map(pow, range(10), range(10))) == expected
    assert list(executor.map(pow, range(10), range(10), chunksize=3)) == expected


def test_map_exception(executor: cf.Executor) -> None:
    i = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5])
    assert next(i) == (0, 1)
    assert next(i) == (0, 1)
    with pytest.raises(ZeroDivisionError):
        next(i)


def test_map_timeout(executor: cf.Executor) -> None:
    ready = threading.Event()
    ready.set()
    never = threading.Event()
    results = []
    try:
        with pytest.raises(cf.TimeoutError):
            for item in executor.map(wait_event, [ready, ready, never], timeout=1.0):
                results.append(item)
    finally:
        never.set()
    assert results == [True, True]


def test_map_timeout_cancels_the_rest() -> None:
    """CPython's test_executor_map_current_future_cancel: the item that timed out, and those after
    it, are cancelled, not run."""
    stop = threading.Event()
    log: list[str] = []

    def log_n_wait(ident: str) -> None:
        log.append(f"{ident} started")
        try:
            stop.wait(TIMEOUT)
        finally:
            log.append(f"{ident} stopped")

    with ss.executor(max_workers=1) as pool:
        fut = pool.submit(log_n_wait, ident="first")
        try:
            gen = pool.map(log_n_wait, ["second", "third"], timeout=0)
            with pytest.raises(TimeoutError):
                next(gen)
            gen.close()
        finally:
            stop.set()
        fut.result(TIMEOUT)
    assert log == ["first started", "first stopped"]


def test_map_timeout_bounds_submissions_waiting_at_the_limits() -> None:
    """The timeout counts from the call to map, as in the standard library: submissions blocked at the
    engine's limits count against it, and what found no room raises TimeoutError at its turn."""
    gate = Gate()
    returned = threading.Event()
    outcome: list[Any] = []

    def call_map(ex: cf.Executor) -> None:
        t0 = time.monotonic()
        results = ex.map(mul, [1, 2, 3], [1, 1, 1], timeout=0.2)
        outcome.append(time.monotonic() - t0)
        returned.set()
        try:
            outcome.append(list(results))
        except BaseException as exc:
            outcome.append(exc)

    with ss.executor(max_workers=1, max_pending=1) as ex:
        held = ex.submit(gate.hold())
        assert gate.started.acquire(timeout=TIMEOUT)
        caller = threading.Thread(target=call_map, args=(ex,))
        caller.start()
        try:
            assert returned.wait(TIMEOUT), "map() did not return within its timeout"
        finally:
            gate.open()
            caller.join(TIMEOUT)
        held.result(TIMEOUT)
        assert outcome[0] < TIMEOUT / 2
        assert isinstance(outcome[1], TimeoutError)
        assert "max_pending" in str(outcome[1])
        assert list(ex.map(mul, [1, 2, 3], [1, 1, 1], timeout=TIMEOUT)) == [1, 2, 3]


def test_shutdown_race_issue12456(executor: cf.Executor) -> None:
    executor.map(str, [2] * (WORKERS + 1))
    executor.shutdown()


def test_no_stale_references(executor: cf.Executor) -> None:
    my_object = MyObject()
    collected = threading.Event()
    ref = weakref.ref(my_object, lambda obj: collected.set())
    executor.submit(my_object.my_method)  # the future is dropped at once
    del my_object
    assert collected.wait(TIMEOUT), "stale reference: the task's callable was not let go"
    del ref


@pytest.mark.parametrize("number", [0, -1])
def test_max_workers_negative(number: int) -> None:
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        ss.executor(max_workers=number)


def test_free_reference(executor: cf.Executor) -> None:
    for obj in executor.map(make_dummy_object, range(10)):
        wr = weakref.ref(obj)
        del obj
        assert _gone(wr), "the result is kept alive after its future was dropped"


# -- WaitTests -------------------------------------------------------------------------------------


def test_wait_20369(executor: cf.Executor) -> None:
    future = executor.submit(mul, 1, 2)
    done, not_done = cf.wait([future, future], timeout=TIMEOUT, return_when=cf.ALL_COMPLETED)
    assert done == {future}
    assert not_done == set()


def test_wait_first_completed(executor: cf.Executor) -> None:
    event = threading.Event()
    future1 = executor.submit(mul, 21, 2)
    future2 = executor.submit(wait_event, event)
    try:
        done, not_done = cf.wait(
            [CANCELLED_FUTURE, future1, future2], timeout=TIMEOUT, return_when=cf.FIRST_COMPLETED
        )
        assert done == {future1}
        assert not_done == {CANCELLED_FUTURE, future2}
    finally:
        event.set()
    future2.result(TIMEOUT)


def test_wait_first_completed_some_already_completed(executor: cf.Executor) -> None:
    event = threading.Event()
    future1 = executor.submit(wait_event, event)
    try:
        finished, pending = cf.wait(
            [CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE, future1],
            timeout=TIMEOUT,
            return_when=cf.FIRST_COMPLETED,
        )
        assert finished == {CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE}
        assert pending == {future1}
    finally:
        event.set()
    future1.result(TIMEOUT)


def test_wait_first_exception(executor: cf.Executor) -> None:
    event1 = threading.Event()
    event2 = threading.Event()
    try:
        future1 = executor.submit(mul, 2, 21)
        future2 = executor.submit(wait_and_raise, event1)
        future3 = executor.submit(wait_event, event2)

        def wait_for_future1() -> None:  # future1 completes before future2 fails
            future1.result(TIMEOUT)
            event1.set()

        t = threading.Thread(target=wait_for_future1)
        t.start()
        finished, pending = cf.wait(
            [future1, future2, future3], timeout=TIMEOUT, return_when=cf.FIRST_EXCEPTION
        )
        assert finished == {future1, future2}
        assert pending == {future3}
        t.join(TIMEOUT)
    finally:
        event1.set()
        event2.set()
    future3.result(TIMEOUT)


def test_wait_first_exception_some_already_complete(executor: cf.Executor) -> None:
    event = threading.Event()
    future1 = executor.submit(divmod, 21, 0)
    future2 = executor.submit(wait_event, event)
    try:
        finished, pending = cf.wait(
            [SUCCESSFUL_FUTURE, CANCELLED_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, future1, future2],
            timeout=TIMEOUT,
            return_when=cf.FIRST_EXCEPTION,
        )
        assert finished == {SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, future1}
        assert pending == {CANCELLED_FUTURE, future2}
    finally:
        event.set()
    future2.result(TIMEOUT)


def test_wait_first_exception_one_already_failed(executor: cf.Executor) -> None:
    event = threading.Event()
    future1 = executor.submit(wait_event, event)
    try:
        finished, pending = cf.wait(
            [EXCEPTION_FUTURE, future1], timeout=TIMEOUT, return_when=cf.FIRST_EXCEPTION
        )
        assert finished == {EXCEPTION_FUTURE}
        assert pending == {future1}
    finally:
        event.set()
    future1.result(TIMEOUT)


def test_wait_all_completed(executor: cf.Executor) -> None:
    future1 = executor.submit(divmod, 2, 0)
    future2 = executor.submit(mul, 2, 21)
    fs = [SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, future1, future2]
    finished, pending = cf.wait(fs, timeout=TIMEOUT, return_when=cf.ALL_COMPLETED)
    assert finished == set(fs)
    assert pending == set()


def test_wait_timeout(executor: cf.Executor) -> None:
    event = threading.Event()
    future = executor.submit(wait_event, event)
    try:
        finished, pending = cf.wait(
            [CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future],
            timeout=0.05,
            return_when=cf.ALL_COMPLETED,
        )
        assert finished == {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE}
        assert pending == {future}
    finally:
        event.set()
    future.result(TIMEOUT)


def test_wait_pending_calls_race(executor: cf.Executor) -> None:
    event = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        fs = {executor.submit(wait_event, event) for _ in range(100)}
        event.set()
        done, pending = cf.wait(fs, timeout=TIMEOUT, return_when=cf.ALL_COMPLETED)
    finally:
        sys.setswitchinterval(old)
    assert not pending
    assert all(f.result() is True for f in done)


# -- AsCompletedTests ------------------------------------------------------------------------------


def test_as_completed_no_timeout(executor: cf.Executor) -> None:
    future1 = executor.submit(mul, 2, 21)
    future2 = executor.submit(mul, 7, 6)
    fs = [CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future1, future2]
    assert set(cf.as_completed(fs, timeout=TIMEOUT)) == set(fs)


@pytest.mark.parametrize("timeout", [0, 0.1])
def test_as_completed_future_times_out(executor: cf.Executor, timeout: float) -> None:
    already = {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE}
    event = threading.Event()
    future = executor.submit(wait_event, event)
    completed = set()
    try:
        with pytest.raises(cf.TimeoutError):
            for f in cf.as_completed(already | {future}, timeout):
                completed.add(f)
    finally:
        event.set()
    assert completed == already
    future.result(TIMEOUT)


def test_as_completed_duplicate_futures(executor: cf.Executor) -> None:
    event = threading.Event()
    future1 = executor.submit(wait_event, event)
    event.set()
    completed = list(cf.as_completed([future1] * 3, timeout=TIMEOUT))
    assert len(completed) == 1


# -- ExecutorShutdownTest --------------------------------------------------------------------------


def test_run_after_shutdown(executor: cf.Executor) -> None:
    executor.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        executor.submit(pow, 2, 5)


def test_hang_issue12364(executor: cf.Executor) -> None:
    event = threading.Event()
    fs = [executor.submit(wait_event, event) for _ in range(50)]
    event.set()
    executor.shutdown()
    assert all(f.result(TIMEOUT) for f in fs)


def test_cancel_futures() -> None:
    """Unstarted work is cancelled; what runs finishes.  With one worker held, all 49 queued are cancelled."""
    gate = Gate()
    ex = ss.executor(max_workers=1)
    first = ex.submit(gate.hold(lambda: "ran"))
    assert gate.started.acquire(timeout=TIMEOUT)
    fs = [ex.submit(mul, i, 2) for i in range(49)]
    closer = threading.Thread(target=ex.shutdown, kwargs={"cancel_futures": True})
    closer.start()
    cf.wait(fs, timeout=TIMEOUT)  # a cancelled future counts as done once it is notified
    assert all(f.cancelled() for f in fs)
    gate.open()
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert first.result(TIMEOUT) == "ran"


def test_hang_gh94440() -> None:
    """shutdown(wait=True) does not hang when a future was submitted and cancelled just before."""
    ex = ss.executor(max_workers=1)
    ex.submit(int).result(TIMEOUT)
    ex.submit(int).cancel()
    ex.shutdown(wait=True)


def test_context_manager_shutdown() -> None:
    with ss.executor(max_workers=5) as e:
        assert list(e.map(abs, range(-5, 5))) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
        thread = e._loop_thread.thread  # type: ignore[attr-defined]
    assert not thread.is_alive()


def test_del_shutdown() -> None:
    """An executor dropped without shutdown closes its engine once its work ran."""
    ex = ss.executor(max_workers=2)
    results = list(ex.map(abs, range(-5, 5)))
    thread = ex._loop_thread.thread  # type: ignore[attr-defined]
    del ex
    gc.collect()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert results == [abs(v) for v in range(-5, 5)]


def test_shutdown_no_wait() -> None:
    ex = ss.executor(max_workers=2)
    res = ex.map(abs, range(-5, 5))
    thread = ex._loop_thread.thread  # type: ignore[attr-defined]
    ex.shutdown(wait=False)
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert list(res) == [abs(v) for v in range(-5, 5)]  # computed before the engine closed


@pytest.mark.parametrize("shutdown", ["", "t.shutdown(wait=False)"])
def test_work_finishes_at_interpreter_exit(shutdown: str) -> None:
    """CPython's test_interpreter_shutdown and test_hang_gh83386: work submitted before exit runs."""
    code = (
        "import threading, schedsvc as ss\n"
        "t = ss.executor(max_workers=3)\n"
        "gate = threading.Event()\n"
        "t.submit(lambda: (gate.wait(10), print('apple', flush=True)))\n"
        f"{shutdown}\n"
        "gate.set()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDSVC_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert out.stdout.strip() == "apple"


# -- ss.executor() options -------------------------------------------------------------------------


def test_executor_config() -> None:
    with ss.executor(max_workers=3, max_pending=7) as ex:
        assert ex.engine.config.cpu_workers == 3
        assert ex.engine.config.max_pending == 7
        assert "open" in repr(ex)
    with pytest.raises(ss.ConfigError, match="max_pending"):
        ss.executor(max_pending=0)
    with pytest.raises(TypeError, match="max_workers"):
        ss.executor(max_workers=1.5)  # type: ignore[arg-type]


def test_future_cancel_semantics() -> None:
    gate = Gate()
    with ss.executor(max_workers=1) as ex:
        running = ex.submit(gate.hold(lambda: 1))
        assert gate.started.acquire(timeout=TIMEOUT)
        queued = ex.submit(mul, 2, 3)
        assert running.running() and not queued.running()
        assert not running.cancel()  # it runs: a worker thread cannot be stopped
        assert queued.cancel() and queued.cancelled() and queued.done()
        assert queued.cancel()  # again: still True
        with pytest.raises(cf.CancelledError):
            queued.result(TIMEOUT)
        gate.open()
        assert running.result(TIMEOUT) == 1
        assert not running.cancel()


def test_submit_blocks_at_max_pending_and_resumes() -> None:
    """A thread at the limits waits in the admission queue (no QueueFull), and goes on when room is made."""
    gate = Gate()
    with ss.executor(max_workers=1, max_pending=1) as ex:
        held = ex.submit(gate.hold(lambda: "held"))
        submitted = threading.Event()
        out: list[cf.Future[Any]] = []

        def producer() -> None:
            out.append(ex.submit(mul, 6, 7))
            submitted.set()

        t = threading.Thread(target=producer)
        t.start()
        rt = ex.engine._rt
        assert rt is not None
        deadline = time.monotonic() + TIMEOUT
        while rt.counts()[6] != 1:  # waiting admission: the producer is queued
            assert time.monotonic() < deadline, "the producer never queued"
            time.sleep(0.001)
        assert not submitted.is_set()
        gate.open()
        assert submitted.wait(TIMEOUT)
        t.join(TIMEOUT)
        assert out[0].result(TIMEOUT) == 42
        assert held.result(TIMEOUT) == "held"


def test_blocked_submission_cancelled_by_shutdown() -> None:
    """shutdown(cancel_futures=True) cancels a submission still waiting for room: it returns cancelled."""
    gate = Gate()
    ex = ss.executor(max_workers=1, max_pending=1)
    ex.submit(gate.hold())
    out: list[cf.Future[Any]] = []
    t = threading.Thread(target=lambda: out.append(ex.submit(mul, 1, 2)))
    t.start()
    rt = ex.engine._rt
    assert rt is not None
    deadline = time.monotonic() + TIMEOUT
    while rt.counts()[6] != 1:
        assert time.monotonic() < deadline, "the producer never queued"
        time.sleep(0.001)
    closer = threading.Thread(target=ex.shutdown, kwargs={"cancel_futures": True})
    closer.start()
    t.join(TIMEOUT)
    assert out and out[0].cancelled()
    gate.open()
    closer.join(TIMEOUT)
    assert not closer.is_alive()


def test_nested_submit_is_admitted_over_the_limits() -> None:
    with ss.executor(max_workers=1, max_pending=1) as ex:

        def outer() -> int:
            return ex.submit(mul, 3, 4).result(TIMEOUT) + 1  # the engine is full: this task holds its slot

        assert ex.submit(outer).result(TIMEOUT) == 13


def test_shutdown_wait_inside_a_task_refuses() -> None:
    with ss.executor(max_workers=1) as ex, pytest.raises(ss.SchedsvcError, match="shutdown"):
        ex.submit(ex.shutdown).result(TIMEOUT)


# -- eng.executor() ------------------------------------------------------------------------------


async def test_engine_executor_from_several_threads() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=8) as eng:
        ex = eng.executor()

        def client(k: int) -> list[int]:
            futures = [ex.submit(mul, k, i) for i in range(50)]
            return [f.result(TIMEOUT) for f in futures]

        results = await within(asyncio.gather(*(asyncio.to_thread(client, k) for k in range(4))))
        assert results == [[k * i for i in range(50)] for k in range(4)]
        ex.shutdown()
        with pytest.raises(RuntimeError, match="after shutdown"):
            ex.submit(mul, 1, 1)
        assert await eng.run(mul, 2, 2) == 4  # the engine stays open


async def test_executor_future_as_dependency() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        ex = eng.executor()
        ones = await asyncio.to_thread(ex.submit, np.ones, 3)
        total = await eng.submit(np.add, ones, 1)
        assert (await total == 2).all()
        # in a container, and before it has finished
        gate = Gate()
        held = ex.submit(gate.hold(lambda: 5))
        summed = await eng.submit(sum, [held, held, 1])
        assert not summed.done()
        gate.open()
        assert await within(summed) == 11
        # a failed executor future fails its dependents
        bad = ex.submit(divmod, 1, 0)
        dependent = await eng.submit(mul, bad, 2)
        with pytest.raises(ss.DependencyError) as info:
            await within(dependent)
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        async with ss.Engine(cpu_workers=1) as other:
            with pytest.raises(ss.InvalidTask, match="another engine"):
                await other.submit(mul, ones, 2)


async def test_asarray_of_an_executor_future() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        ex = eng.executor()
        ones = await asyncio.to_thread(ex.submit, np.ones, 3)
        await asyncio.to_thread(ones.result, TIMEOUT)
        t = eng.asarray(ones)  # done: its value
        assert (t.shape, t.dtype) == ((3,), np.float64)
        np.testing.assert_array_equal(await within(t), np.ones(3))
        gate = Gate()
        held = ex.submit(gate.hold(lambda: np.arange(4.0)))
        with pytest.raises(TypeError, match="shape= and dtype="):
            eng.asarray(held)
        declared = eng.asarray(held, shape=(4,), dtype=np.float64)  # not done: it is a dependency
        assert not declared.done()
        gate.open()
        np.testing.assert_array_equal(await within(declared), np.arange(4.0))
        foreign: cf.Future[Any] = cf.Future()
        with pytest.raises(TypeError, match="has not finished"):
            eng.asarray(foreign)
        foreign.set_result([1.0, 2.0])
        np.testing.assert_array_equal(await within(eng.asarray(foreign)), [1.0, 2.0])


async def test_executor_future_completes_while_the_loop_is_blocked() -> None:
    """The futures are completed where the task ends: a thread sees its result while the engine's loop
    is blocked (a busy loop, or none at all, never holds them up)."""
    async with ss.Engine(cpu_workers=1) as eng:
        ex = eng.executor()
        done = threading.Event()

        def client() -> None:
            if ex.submit(mul, 2, 3).result(TIMEOUT) == 6:
                done.set()

        t = threading.Thread(target=client)
        t.start()
        assert done.wait(TIMEOUT)  # blocks this loop's thread
        t.join(TIMEOUT)


async def test_loop_thread_submit_at_the_limit_refuses() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng, occupied(eng, 1):
        ex = eng.executor()
        with pytest.raises(ss.QueueFull, match="event loop's thread"):
            ex.submit(mul, 1, 2)


async def test_result_on_the_loop_thread_refuses_instead_of_blocking_the_loop() -> None:
    """As ``ss.Future.result()``: on the event loop's thread a future that is not final raises at once
    (its task may be staged until the loop runs again), and a final one gives its value."""
    async with ss.Engine(cpu_workers=1) as eng:
        ex = eng.executor()
        first = ex.submit(mul, 2, 3)
        second = ex.submit(mul, 3, 3)  # staged behind the first until the loop runs again
        with pytest.raises(ss.SchedsvcError, match="event loop's thread"):
            second.result(TIMEOUT)
        with pytest.raises(ss.SchedsvcError, match="event loop's thread"):
            second.exception(TIMEOUT)
        assert await within(asyncio.wrap_future(second)) == 9
        assert second.result() == 9 and second.exception() is None
        assert await within(asyncio.wrap_future(first)) == 6
        gate = Gate()
        held = ex.submit(gate.hold(lambda: 5))
        with pytest.raises(ss.SchedsvcError, match=r"asyncio\.wrap_future"):
            held.result()
        gate.open()
        assert await within(asyncio.wrap_future(held)) == 5


async def test_run_in_executor() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        loop = asyncio.get_running_loop()
        assert await within(loop.run_in_executor(eng.executor(), mul, 6, 7)) == 42


async def test_thread_queues_in_line_with_async_submitters() -> None:
    """FIFO admission: a coroutine queued first is admitted before a thread queued after it."""
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        ex = eng.executor()
        gate = Gate()
        await eng.submit(gate.hold())
        await gate.wait_started(1)
        first = asyncio.ensure_future(eng.submit(mul, 1, 1))
        await state(eng, lambda: eng.stats().waiting_admission == 1)
        second = asyncio.ensure_future(asyncio.to_thread(ex.submit, mul, 2, 2))
        await state(eng, lambda: eng.stats().waiting_admission == 2)
        gate.open()
        a = await within(first)
        b = await within(second)
        assert b._task.seq > a.seq  # type: ignore[attr-defined]
        assert await a == 1 and b.result(TIMEOUT) == 4


async def test_engine_executor_shutdown_cancels_its_futures() -> None:
    async with ss.Engine(cpu_workers=1) as eng, occupied(eng, 1):
        ex = eng.executor()
        queued = [ex.submit(mul, i, 1) for i in range(3)]
        ex.shutdown(wait=False, cancel_futures=True)
        assert all(f.cancelled() for f in queued)


def test_dask_engine_refuses_an_executor() -> None:
    eng = ss.Engine(backend="dask")
    with pytest.raises(ss.SchedsvcError, match="dask"):
        eng.executor()


def test_result_runs_a_queued_task_in_the_waiting_thread() -> None:
    """As ``Future.result``: a thread that would only wait runs a task still queued itself (no timeout)."""
    gate = Gate()
    with ss.executor(max_workers=1) as ex:
        held = ex.submit(gate.hold())
        assert gate.started.acquire(timeout=TIMEOUT)
        assert ex.submit(threading.get_ident).result() == threading.get_ident()
        gate.open()
        held.result(TIMEOUT)


def test_result_with_a_timeout_never_runs_the_task_in_the_caller() -> None:
    """With a timeout the caller only waits, so a task that takes longer cannot outlast it (map's timeout),
    even one of a kind the engine has learned is fast."""
    gate = Gate()
    ready = threading.Event()
    ready.set()
    with ss.executor(max_workers=1) as ex:
        for _ in range(5):
            assert ex.submit(wait_event, ready).result(TIMEOUT)
        held = ex.submit(gate.hold())
        assert gate.started.acquire(timeout=TIMEOUT)
        never = threading.Event()
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError):
            list(ex.map(wait_event, [never], timeout=0.1))
        assert time.monotonic() - t0 < TIMEOUT / 2
        never.set()
        gate.open()
        held.result(TIMEOUT)


class _NotAnException(BaseException):
    """A BaseException that is not an Exception."""


@pytest.mark.parametrize(
    "kind",
    [ValueError, _NotAnException, GeneratorExit, SystemExit, KeyboardInterrupt],
    ids=lambda k: k.__name__,
)
def test_a_done_callback_that_raises_never_ends_a_worker(
    executor: cf.Executor, kind: type[BaseException]
) -> None:
    """The callback runs on the thread that finished the task, a worker: what it raises (SystemExit too) is
    reported, and the worker goes on (it ended, silently for SystemExit, and the engine took work it never
    ran)."""
    for _ in range(2 * WORKERS):  # every worker runs such a callback at least once
        fut = executor.submit(threading.get_ident)
        done = threading.Event()

        def raises(_: Any, done: threading.Event = done) -> None:
            done.set()
            raise kind("from a callback")

        fut.add_done_callback(raises)
        fut.result(TIMEOUT)
        assert done.wait(TIMEOUT)
    results = [executor.submit(pow, 2, i) for i in range(8)]
    assert [f.result(TIMEOUT) for f in results] == [2**i for i in range(8)]


@pytest.mark.parametrize("how", ["wait", "as_completed"])
def test_tasks_that_fan_out_and_wait_with_concurrent_futures_never_starve_the_engine(
    executor: cf.Executor, how: str
) -> None:
    """Every worker runs a task that submits five more and blocks in concurrent.futures.wait (or
    as_completed) for them: 0 of 5 finished, for ever, as ThreadPoolExecutor would; each blocked worker now
    gets a stand-in, as Future.result gives one."""

    def fan_out() -> int:
        fs = [executor.submit(pow, 2, i) for i in range(5)]
        if how == "wait":
            done, _ = cf.wait(fs, timeout=TIMEOUT)
            return len(done)
        return sum(1 for _ in cf.as_completed(fs, timeout=TIMEOUT))

    outer = [executor.submit(fan_out) for _ in range(WORKERS)]
    assert [f.result(2 * TIMEOUT) for f in outer] == [5] * WORKERS
