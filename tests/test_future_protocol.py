"""``ss.Future`` as an asyncio future (``asyncio.wait``, ``as_completed``, ``wait_for``, ``shield``,
``isfuture``, the Task protocol), its trio equivalents through anyio, and the one error of a cancelled task."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import operator
import sys
import threading
import types
from collections.abc import Generator
from typing import Any

import anyio
import numpy as np
import pytest

import schedsvc as ss
from tests.helpers import TIMEOUT, interrupted_twice, occupied, on_asyncio, within

_label: contextvars.ContextVar[str] = contextvars.ContextVar("label", default="none")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _engine() -> ss.Engine:
    """One worker, and an awaited task never runs inline in the awaiting coroutine."""
    return ss.Engine(cpu_workers=1, inline_threshold_us=0)


# -- the asyncio protocol ---------------------------------------------------------------------------


async def test_a_future_is_an_asyncio_future_of_the_engines_loop() -> None:
    async with _engine() as eng:
        fut = eng.submit_nowait(operator.add, 1, 2)
        assert asyncio.isfuture(fut)
        assert fut.get_loop() is asyncio.get_running_loop()
        assert asyncio.ensure_future(fut) is fut  # taken as it is, not wrapped in a task
        assert fut._asyncio_future_blocking is False
        assert await within(fut) == 3


async def test_the_engines_loop_is_known_without_asking_asyncio_for_the_running_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``asyncio._get_running_loop()`` makes a system call (``getpid``) each time: an await, a batched
    call's await, ``get_loop()`` and ``gather`` on the engine's loop read which loop runs instead; from
    another loop the answer is that loop."""
    asked = []
    real = asyncio._get_running_loop

    def counted() -> Any:
        asked.append(1)
        return real()

    async with _engine() as eng, asyncio.timeout(TIMEOUT):  # (not within(): it asks)
        batched = eng.compile(np.negative, batch_axis=0)
        monkeypatch.setattr(asyncio, "_get_running_loop", counted)
        assert await (await eng.submit(operator.add, 1, 2)) == 3
        assert (await batched(np.ones((1, 2)))).tolist() == [[-1.0, -1.0]]
        futures = [eng.submit_nowait(operator.add, i, 1) for i in range(3)]
        assert futures[0].get_loop() is real()
        assert await asyncio.gather(*futures) == [1, 2, 3]
        assert asked == []
        fut = eng.submit_nowait(operator.add, 2, 2)

        async def elsewhere() -> tuple[Any, int]:
            return fut.get_loop(), await fut

        other, value = await asyncio.to_thread(asyncio.run, elsewhere())
        assert other is not real() and value == 4
        assert asked  # (the thread's own loop: asked for)


async def test_setting_a_tasks_outcome_is_refused_and_says_what_to_use() -> None:
    """Type checkers see an asyncio future, whose set_result and set_exception it therefore has: they
    refuse (the engine sets the outcome), and the task's own outcome stands."""
    async with _engine() as eng:
        fut = eng.submit_nowait(operator.add, 1, 2)
        with pytest.raises(ss.SchedsvcError, match=r"set_result\(\): a task's outcome is set by the engine"):
            fut.set_result(5)
        with pytest.raises(ss.SchedsvcError, match=r"set_exception\(\).*loop\.create_future\(\)"):
            fut.set_exception(ValueError())
        assert await within(fut) == 3


async def test_asyncio_wait_returns_done_and_pending_and_leaves_no_callback_behind() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, held):
        quick = eng.submit_nowait(operator.add, 1, 2, device="cpu")
        # the worker is held: `quick` is queued behind it
        done, pending = await asyncio.wait([held[0], quick], timeout=0.01)
        assert done == set() and pending == {held[0], quick}
        assert not held[0].watchers and not quick.watchers  # wait took its callbacks off again
        gate.open()
        done, pending = await within(asyncio.wait([held[0], quick]))
        assert done == {held[0], quick} and pending == set()
        assert quick.result() == 3


async def test_asyncio_wait_first_completed_and_first_exception() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, held):
        failing = eng.submit_nowait(int, "x", priority=1)  # runs first once the gate opens
        later = eng.submit_nowait(operator.add, 1, 1)
        gate.open()
        done, _ = await within(asyncio.wait([later, failing], return_when=asyncio.FIRST_EXCEPTION))
        assert failing in done
        assert isinstance(failing.exception(), ValueError)
        done, _ = await within(asyncio.wait([held[0], later], return_when=asyncio.FIRST_COMPLETED))
        assert done


async def test_as_completed_yields_results_as_tasks_finish() -> None:
    async with _engine() as eng:
        futures = [eng.submit_nowait(operator.mul, i, 10) for i in range(5)]
        got = [await within(next_done) for next_done in asyncio.as_completed(futures, timeout=TIMEOUT)]
        assert sorted(got) == [0, 10, 20, 30, 40]


async def test_as_completed_timeout_takes_its_callbacks_off() -> None:
    async with _engine() as eng, occupied(eng, 1) as (_, held):
        for next_done in asyncio.as_completed([held[0]], timeout=0.01):
            with pytest.raises(TimeoutError):
                await next_done
        assert not held[0].watchers


async def test_wait_for_returns_the_value_and_cancels_a_queued_task_at_its_timeout() -> None:
    async with _engine() as eng:
        assert await asyncio.wait_for(eng.submit_nowait(operator.add, 2, 3), TIMEOUT) == 5
        async with occupied(eng, 1):
            queued = eng.submit_nowait(operator.add, 1, 1)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(queued, 0.01)
            assert queued.cancelled()


async def test_wait_for_on_a_started_task_that_cannot_be_cancelled() -> None:
    """Python 3.11's wait_for leaves nothing running when it returns: a task that has started cannot be
    cancelled, so its value comes back once it ends.  From 3.12 (a timeout around the await) it gives up at
    the deadline and the task runs on."""
    async with _engine() as eng, occupied(eng, 1) as (gate, held):
        assert held[0].cancel() is False
        if sys.version_info >= (3, 12):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(held[0], 0.01)
            assert not held[0].done()
            gate.open()
        else:
            asyncio.get_running_loop().call_later(0.05, gate.open)  # after wait_for has tried to cancel it
            await within(asyncio.wait_for(held[0], 0.01))
        await within(held[0].wait())
        assert held[0].done() and not held[0].cancelled()


async def test_a_timeout_around_await_gives_up_at_its_deadline() -> None:
    async with _engine() as eng, occupied(eng, 1) as (_, held):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await held[0]
        assert not held[0].done()  # started: it runs on


async def test_shield_keeps_the_task_when_its_awaiter_is_cancelled() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        queued = eng.submit_nowait(operator.add, 20, 22)
        shielded = asyncio.shield(queued)
        shielded.cancel()
        with pytest.raises(asyncio.CancelledError):
            await shielded
        assert not queued.cancelled()
        gate.open()
        assert await within(queued) == 42


async def test_gather_takes_futures_as_they_are() -> None:
    async with _engine() as eng:
        futures = [eng.submit_nowait(operator.add, i, 1) for i in range(4)]
        assert await within(asyncio.gather(*futures)) == [1, 2, 3, 4]


async def test_a_tensor_is_awaited_by_asyncio_so_its_queued_writes_are_seen() -> None:
    async with _engine() as eng:
        y = eng.asarray(np.zeros(3)) + 1
        await within(y.wait())  # the task that computes y is done...
        writing = threading.Event()
        gate = threading.Event()

        def held_write(a: Any) -> None:
            writing.set()
            assert gate.wait(TIMEOUT)
            a += 1

        eng.submit_nowait(held_write, y, writes=[y])  # ...and a write of its memory is queued after it
        assert not asyncio.isfuture(y)
        gathered = asyncio.gather(y)
        assert await anyio.to_thread.run_sync(writing.wait, TIMEOUT)
        done, _ = await asyncio.wait([gathered], timeout=0.05)
        assert not done  # asyncio awaits the Tensor: that waits for the write, as `await y` does
        gate.set()
        (value,) = await within(gathered)
        assert value.tolist() == [2.0, 2.0, 2.0]


async def test_done_callbacks_run_on_the_loops_thread_in_their_context() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(operator.add, 1, 1)
        called: list[tuple[int, str]] = []
        seen = asyncio.Event()

        def record(f: ss.Future[int]) -> None:
            assert f is fut
            called.append((threading.get_ident(), _label.get()))
            seen.set()

        context = contextvars.copy_context()
        context.run(_label.set, "given")
        fut.add_done_callback(record, context=context)
        gate.open()  # the task finishes on the worker
        await within(seen.wait())
        assert called == [(threading.get_ident(), "given")]
        # added once final: called soon, on the loop, not at once
        fut.add_done_callback(record)
        assert len(called) == 1
        seen.clear()
        await within(seen.wait())
        assert called[1] == (threading.get_ident(), "none")


async def test_remove_done_callback_counts_and_the_callback_is_not_called() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(operator.add, 1, 1)
        called: list[object] = []
        context = contextvars.copy_context()
        fut.add_done_callback(called.append)
        fut.add_done_callback(called.append, context=context)
        fut.add_done_callback(print)
        assert fut.remove_done_callback(called.append) == 2
        assert fut.remove_done_callback(called.append) == 0
        fut.add_done_callback(called.append)
        gate.open()
        await within(fut.wait())
        await within(asyncio.sleep(0))  # (the loop's drain of the final task has run)
        await within(eng.waitall())
    assert called == [fut]


@types.coroutine
def _yield_blocking(fut: ss.Future[Any]) -> Generator[Any, None, Any]:
    """What ``asyncio.Future.__await__`` does: mark the future blocking and yield it to the Task."""
    fut._asyncio_future_blocking = True
    yield fut
    assert fut.done()
    return fut.result()


@types.coroutine
def _yield_plain(fut: ss.Future[Any]) -> Generator[Any, None, None]:
    yield fut


async def test_a_task_waits_on_a_future_yielded_to_it() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(operator.add, 2, 2)

        async def waits() -> Any:
            return await _yield_blocking(fut)

        task = asyncio.create_task(waits())
        await within(asyncio.sleep(0))  # the task has yielded the future and waits on it
        assert not task.done() and fut._asyncio_future_blocking is False  # the Task took it
        gate.open()
        assert await within(task) == 4


async def test_a_task_refuses_a_future_yielded_without_yield_from() -> None:
    async with _engine() as eng:
        fut = eng.submit_nowait(operator.add, 2, 2)

        async def yields() -> None:
            await _yield_plain(fut)

        with pytest.raises(RuntimeError, match="yield was used instead of yield from"):
            await within(asyncio.create_task(yields()))


async def test_a_future_awaited_on_another_loop_gives_that_loop_to_asyncio() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(operator.add, 3, 4)
        out: list[Any] = []
        waiting = threading.Event()

        async def other() -> Any:
            assert fut.get_loop() is asyncio.get_running_loop()
            waiting.set()
            done, _ = await asyncio.wait([fut], timeout=TIMEOUT)
            return threading.get_ident(), done == {fut}

        thread = threading.Thread(target=lambda: out.append(asyncio.run(other())))
        thread.start()
        assert await anyio.to_thread.run_sync(waiting.wait, TIMEOUT)
        gate.open()
        await within(asyncio.to_thread(thread.join, TIMEOUT))
        assert out == [(thread.ident, True)]


# -- a cancelled task: one error, however it is read -----------------------------------------------


async def test_a_cancelled_task_raises_task_cancelled_from_await_result_and_exception(
    anyio_backend: str,
) -> None:
    async with _engine() as eng, occupied(eng, 1):
        fut = eng.submit_nowait(operator.add, 1, 1)
        assert fut.cancel()
        errors: list[BaseException] = []
        for read in (fut.result, fut.exception):
            with pytest.raises(ss.TaskCancelled) as caught:
                read()
            errors.append(caught.value)
        with pytest.raises(ss.TaskCancelled) as caught:
            await within(fut)
        errors.append(caught.value)
    for error in errors:
        assert isinstance(error, asyncio.CancelledError)
        assert isinstance(error, concurrent.futures.CancelledError)
        assert isinstance(error, ss.SchedsvcError)
        assert "was cancelled" in str(error)


async def test_a_coroutine_that_lets_task_cancelled_through_ends_cancelled() -> None:
    async with _engine() as eng, occupied(eng, 1):
        fut = eng.submit_nowait(operator.add, 1, 1)
        fut.cancel()

        async def reads() -> Any:
            return await fut

        task = asyncio.create_task(reads())
        await asyncio.wait([task], timeout=TIMEOUT)
        assert task.cancelled()


async def test_a_cancelled_await_is_the_librarys_own_cancellation_not_task_cancelled(
    anyio_backend: str,
) -> None:
    async with _engine() as eng, occupied(eng, 1):
        queued = eng.submit_nowait(operator.add, 1, 1)
        with anyio.move_on_after(0.01) as scope:
            await queued
        assert scope.cancelled_caught  # the awaiter's own cancellation, caught by its scope
        assert queued.cancelled()  # and the unstarted task it gave up on is cancelled


# -- the same under trio, through anyio --------------------------------------------------------------


async def test_fail_after_around_await_raises_timeout_and_cancels_a_queued_task(anyio_backend: str) -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        queued = eng.submit_nowait(operator.add, 1, 1)
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.01):
                await queued
        assert queued.cancelled()
        later = eng.submit_nowait(operator.add, 2, 3)
        gate.open()
        with anyio.fail_after(TIMEOUT):
            assert await later == 5


async def test_a_task_group_gathers_futures(anyio_backend: str) -> None:
    async with _engine() as eng:
        futures = [eng.submit_nowait(operator.mul, i, i) for i in range(6)]
        results: dict[int, int] = {}

        async def collect(i: int, fut: ss.Future[int]) -> None:
            results[i] = await fut

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as group:
                for i, fut in enumerate(futures):
                    group.start_soon(collect, i, fut)
        assert results == {i: i * i for i in range(6)}
        assert on_asyncio() == (anyio_backend == "asyncio")


async def test_a_task_group_sees_a_failed_future_and_cancels_the_other_waits(anyio_backend: str) -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, held):
        failed = await eng.submit(int, "x", priority=1)

        async def wait_failed() -> None:
            gate.open()
            await failed

        with pytest.raises(BaseException) as caught:  # an ExceptionGroup (anyio 4) holding the ValueError
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as group:
                    group.start_soon(_await, held[0])
                    group.start_soon(wait_failed)
        assert _leaves(caught.value) == [ValueError]


async def _await(fut: ss.Future[Any]) -> None:
    await fut


def _leaves(exc: BaseException) -> list[type[BaseException]]:
    if isinstance(exc, BaseExceptionGroup):
        return [kind for inner in exc.exceptions for kind in _leaves(inner)]
    return [type(exc)]


async def test_on_a_dask_engine_asyncio_awaits_the_future(dask_address: str) -> None:
    """Its value is on the cluster: asyncio awaits it (which fetches it), never reads ``result()`` on the loop."""
    async with ss.Engine(backend="dask", dask_address=dask_address, cpu_workers=1) as eng:
        futures = [eng.submit_nowait(operator.add, i, 1) for i in range(3)]
        assert not asyncio.isfuture(futures[0])
        assert await within(asyncio.gather(*futures)) == [1, 2, 3]
        assert await asyncio.wait_for(eng.submit_nowait(operator.add, 2, 5), TIMEOUT) == 7


# -- every asyncio combinator with engine futures, under cancellation -----------------------------------------
#
# asyncio's combinators read two members of a cancelled future, ``_make_cancelled_error()`` and
# ``_cancel_message`` (gather's callback did, and raised: the gather never finished).  Each test queues its
# futures behind a busy worker, so they are cancellable, and bounds every wait.


async def test_gather_ends_with_the_cancellation_of_a_future_it_gathers() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        gathered = asyncio.gather(a, b)
        assert b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(gathered)
        assert b.cancelled()


async def test_gather_with_return_exceptions_gives_a_cancelled_futures_error_in_its_place() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        gathered = asyncio.gather(a, b, return_exceptions=True)
        assert b.cancel()
        gate.open()
        got = await within(gathered)
        assert got[0] == 2 and isinstance(got[1], asyncio.CancelledError)


async def test_a_timeout_around_gather_ends_it_and_cancels_the_queued_futures() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await within(asyncio.gather(a, b))
        assert a.cancelled() and b.cancelled()


async def test_cancelling_a_gather_cancels_its_queued_futures() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        gathered = asyncio.gather(a, b)
        await asyncio.sleep(0)
        gathered.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(gathered)
        assert a.cancelled() and b.cancelled()


async def test_wait_returns_a_cancelled_future_among_the_done() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        waiting = asyncio.ensure_future(asyncio.wait([a, b], return_when=asyncio.FIRST_COMPLETED))
        await asyncio.sleep(0)
        assert a.cancel()
        done, pending = await within(waiting)
        assert done == {a} and pending == {b}
        assert b.cancel()


async def test_as_completed_yields_a_cancelled_future_as_it_ends() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        a, b = eng.submit_nowait(operator.add, 1, 1), eng.submit_nowait(operator.add, 2, 2)
        assert a.cancel()
        gate.open()
        outcomes = []
        for next_done in asyncio.as_completed([a, b], timeout=TIMEOUT):
            try:
                outcomes.append(await next_done)
            except asyncio.CancelledError:
                outcomes.append("cancelled")
        assert outcomes == ["cancelled", 4]


async def test_wait_for_a_future_cancelled_meanwhile_raises_cancelled_error() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a = eng.submit_nowait(operator.add, 1, 1)
        asyncio.get_running_loop().call_soon(a.cancel)
        with pytest.raises(asyncio.CancelledError):
            await within(asyncio.wait_for(a, TIMEOUT))


async def test_shield_of_a_future_cancelled_meanwhile_raises_cancelled_error() -> None:
    async with _engine() as eng, occupied(eng, 1):
        a = eng.submit_nowait(operator.add, 1, 1)
        shielded = asyncio.shield(a)
        assert a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(shielded)


async def test_a_task_group_whose_member_fails_cancels_the_other_awaits_and_their_queued_tasks() -> None:
    async with _engine() as eng, occupied(eng, 1):
        queued = eng.submit_nowait(operator.add, 1, 1)

        async def waits() -> None:
            await queued

        async def fails() -> None:
            raise ValueError("member failed")

        with pytest.raises(ExceptionGroup) as info:
            async with asyncio.TaskGroup() as group:
                group.create_task(waits())
                group.create_task(fails())
        assert info.group_contains(ValueError)
        assert queued.cancelled()  # its awaiter was cancelled: an unstarted task is not wanted


_GATHER_INTERRUPTED = """
import asyncio, threading
import schedsvc as ss

never = threading.Event()

def long_task():
    print("started", flush=True)
    never.wait(60)

async def main():
    async with ss.Engine(cpu_workers=1) as eng:
        running = eng.submit_nowait(long_task)
        queued = eng.submit_nowait(long_task)
        await asyncio.gather(running, queued)

asyncio.run(main())
"""


def test_ctrl_c_during_a_gather_of_futures_ends_the_program_after_a_second_one() -> None:
    """The first Ctrl-C cancels the gather (its callback used to raise there, and the program never ended,
    even on a second Ctrl-C); the close then waits for the running task, and a second Ctrl-C exits."""
    said, _, returncode = interrupted_twice(_GATHER_INTERRUPTED)
    assert "waiting for 1 running task" in said, said
    assert returncode != 0


# -- a done-callback that raises: every other awaiter is still woken ---------------------------------------


class _NotAnException(BaseException):
    """A BaseException that is not an Exception, as pytest's ``Failed`` or a library's cancellation."""


_KINDS = [ValueError, GeneratorExit, _NotAnException, asyncio.CancelledError]


@pytest.mark.parametrize("kind", _KINDS, ids=lambda k: k.__name__)
async def test_a_done_callback_that_raises_leaves_the_other_awaiters_woken(kind: type[BaseException]) -> None:
    """asyncio's futures wake every other callback and report the error; so does the engine (a BaseException
    that is not an Exception dropped the wake-ups of every other awaiter)."""
    reported: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    try:
        async with _engine() as eng, occupied(eng, 1) as (gate, _):
            fut = eng.submit_nowait(operator.add, 2, 3)
            called: list[int] = []

            def raises(_: Any) -> None:
                raise kind("from a callback")

            fut.add_done_callback(raises)
            fut.add_done_callback(lambda _: called.append(1))
            awaiters = [asyncio.ensure_future(fut.wait()) for _ in range(2)]
            await asyncio.sleep(0)
            gate.open()
            await within(asyncio.gather(*awaiters))
            assert await within(fut) == 5 and called == [1]
    finally:
        loop.set_exception_handler(None)
    assert [type(e) for e in reported] == [kind]


async def test_a_done_callback_that_raises_under_trio_leaves_the_other_awaiters_woken() -> None:
    reported: list[str] = []

    async def main() -> None:
        async with _engine() as eng, occupied(eng, 1) as (gate, _):
            fut = eng.submit_nowait(operator.add, 2, 3)
            woken: list[int] = []

            def raises(_: Any) -> None:
                raise _NotAnException("from a callback")

            async def awaiter() -> None:
                await fut.wait()
                woken.append(1)

            fut.add_done_callback(raises)
            async with anyio.create_task_group() as group:
                group.start_soon(awaiter)
                group.start_soon(awaiter)
                await anyio.sleep(0)
                gate.open()
            assert woken == [1, 1] and await fut == 5

    import logging

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reported.append(record.getMessage())

    handler = Catch()
    logging.getLogger("schedsvc").addHandler(handler)
    try:
        await anyio.to_thread.run_sync(lambda: anyio.run(main, backend="trio"))
    finally:
        logging.getLogger("schedsvc").removeHandler(handler)
    assert any("done callback" in r for r in reported), reported


# -- NumPy's protocol: a future's value as an array ------------------------------------------------


async def test_a_future_is_an_array_once_its_value_is_there_and_refuses_before_on_the_loop() -> None:
    """``np.asarray(fut)`` and ``np.sum(fut)`` used to give an object array around the future."""
    async with _engine() as eng:
        async with occupied(eng, 1):
            fut = eng.submit_nowait(np.arange, 6.0)
            with pytest.raises(TypeError, match=r"would block the event loop; use 'await fut'"):
                np.asarray(fut)
        await within(fut)
        assert np.asarray(fut).dtype == np.float64 and np.sum(fut) == 15.0
        assert np.asarray(fut, dtype=np.float32).dtype == np.float32
        assert (np.asarray(fut) + 1).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        failed = eng.submit_nowait(np.sqrt, "x")
        await within(failed.wait())
        with pytest.raises(Exception) as raised:
            np.asarray(failed)
        assert raised.value is failed.error


async def test_off_the_loop_a_future_as_an_array_waits_for_its_value() -> None:
    async with _engine() as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(np.ones, 3)
        waiting = asyncio.get_running_loop().run_in_executor(None, np.sum, fut)
        gate.open()
        assert await asyncio.wait_for(waiting, TIMEOUT) == 3.0


def test_a_tensor_is_an_array_after_its_loop_has_ended() -> None:
    """It used to say waiting "would block the event loop" though the loop was gone and the value there."""

    async def main() -> ss.Tensor:
        async with _engine() as eng:
            t = eng.asarray(np.arange(4.0)) * 2
            await within(t)
            assert np.asarray(t).tolist() == [0.0, 2.0, 4.0, 6.0]  # there: no wait on the loop either
            return t

    t = asyncio.run(main())
    assert np.asarray(t).tolist() == [0.0, 2.0, 4.0, 6.0] and t.tolist() == [0.0, 2.0, 4.0, 6.0]
