"""Regressions: one test per concurrency bug that a code review reproduced (and that is now fixed).

Each test's docstring says what used to go wrong.  A deadlock fails through a bounded wait (and the engine's
close is bounded too, see ``started``), never by hanging the suite; a leak is checked with a weak reference.
Some tests look at the runtime's internals (``eng._rt``) to set up an exact state, or to make sure that the
path the bug was on is still the path the test takes.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import operator
import os
import select
import signal
import textwrap
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc._core import Scheduler, Task

from .helpers import (
    TIMEOUT,
    Gate,
    interrupted_twice,
    occupied,
    started,
    state,
    until,
    wait_thread_event,
    within,
)

# -- helpers -----------------------------------------------------------------------------------------


async def await_while_queued(fut: ss.Future[Any], gate: Gate) -> Any:
    """Await ``fut`` while it is queued behind the tasks ``gate`` holds, then open the gate.

    The gate opens only once this coroutine has suspended, so the awaiter is registered before any worker
    can take the task: the worker runs it as an *awaited* task, which is when the engine learns task costs.
    """
    async with asyncio.timeout(TIMEOUT):
        asyncio.get_running_loop().call_soon(gate.open)
        return await fut


def block_loop_until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Poll ``condition`` on the event-loop thread *without* yielding to the loop (bounded).

    For a state the worker threads reach by themselves, when letting the loop run its callbacks would
    change what is tested (the scheduled flush that re-arms the eager hand-off budget).
    """
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the worker threads"
        time.sleep(1e-4)


async def next_loop_step() -> None:
    """Return once every callback already scheduled on the loop has run (callbacks run in FIFO order)."""
    ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(ran.set)
    await within(ran.wait())


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("schedsvc-")]


class Payload:
    """An object whose lifetime a test watches through a weak reference."""


class KeyErrorProxy:
    """A callable proxy object: looking up an attribute it does not have raises KeyError."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def __getattr__(self, key: str) -> Any:
        return self._data[key]

    def __call__(self, x: int = 0) -> int:
        return x + 1


class ValueErrorHash:
    """A callable whose __hash__ raises something other than TypeError."""

    def __hash__(self) -> int:
        raise ValueError("not hashable")

    def __call__(self, x: int = 0) -> int:
        return x + 1


class FailingProxy(KeyErrorProxy):
    def __call__(self, x: int = 0) -> int:
        raise ValueError("bad input")


class UnprintableError(Exception):
    def __str__(self) -> str:
        return "error {}: {}".format(*self.args[0])  # the code is not a pair: str() raises TypeError


def raise_unprintable(_: int) -> None:
    raise UnprintableError(42)


# -- waiting inside tasks --------------------------------------------------------------------------------


async def test_result_inside_a_task_runs_only_the_awaited_task() -> None:
    """r1: result() in a task ran the awaited task *and* the dependent it made ready on the waiting task's
    stack; a dependent that needs the waiting task to finish (a buffer hazard) deadlocked the engine."""
    a = np.zeros(4)
    async with started(cpu_workers=1, inline_threshold_us=0) as eng:

        def reader(v: int) -> float:  # a dependent of x; its nested task reads a, which outer writes
            return float(eng.submit_nowait(np.sum, a).result(TIMEOUT)) + v

        def outer(arr: np.ndarray) -> tuple[int, ss.Future[float]]:
            x = eng.submit_nowait(operator.add, 1, 1)  # queued: this task holds the only worker
            y = eng.submit_nowait(reader, x)
            got = x.result(TIMEOUT)  # this thread claims x and runs it here
            arr.fill(1)
            return got, y

        fut = await eng.submit(outer, a, writes=a)
        await within(fut.wait())
        got, y = fut.result()
        assert got == 2
        assert await within(y) == 4.0 + 2


async def test_a_cheap_awaited_task_that_submits_work_runs_on_a_worker_where_it_is_nested() -> None:
    """r2/r2b: a cheap awaited task run inline on the event-loop thread did not count as nested, so its
    submit_nowait at max_pending raised QueueFull where the same task on a worker is admitted.  A user's
    function no longer runs on the loop's thread at all (it might wait for the loop): it runs on a worker,
    where its submissions are nested."""
    loop_thread = threading.get_ident()
    async with started(cpu_workers=1, max_pending=2, inline_threshold_us=1e6) as eng:
        ran_on: list[int] = []

        def spawn() -> int:
            ran_on.append(threading.get_ident())
            return eng.submit_nowait(operator.add, 3, 4).result(TIMEOUT)

        # first, on the worker and awaited: the engine learns that spawn is cheap
        gate = Gate()
        eng.submit_nowait(gate.hold())
        await gate.wait_started(1)
        first = eng.submit_nowait(spawn)  # 2 of 2 pending
        assert await await_while_queued(first, gate) == 7
        assert ran_on[-1] != loop_thread
        # then, known to be cheap, with the engine full again: still on a worker, and nested there
        second = eng.submit_nowait(spawn)
        assert await within(second) == 7
        assert ran_on[-1] != loop_thread


async def test_result_on_another_engines_future_runs_it_on_that_engine() -> None:
    """r14: a task of engine A calling result() on a queued future of engine B ran B's task through A's
    runtime: A recorded a task it never admitted (its worker died on the buffers) and B never learnt that
    the task finished, so B's awaiters and B.waitall() hung."""
    async with (
        started(cpu_workers=1, inline_threshold_us=0) as a_eng,
        started(cpu_workers=1, inline_threshold_us=0) as b_eng,
    ):
        async with occupied(b_eng, 1):  # B's only worker is busy: fb stays queued
            fb = b_eng.submit_nowait(np.sum, np.ones(3))
            fa = a_eng.submit_nowait(lambda: fb.result())  # no timeout: the waiting worker may run fb itself
            assert await within(fa) == 3.0  # A's worker ran fb, on B's behalf
            assert fb.done()
        await within(b_eng.waitall())
        assert await within(fb) == 3.0
        a, b = a_eng.stats(), b_eng.stats()
        assert (a.submitted, a.completed, a.pending, a.running) == (1, 1, 0, 0)
        assert (b.submitted, b.completed, b.pending, b.running) == (2, 2, 0, 0)


async def test_sync_mode_with_two_threads_ordered_by_a_buffer() -> None:
    """r18: in sync_mode, the thread finishing a writer was handed the reader that another thread waited for
    (and then failed ``assert nxt is None``): the reader never ran and the other thread hung in result()."""
    a = np.zeros(3)
    async with started(cpu_workers=1, sync_mode=True) as eng:
        gate = Gate()
        out: dict[str, Any] = {}

        def write() -> str:
            a[:] += 1
            return "written"

        def run(key: str, fn: Callable[[], Any]) -> None:
            try:
                out[key] = fn()
            except BaseException as exc:
                out[key] = exc

        writer = threading.Thread(
            target=run, args=("writer", lambda: eng.submit_nowait(gate.hold(write), writes=a).result())
        )
        reader = threading.Thread(target=run, args=("reader", lambda: eng.submit_nowait(np.sum, a).result()))
        writer.daemon = reader.daemon = True  # a regression leaves the reader blocked for good
        writer.start()
        await gate.wait_started(1)  # the writer runs in its thread
        reader.start()
        await state(eng, lambda: eng.stats().pending == 2)  # the reader is admitted, ordered after the writer
        gate.open()
        for thread in (writer, reader):
            await within(asyncio.to_thread(thread.join, TIMEOUT))
            assert not thread.is_alive(), f"{thread.name} is still blocked"
        assert out == {"writer": "written", "reader": 3.0}


# -- user code inside the engine's bookkeeping -----------------------------------------------------------


@pytest.mark.parametrize("make", [KeyErrorProxy, ValueErrorHash])
async def test_a_callable_raising_on_attribute_lookup_or_hash_runs_normally(make: Callable[[], Any]) -> None:
    """r8: the cost key was computed outside the task's try: a callable whose __getattr__ raised KeyError (or
    whose __hash__ raised ValueError) made ``await fut`` raise, or killed the worker and left the task running."""
    async with started(
        cpu_workers=2
    ) as eng:  # the default inline threshold: awaited tasks' costs are learned
        gate = Gate()
        for _ in range(2):
            eng.submit_nowait(gate.hold())
        await gate.wait_started(2)
        fut = eng.submit_nowait(make(), 1)
        assert await await_while_queued(fut, gate) == 2  # awaited while queued, run by a watched worker
        assert await within(eng.run(make(), 2)) == 3
        await within(eng.waitall())


@pytest.mark.parametrize(
    "fn", [raise_unprintable, FailingProxy()], ids=["exception-str-raises", "fn-getattr-raises"]
)
async def test_a_failure_that_cannot_be_described_still_fails_its_dependents(fn: Any) -> None:
    """r9: the core built the DependencyError with str(error) and getattr(fn, "__name__") under the engine
    lock; when either raised, finish() stopped half way: the worker died, the dependent never resolved, and
    waitall() and aclose() hung."""
    async with started(cpu_workers=2, inline_threshold_us=0) as eng:
        async with occupied(eng, 2):  # both are admitted before the parent runs
            parent = eng.submit_nowait(fn, 1)
            child = eng.submit_nowait(abs, parent)
        await within(eng.waitall())
        original = parent.exception()
        assert isinstance(original, UnprintableError | ValueError)
        error = child.exception()
        assert isinstance(error, ss.DependencyError)
        assert error.__cause__ is original
        assert "did not run" in str(error)
        late = eng.submit_nowait(abs, parent)  # a dependent of the failed task, failed at admission
        await within(late.wait())
        assert isinstance(late.exception(), ss.DependencyError)
        assert late.exception().__cause__ is original  # type: ignore[union-attr]
        assert await within(eng.run(operator.add, 1, 1)) == 2


async def test_queue_full_for_a_callable_with_a_raising_getattr_loses_no_wake_up() -> None:
    """r10: at the limits, submit_nowait took parked workers to wake for the staged burst but formatted the
    QueueFull message (repr of the task: fn.__getattr__ raising KeyError) before waking them; the workers
    stayed parked with work ready, and waitall() hung."""
    async with started(cpu_workers=2, max_pending=2, inline_threshold_us=0) as eng:
        rt = eng._rt
        assert rt is not None
        pool = rt.devices["cpu"]
        # Spend the loop thread's eager hand-off budget (one task per worker), then stay on the loop thread
        # without yielding: the flush the loop would run next re-arms the budget.
        spent = [eng.submit_nowait(operator.add, i, 0) for i in range(2)]
        block_loop_until(lambda: all(f.done() for f in spent) and len(pool.idle) == 2)
        staged = [eng.submit_nowait(operator.add, i, 10) for i in range(2)]  # held for the flush; 2 of 2
        assert len(rt.core.staged) == 2 and not rt.core.queues["cpu"].count
        try:
            eng.submit_nowait(KeyErrorProxy())  # publishes the burst and wakes both parked workers
        except Exception as exc:
            refused = exc
        else:
            pytest.fail("admitted over max_pending")
        await within(eng.waitall())  # the staged tasks run: the parked workers were woken
        assert [f.result() for f in staged] == [10, 11]
        assert isinstance(refused, ss.QueueFull), repr(refused)


def test_a_finishing_worker_is_never_handed_a_task_of_another_device() -> None:
    """r13: Scheduler.finish() handed the dependent it made ready to the finishing worker without looking
    at its device: a cpu worker finishing a cpu task was given a cuda:0 task to run."""
    core = Scheduler(max_pending=10, max_pending_bytes=1 << 40, devices=("cpu", "cuda:0"), check=True)
    a = Task(device="cpu", name="a")
    on_gpu = Task(device="cuda:0", deps=(a,), name="on_gpu")
    on_cpu = Task(device="cpu", deps=(a,), name="on_cpu")
    for t in (a, on_gpu, on_cpu):
        assert core.submit(t)
    core.validate()
    assert core.take("cpu") is a
    assert core.finish(a, 1) is on_cpu  # the cpu dependent still runs at once; the cuda one is queued
    core.validate()
    assert on_gpu.state == "ready"
    assert core.take("cpu") is None
    assert core.take("cuda:0") is on_gpu
    assert core.finish(on_gpu, 2) is None
    assert core.finish(on_cpu, 3) is None
    core.validate()
    assert core.pending == 0


# -- closing --------------------------------------------------------------------------------------------


async def test_a_cancelled_aclose_does_not_block_the_event_loop() -> None:
    """r6: when aclose() was cancelled (wait_for around it), it joined the worker threads on the event-loop
    thread, freezing every coroutine, even one that a running task waited for, for up to 30 s."""
    eng = await ss.Engine(cpu_workers=1).start()
    running, release = threading.Event(), threading.Event()

    def wait_for_the_loop() -> bool:
        running.set()
        return release.wait(TIMEOUT)

    fut = eng.submit_nowait(wait_for_the_loop)
    await wait_thread_event(running)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(eng.aclose(), 0.05)
    # the cancelled close did not wait for the running task (a blocked loop would only return once it ended)
    assert fut.running()

    async def releaser() -> None:  # the loop is free: another coroutine runs, and the task sees it
        release.set()

    await within(asyncio.create_task(releaser()))
    assert await within(fut) is True
    await within(eng.aclose())
    for thread in engine_threads():  # told to stop by the cancelled close; a later aclose() does not join
        await within(asyncio.to_thread(thread.join, TIMEOUT))


async def test_running_tasks_submit_nested_work_while_the_engine_closes() -> None:
    """r12: once aclose() had started, a running task's nested submissions raised EngineClosed, so a fan-out
    task failed just because the ``async with`` block was left before it finished."""
    eng = await ss.Engine(cpu_workers=2).start()
    gate = Gate()

    def fanout(n: int) -> int:
        return sum(f.result(TIMEOUT) for f in [eng.submit_nowait(abs, -i) for i in range(n)])

    fut = eng.submit_nowait(gate.hold(lambda: fanout(4)))
    await gate.wait_started(1)
    closing = asyncio.create_task(eng.aclose())
    await state(eng, lambda: eng.closed)
    with pytest.raises(ss.EngineClosed):
        eng.submit_nowait(abs, 1)  # from outside a task, the closing engine refuses work
    gate.open()
    await within(closing)
    assert fut.result() == 0 + 1 + 2 + 3


async def test_a_second_aclose_waits_for_the_first() -> None:
    """r17: a second aclose() during a close marked the engine closed and returned at once, while a task
    still ran and the threads were alive (and waitall() in the meantime raised EngineClosed)."""
    eng = await ss.Engine(cpu_workers=1).start()
    gate = Gate()
    held = eng.submit_nowait(gate.hold(lambda: "held"))
    await gate.wait_started(1)
    first = asyncio.create_task(eng.aclose())
    await state(eng, lambda: eng.closed)
    second = asyncio.create_task(eng.aclose())
    waiting = asyncio.create_task(eng.waitall())
    await next_loop_step()  # both have run up to their first wait, or finished
    assert not second.done(), "the second aclose() returned while a task was still running"
    assert not waiting.done()
    gate.open()
    await within(second)
    assert held.result() == "held"
    assert not engine_threads()
    await within(first)
    await within(waiting)


async def test_cancel_pending_refuses_a_submitter_waiting_on_another_event_loop() -> None:
    """r16: aclose(cancel_pending=True) failed the admission token of a submitter waiting on another thread's
    event loop by calling set_exception from the wrong thread: that loop was never woken, the submitter hung."""
    eng = await ss.Engine(cpu_workers=1, max_pending=1, inline_threshold_us=0).start()
    outcome: list[str] = []
    finished = threading.Event()
    other_loop: list[asyncio.AbstractEventLoop] = []

    async def submit_there() -> None:
        other_loop.append(asyncio.get_running_loop())
        try:
            await eng.submit(abs, -1)  # the engine is full: waits for admission on this thread's loop
            outcome.append("admitted")
        except ss.EngineClosed:
            outcome.append("refused")

    def other_thread() -> None:
        try:
            asyncio.run(submit_there())
        finally:
            finished.set()

    thread = threading.Thread(target=other_thread, daemon=True)
    gate = Gate()
    held = eng.submit_nowait(gate.hold())
    await gate.wait_started(1)
    thread.start()
    await state(eng, lambda: eng.stats().waiting_admission == 1)
    closing = asyncio.create_task(eng.aclose(cancel_pending=True))
    try:
        assert await asyncio.to_thread(finished.wait, TIMEOUT), (
            "the submitter on the other loop was never woken"
        )
    finally:
        if not finished.is_set():  # wake that loop so that the thread can end
            other_loop[0].call_soon_threadsafe(lambda: None)
        gate.open()
        await within(closing)
    await within(asyncio.to_thread(thread.join, TIMEOUT))
    assert outcome == ["refused"]
    assert held.done()


# -- what the engine keeps alive --------------------------------------------------------------------------


async def test_the_cost_table_keeps_no_callable_alive() -> None:
    """r3: task costs were keyed by the callable itself when it had no __code__ (a functools.partial, a
    callable instance), keeping it and what it captured alive after its future was gone."""

    def use(_: Payload, x: int) -> int:
        return x + 1

    class Scaler:
        def __init__(self, payload: Payload) -> None:
            self.payload = payload

        def __call__(self, x: int) -> int:
            return x * 2

    cases: list[tuple[Callable[[Payload], Callable[[int], int]], int]] = [
        (lambda p: functools.partial(use, p), 21),
        (Scaler, 40),
    ]
    refs = []
    async with started(cpu_workers=1) as eng:  # the default inline threshold: costs are learned
        rt = eng._rt
        assert rt is not None
        for make, expected in cases:
            payload = Payload()
            refs.append(weakref.ref(payload))
            gate = Gate()
            eng.submit_nowait(gate.hold())
            await gate.wait_started(1)
            fut = eng.submit_nowait(make(payload), 20)
            del payload
            assert await await_while_queued(fut, gate) == expected
            del fut
        await within(eng.waitall())
        assert len(rt._costs) >= 2, "no cost was learned: the test no longer covers the cost table"
        gc.collect()
        assert [r() for r in refs] == [None, None], "the engine keeps a finished task's callable alive"


async def test_a_claimed_task_does_not_stay_in_the_ready_queue() -> None:
    """r5: a task claimed out of the ready queue (by a thread waiting in result()) left a stale entry behind
    once the queue was empty, keeping the finished future and its value alive until more work came."""
    async with started(cpu_workers=1, inline_threshold_us=0) as eng:
        rt = eng._rt
        assert rt is not None
        queue = rt.core.queues["cpu"]
        async with occupied(eng, 1):
            fut = eng.submit_nowait(Payload)
            await state(eng, lambda: queue.count == 1)  # in the queue, not staged
            value = await within(asyncio.to_thread(fut.result))  # a plain thread claims and runs it
            assert queue.count == 0
        await within(eng.waitall())
        ref = weakref.ref(value)
        del fut, value
        gc.collect()
        assert ref() is None, "the ready queue keeps a claimed task's future alive"


async def test_a_finished_future_lets_go_of_its_callable_and_callbacks(engine: ss.Engine) -> None:
    """r15: a finished task dropped its arguments but kept fn and its done-callbacks, so what a closure or
    a callback captured lived as long as the result future."""
    in_fn, in_callback = Payload(), Payload()
    refs = weakref.ref(in_fn), weakref.ref(in_callback)
    called = asyncio.Event()
    gate = Gate()
    fut = engine.submit_nowait(gate.hold(lambda p=in_fn: "value"))
    fut.add_done_callback(lambda _, p=in_callback: called.set())  # registered while the task runs
    del in_fn, in_callback
    gate.open()
    await within(called.wait())
    await within(engine.waitall())
    gc.collect()
    assert fut.result() == "value"
    assert refs[0]() is None, "the finished future still holds its callable"
    assert refs[1]() is None, "the finished future still holds its done-callback"


_INTERRUPTED_SCRIPT = """
import asyncio, threading, trio
import schedsvc as ss

never = threading.Event()

def long_task():
    print("started", flush=True)
    never.wait(60)

async def main():
    async with ss.Engine(cpu_workers=1) as eng:
        await eng.submit(long_task)
        await eng.submit(long_task)  # queued behind the first: the first Ctrl-C cancels it
        await eng.waitall()

asyncio.run(main()) if "{library}" == "asyncio" else trio.run(main)
"""


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_ctrl_c_says_what_the_close_waits_for_and_a_second_one_exits(library: str) -> None:
    """The first Ctrl-C cancelled the queue, then waited for the running tasks without a word (19 s for a 20 s
    task): it now says, once, how many running tasks it waits for and that a second Ctrl-C exits, which it does
    (under trio too, where Ctrl-C is a KeyboardInterrupt in the main task, not a cancellation)."""
    code = textwrap.dedent(_INTERRUPTED_SCRIPT).replace("{library}", library)
    said, rest, returncode = interrupted_twice(code)
    assert "waiting for 1 running task to finish (press Ctrl-C again to exit without waiting)" in said, said
    assert returncode != 0
    assert "running task" not in rest  # said once
    assert "KeyboardInterrupt" in rest


async def test_throttle_lets_waiters_through_one_per_free_slot() -> None:
    """i15.9: when a slot freed, the admission step let every throttle() waiter through without counting
    them, so 200 producers doing ``await eng.throttle()`` then a Tensor op reached 84-198 pending with
    max_pending=8."""
    limit = 8
    async with started(cpu_workers=2, max_pending=limit) as eng:
        x = eng.asarray(np.ones(4))
        peak = 0

        async def producer() -> None:
            nonlocal peak
            await eng.throttle()
            x + 1  # a Tensor op: admitted over the limits, so only throttle() bounds it
            peak = max(peak, eng.stats().pending)

        async with occupied(eng, 2):  # nothing finishes until the producers are queued
            producers = [asyncio.create_task(producer()) for _ in range(200)]
            await state(eng, lambda: eng.stats().waiting_admission == 200 - (limit - 2))
        await within(asyncio.gather(*producers))
        await within(eng.waitall())
    assert peak == limit


async def test_a_throttle_caller_keeps_its_turn_ahead_of_a_queued_submission() -> None:
    """i15.9: throttle() waiters and ``await submit`` waiters queue in one FIFO; a throttle() caller let
    through must be able to submit on the slot it waited for (no QueueFull because a later waiter is
    queued), and the submission queued behind it must not take that slot."""
    async with started(cpu_workers=1, max_pending=1) as eng:
        order: list[str] = []

        async def throttler(name: str) -> ss.Future[None]:
            await eng.throttle()
            order.append(name)
            return eng.submit_nowait(order.append, f"{name} ran")

        async def submitter() -> ss.Future[None]:
            return await eng.submit(order.append, "s ran")

        async with occupied(eng, 1):
            first = asyncio.create_task(throttler("t1"))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            middle = asyncio.create_task(submitter())
            await state(eng, lambda: eng.stats().waiting_admission == 2)
            last = asyncio.create_task(throttler("t2"))
            await state(eng, lambda: eng.stats().waiting_admission == 3)
        futures = await within(asyncio.gather(first, middle, last))
        await within(asyncio.gather(*futures))
        await within(eng.waitall())
    assert order == ["t1", "t1 ran", "s ran", "t2", "t2 ran"]


async def test_a_compiled_call_is_admitted_within_the_limits() -> None:
    """i15.10: a compiled call was admitted over the limits like a Tensor operator: 50 calls with
    max_pending=8 left 50 pending, with no QueueFull and no waiting.  Now ``mlp(x)`` is admitted as
    ``submit_nowait`` is, and the first call (the trace) counts too."""
    limit = 8
    async with started(cpu_workers=2, max_pending=limit) as eng:
        mlp = eng.compile(lambda x: np.maximum(x @ x.T, 0))
        x = eng.asarray(np.ones((2, 2)))
        async with occupied(eng, 2):
            outputs = [mlp(x) for _ in range(limit - 2)]  # the first one traces
            assert eng.stats().pending == limit
            with pytest.raises(ss.QueueFull, match=r"await compiled\.submit"):
                mlp(x)
            assert eng.stats().pending == limit
            assert mlp.stats()["replays"] == limit - 2  # the refused call is not counted
        for out in outputs:
            assert (await within(out) == 2.0).all()


async def test_stats_does_not_sort_the_queue_wait_window_on_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """i15.11: every ``stats()`` sorted the 8,192 recent queue waits twice for its percentiles, so after
    10,000 tasks it took about a millisecond instead of microseconds, and a service that read it per
    request lost a third of its throughput.  The percentiles are now recomputed once an eighth of the
    window is new."""
    import schedsvc._engine as engine_module

    sorts = 0

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            nonlocal sorts
            sorts += 1
            return real(*args)

        return wrapper

    for name in ("percentile", "percentiles"):  # whichever the engine sorts with
        if hasattr(engine_module, name):
            monkeypatch.setattr(engine_module, name, counted(getattr(engine_module, name)))
    async with started(cpu_workers=2) as eng:
        await within(asyncio.gather(*(eng.submit_nowait(operator.add, i, 1) for i in range(200))))
        await within(eng.waitall())
        eng.stats()
        before = sorts
        for _ in range(100):
            eng.stats()
        assert sorts == before, "stats() sorted the window again with no new samples"


async def test_stats_percentiles_follow_new_samples_within_an_eighth_of_the_window() -> None:
    """i15.11 (the other side): the cached percentiles are refreshed once enough tasks have ended."""
    async with started(cpu_workers=1) as eng:
        rt = eng._rt
        assert rt is not None
        await within(asyncio.gather(*(eng.submit_nowait(operator.add, i, 1) for i in range(16))))
        await within(eng.waitall())
        assert eng.stats().queue_wait_p50_s < 5.0
        with rt.lock:
            rt.queue_waits.clear()
            rt.queue_waits.extend([5.0] * 16)  # as if 16 tasks had waited 5 s
        assert eng.stats().queue_wait_p50_s < 5.0  # no task ended since: the cached figure
        await within(asyncio.gather(*(eng.submit_nowait(operator.add, i, 1) for i in range(2))))
        await within(eng.waitall())
        stats = eng.stats()  # 2 new of 18: at least an eighth
        assert stats.queue_wait_p50_s == 5.0 and stats.queue_wait_p99_s == 5.0


# -- issue 15: waits, loops and odd exceptions ---------------------------------------------------------


async def test_result_with_a_timeout_does_not_run_a_task_of_unknown_cost() -> None:
    """i15/4: result(timeout=0.01) on a queued task claimed it and ran it on the calling thread, returning
    only when it ended (2 s later): the timeout bounded nothing."""
    async with started(cpu_workers=1) as eng:
        ran_on: list[int] = []
        async with occupied(eng, 1):
            fut = eng.submit_nowait(lambda: ran_on.append(threading.get_ident()))
            with pytest.raises(TimeoutError, match=r"did not finish within 0\.01 s"):
                await within(asyncio.to_thread(fut.result, 0.01))
            assert ran_on == [] and fut.state == "ready", "result(timeout) ran the task on the waiting thread"
        await within(fut)
        assert ran_on != [] and ran_on[0] != threading.get_ident()


async def test_result_with_a_timeout_runs_a_queued_task_that_is_known_to_fit() -> None:
    """i15/4: a task of a kind that has run well within the timeout still runs on the waiting thread."""
    async with started(cpu_workers=1) as eng:  # the default inline threshold: costs are learned
        ran_on: list[int] = []

        def record() -> int:
            ran_on.append(threading.get_ident())
            return 1

        gate = Gate()
        eng.submit_nowait(gate.hold())
        await gate.wait_started(1)
        assert await await_while_queued(eng.submit_nowait(record), gate) == 1  # learns record's cost
        async with occupied(eng, 1):
            fut = eng.submit_nowait(record)
            waiter = threading.Thread(target=fut.result, args=(TIMEOUT,))
            waiter.start()
            await within(asyncio.to_thread(waiter.join, TIMEOUT))
            assert fut.done() and ran_on[-1] == waiter.ident


async def test_result_on_the_loop_thread_refuses_to_block_the_loop() -> None:
    """i15/20: fut.result() on the event loop's thread blocked the loop on the threads backend (timeout=0
    for a second), while a Tensor's wait_to_read() and a Dask future refused; all refuse alike now."""
    async with started(cpu_workers=1) as engine:
        async with occupied(engine, 1):  # the tasks below stay queued
            fut = engine.submit_nowait(operator.add, 1, 2)
            t = engine.asarray(np.ones(2)) + 1
            for call in (fut.result, lambda: fut.result(0), t.wait_to_read, t.result):
                with pytest.raises(ss.SchedsvcError, match=r"would block the loop.*use 'await (fut|t)'"):
                    call()
            assert not fut.done(), "the refused result() ran the task on the loop's thread"
        assert await within(fut) == 3
        assert fut.result() == 3  # final: returns at once
        np.testing.assert_array_equal(await within(t), [2.0, 2.0])
        np.testing.assert_array_equal(t.wait_to_read(), [2.0, 2.0])


async def test_result_inside_a_task_run_on_the_loop_thread_may_wait() -> None:
    """i15/20: the refusal is for the loop's own code: a task that runs inline there (sync_mode) waits."""
    async with started(sync_mode=True) as eng:
        fut = await eng.submit(lambda: eng.submit_nowait(operator.add, 2, 2).result(TIMEOUT))
        assert fut.result() == 4


def _raise(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize("kind", [StopIteration, StopAsyncIteration])
async def test_a_task_raising_stop_iteration_keeps_its_exception(engine: ss.Engine, kind: type) -> None:
    """i15/15: a task raising StopIteration surfaced from 'await' as RuntimeError('generator raised
    StopIteration') (PEP 479) and eng.map() turned StopAsyncIteration into a bare RuntimeError; the
    exception itself comes back from result() and exception() and is the cause of what await raises."""
    error = kind("mine")
    fut = engine.submit_nowait(_raise, error)
    dependent = engine.submit_nowait(operator.neg, fut)
    await within(engine.waitall())
    assert fut.exception() is error
    with pytest.raises(kind) as raised:
        fut.result()  # final: no wait, so allowed on the loop's thread
    assert raised.value is error
    with pytest.raises(ss.DependencyError) as dep:
        await within(dependent)
    assert dep.value.__cause__ is error
    awaited: list[BaseException] = []
    for awaiting in (lambda: fut, lambda: engine.run(_raise, error)):
        try:
            await within(awaiting())
        except BaseException as exc:  # whatever await raises is what is tested
            awaited.append(exc)
    try:
        async for _ in engine.map(_raise, [error]):
            pass
    except BaseException as exc:
        awaited.append(exc)
    for exc in awaited:
        assert exc is error or (isinstance(exc, RuntimeError) and exc.__cause__ is error), repr(exc)
        if exc is not error:
            assert "PEP 479" in str(exc) and kind.__name__ in str(exc), repr(exc)


async def test_a_tensor_awaited_after_a_write_that_raised_stop_iteration(engine: ss.Engine) -> None:
    """i15/15: awaiting a Tensor whose last write raised StopIteration gave the bare PEP 479 RuntimeError."""
    error = StopIteration("in a write")
    t = engine.asarray(np.zeros(2))
    write = engine.submit_nowait(_raise, error, writes=[t])
    with pytest.raises(RuntimeError, match="PEP 479") as raised:
        await within(t)
    assert raised.value.__cause__ is error and write.exception() is error


def _on_another_loop(
    coro_fn: Callable[[], Any], started_: threading.Event, done: threading.Event
) -> list[Any]:
    """Run ``coro_fn()`` on a new event loop in a new thread; ``started_``/``done`` bracket it; its result list."""
    out: list[Any] = []

    async def body() -> None:
        started_.set()
        out.append(await asyncio.wait_for(coro_fn(), TIMEOUT))

    def run() -> None:
        try:
            asyncio.run(body())
        finally:
            done.set()

    threading.Thread(target=run, name="another-loop").start()
    return out


async def test_an_await_on_another_loop_does_not_need_the_engines_loop() -> None:
    """i15/7: a future awaited on a second event loop was woken through the engine's loop, so the await
    stalled for as long as the engine's loop was blocked."""
    started_, done = threading.Event(), threading.Event()
    async with started(cpu_workers=1) as eng, occupied(eng, 1) as (gate, _):
        fut = eng.submit_nowait(operator.add, 3, 4)
        out = _on_another_loop(lambda: fut, started_, done)
        await wait_thread_event(started_)
        await state(eng, lambda: bool(fut.watchers))  # the other loop awaits it: its waiter is registered
        gate.open()
        assert done.wait(TIMEOUT), "the await on the other loop waited for the engine's (blocked) loop"
    assert out == [7]


async def test_a_submit_waiting_for_room_on_another_loop_does_not_need_the_engines_loop() -> None:
    """i15/7: the same for 'await eng.submit(...)' waiting for room at max_pending on a second loop."""
    async with started(cpu_workers=1, max_pending=1) as eng, occupied(eng, 1) as (gate, _):
        started_, done = threading.Event(), threading.Event()
        out = _on_another_loop(lambda: eng.submit(operator.add, 1, 1), started_, done)
        await wait_thread_event(started_)
        await state(eng, lambda: eng.stats().waiting_admission == 1)
        gate.open()
        assert done.wait(TIMEOUT), "the admission on the other loop waited for the engine's (blocked) loop"
        assert await within(out[0]) == 2


async def _join_engine_threads() -> None:
    for thread in engine_threads():
        await asyncio.to_thread(thread.join, TIMEOUT)
    assert engine_threads() == []


async def test_an_engine_whose_loop_closed_refuses_work_and_stops() -> None:
    """i15/5: an engine whose event loop ended without aclose() accepted submit_nowait from a new loop (the
    await never completed), and eng.run raised a raw 'RuntimeError: Event loop is closed'."""

    async def start_and_leave() -> tuple[ss.Engine, ss.Future[int]]:
        eng = await ss.Engine(cpu_workers=1).start()
        fut = eng.submit_nowait(operator.add, 1, 2)
        await within(fut)
        return eng, fut

    with pytest.warns(ResourceWarning, match="still open when its event loop ended"):  # asyncio.run's end
        eng, fut = await within(asyncio.to_thread(asyncio.run, start_and_leave()))  # that loop is closed now
    with pytest.raises(ss.EngineClosed, match="event loop this engine was started on has closed"):
        eng.submit_nowait(operator.add, 1, 1)
    for call in (lambda: within(eng.run(operator.add, 1, 1)), lambda: within(eng.submit(abs, -1))):
        with pytest.raises(ss.EngineClosed, match="create a new Engine"):
            await call()
    with pytest.raises(ss.EngineClosed, match="has closed"):
        fut.add_done_callback(print)
    assert fut.result() == 3  # what finished is still there
    await within(eng.aclose())
    await _join_engine_threads()


def test_an_engine_left_open_warns_when_asyncio_run_ends_and_its_threads_end() -> None:
    """i15/5: the warning used to wait for the engine's next use or its collection: it now comes when the loop
    ends (asyncio.run shuts down the async generators still suspended on it, the engine's watch among them)."""
    kept: list[ss.Engine] = []

    async def start_and_leave() -> None:
        kept.append(await ss.Engine(cpu_workers=2).start())

    with pytest.warns(ResourceWarning, match="still open when its event loop ended"):
        asyncio.run(start_and_leave())
    for thread in engine_threads():
        thread.join(TIMEOUT)
    assert engine_threads() == []
    assert kept[0].closed


def test_a_closed_engine_says_nothing_when_its_loop_ends() -> None:
    """The watch is closed with the engine: a later loop end is not taken for a forgotten engine."""

    async def start_and_close() -> None:
        async with ss.Engine(cpu_workers=1) as eng:
            await within(eng.run(operator.add, 1, 1))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(start_and_close())
    assert [str(w.message) for w in caught] == []


async def test_an_engine_collected_while_open_warns_and_its_threads_end() -> None:
    """i15/5: an engine dropped without aclose() said nothing and left its worker threads parked forever."""
    eng = await ss.Engine(cpu_workers=2).start()
    assert len(engine_threads()) == 2
    with pytest.warns(ResourceWarning, match="unclosed <Engine running"):
        del eng
        gc.collect()
    await _join_engine_threads()


def _in_forked_child(eng: ss.Engine, queued: ss.Future[Any]) -> str:
    """What the child's copy of the engine does when used (runs in the child: must never block)."""
    seen = []
    for call in (
        lambda: eng.submit_nowait(operator.add, 1, 1),
        lambda: eng.asarray(np.ones(2)) + 1,
        lambda: queued.result(TIMEOUT),
    ):
        try:
            call()
            seen.append("accepted")
        except ss.EngineClosed as exc:
            seen.append(
                "forked" if "forked" in str(exc) and "new Engine in the child" in str(exc) else repr(exc)
            )
        except BaseException as exc:
            seen.append(repr(exc))
    seen.append(f"closed={eng.closed}")
    return ",".join(seen)


def _read_child(fd: int, pid: int) -> str:
    """All the child writes to ``fd`` until it exits (killed if it takes longer than TIMEOUT); reaps it."""
    chunks = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .*is multi-threaded, use of fork:DeprecationWarning")
async def test_an_engine_in_a_forked_child_refuses_work() -> None:
    """i15/6: after os.fork() the child's copy of the engine accepted work that never ran (its worker
    threads stay in the parent), and result() waited forever."""
    async with started(cpu_workers=1) as eng, occupied(eng, 1):
        queued = eng.submit_nowait(operator.add, 1, 1)  # queued behind the held worker
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe and leave, never return into the test
            try:
                os.close(read_fd)
                os.write(write_fd, _in_forked_child(eng, queued).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        report = await asyncio.to_thread(_read_child, read_fd, pid)
        assert report == "forked,forked,forked,closed=True"
        assert not eng.closed  # the parent's engine is untouched
    assert await within(queued) == 2


async def test_sync_mode_submit_of_a_task_raising_stop_iteration() -> None:
    """i15/15: in sync_mode, 'await eng.submit(...)' of a task raising StopIteration gave the bare PEP 479
    RuntimeError ('coroutine raised StopIteration'); submit_nowait raises the exception itself."""
    error = StopIteration("in sync mode")
    async with started(sync_mode=True) as eng:
        with pytest.raises(RuntimeError, match="PEP 479") as raised:
            await eng.submit(_raise, error)
        assert raised.value.__cause__ is error
        with pytest.raises(StopIteration) as direct:
            eng.submit_nowait(_raise, error)
        assert direct.value is error


async def test_a_throttle_on_another_loop_gives_its_slot_back_without_the_engines_loop() -> None:
    """Review of i15/9 with i15/7: a throttle() waiter on a second loop was let through onto a reserved slot that
    only the engine's loop could give back, so while that loop was blocked the engine stayed full (QueueFull at
    0/1 tasks), and in debug mode the call_soon from the wrong thread raised after reserving it."""
    async with started(cpu_workers=1, max_pending=1) as eng, occupied(eng, 1) as (gate, _):
        started_, done = threading.Event(), threading.Event()
        _on_another_loop(eng.throttle, started_, done)
        await wait_thread_event(started_)
        await state(eng, lambda: eng.stats().waiting_admission == 1)
        gate.open()
        assert done.wait(TIMEOUT), "the throttle on the other loop was not let through"  # blocks this loop
        assert eng._rt is not None and eng._rt.core.reserved == 0
        assert await within(eng.submit_nowait(operator.neg, 5)) == -5


async def test_a_compiled_submit_on_another_loop_waits_there() -> None:
    """Review of i15/10 with i15/7: 'await compiled.submit(x)' on a second loop queued a token of the engine's
    loop and failed with 'attached to a different loop', while the call itself was admitted later and ran."""
    async with started(cpu_workers=1, max_pending=1) as eng:
        double = eng.compile(lambda t: t * 2)
        x = eng.asarray(np.arange(3.0))
        await within(double(x))  # traced
        async with occupied(eng, 1) as (gate, _):

            async def call() -> Any:
                return await (await double.submit(x))

            started_, done = threading.Event(), threading.Event()
            out = _on_another_loop(call, started_, done)
            await wait_thread_event(started_)
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            gate.open()
            await wait_thread_event(done)
        np.testing.assert_array_equal(out[0], [0.0, 2.0, 4.0])


async def test_a_write_refused_by_queue_full_is_not_the_tensors_last_write() -> None:
    """Review: submit_nowait(..., out=t) that raised QueueFull had already made itself t's last write, so
    'await t' then waited for ever for a task that was never admitted."""
    async with started(cpu_workers=2, max_pending=2) as eng:
        a = np.zeros(3)
        t = eng.asarray(a)
        async with occupied(eng, 2):
            with pytest.raises(ss.QueueFull):
                eng.submit_nowait(np.add, 1.0, 1.0, out=t)
            with pytest.raises(ss.QueueFull):
                eng.submit_nowait(a.fill, 7.0, writes=t)
        np.testing.assert_array_equal(await within(t), [0.0, 0.0, 0.0])
        await within(eng.run(a.fill, 1.0, writes=t))  # an admitted write still counts
        np.testing.assert_array_equal(await within(t), [1.0, 1.0, 1.0])


# -- i16: found in review of the executor/runtime refactor ---------------------------------------


async def _start_and_keep_only_results() -> tuple[ss.Tensor, ss.Future[Any]]:
    eng = await ss.Engine(cpu_workers=1).start()
    return eng.asarray(np.ones(3)), eng.submit_nowait(operator.add, 1, 1)


async def test_an_engines_tensors_and_futures_keep_it_running_after_the_engine_object_is_gone() -> None:
    """Futures and Tensors hold the engine's Port; with only them left, the engine still runs their work,
    and says it was never closed once the last of them is gone."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # nothing is unclosed while they live
        t, f = await _start_and_keep_only_results()
        gc.collect()
        np.testing.assert_array_equal(await within(t + 1), [2.0, 2.0, 2.0])
        assert await within(f) == 2
    with pytest.warns(ResourceWarning, match="unclosed <Engine running"):
        del t, f
        gc.collect()
    await _join_engine_threads()


async def _throttle(eng: ss.Engine) -> None:
    await eng.throttle()  # a user's coroutine: the warning names this line


@pytest.mark.parametrize(
    "use",
    [
        lambda eng: eng.submit_nowait(abs, 1),
        lambda eng: eng.asarray(np.ones(2)),
        lambda eng: asyncio.run(_throttle(eng)),
    ],
    ids=["submit_nowait", "asarray", "throttle"],
)
def test_using_an_engine_whose_loop_was_closed_warns_at_the_callers_line(
    use: Callable[[ss.Engine], Any],
) -> None:
    loop = asyncio.new_event_loop()
    eng = loop.run_until_complete(ss.Engine(cpu_workers=1).start())
    loop.close()
    with (
        pytest.warns(ResourceWarning, match="still open when its event loop closed") as caught,
        pytest.raises(ss.EngineClosed),
    ):
        use(eng)  # the line the warning names: the first outside schedsvc
    assert caught[0].filename == __file__
    for thread in engine_threads():  # told to stop when the engine found its loop closed
        thread.join(TIMEOUT)


async def test_a_failed_task_does_not_keep_its_engine_alive_until_a_garbage_collection() -> None:
    """A task's error no longer holds the runtime frame that ran it (whose `task` is the failed future)."""
    eng = await ss.Engine(cpu_workers=1).start()
    failed = await eng.submit(int, "x")
    await within(failed.wait())
    assert isinstance(failed.exception(), ValueError)
    assert eng._rt is not None
    pool = eng._rt.devices["cpu"]
    await until(lambda: bool(pool.idle))  # the worker parked: no frame of its stack holds the task any more
    gc.disable()
    try:
        with pytest.warns(ResourceWarning, match="unclosed <Engine running"):
            del eng, failed  # freed by reference counting alone
    finally:
        gc.enable()
    await _join_engine_threads()


async def test_each_submitter_cancelled_by_a_close_gets_its_own_error() -> None:
    eng = await ss.Engine(cpu_workers=1, max_pending=1).start()
    gate = Gate()
    await eng.submit(gate.hold())
    errors: list[BaseException] = []

    async def submit() -> None:
        try:
            await eng.submit(abs, 1)
        except ss.EngineClosed as exc:
            errors.append(exc)

    waiting = [asyncio.create_task(submit()) for _ in range(2)]
    await state(eng, lambda: eng.stats().waiting_admission == 2)
    closing = asyncio.create_task(eng.aclose(cancel_pending=True))
    await within(asyncio.gather(*waiting))
    gate.open()
    await within(closing)
    assert len(errors) == 2 and errors[0] is not errors[1]  # one exception object per raise


def test_an_engine_not_started_does_not_look_for_its_devices() -> None:
    """Compiling, or making a Tensor, before start neither checks a device (on a GPU machine that would
    start CUDA, say before a fork) nor says anything but that the engine has not started."""
    eng = ss.Engine(devices=("cuda:0",))  # CuPy is not installed in CI: a check would raise DeviceError
    assert eng.compile(lambda x: x + 1) is not None
    with pytest.raises(ss.EngineClosed, match="has not started"):
        eng.zeros(3)
