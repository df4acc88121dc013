"""``eng.map``: order, the max_inflight window, errors at their place, cancellation, chaining, backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import TIMEOUT, Gate, probe, state, until, wait_thread_event, within


class Source:
    """A sync or async generator of ``range(n)`` that counts what was pulled and whether it was closed."""

    def __init__(self, n: int, fail_after: int | None = None) -> None:
        self.n = n
        self.fail_after = fail_after
        self.error = RuntimeError("the source broke")
        self.pulled = 0
        self.closed = False

    def sync(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                self._check(i)
                self.pulled += 1
                yield i
        finally:
            self.closed = True

    async def aio(self) -> AsyncIterator[int]:
        try:
            for i in range(self.n):
                await asyncio.sleep(0)  # a real suspension point, as a network source has
                self._check(i)
                self.pulled += 1
                yield i
        finally:
            self.closed = True

    def _check(self, i: int) -> None:
        if i == self.fail_after:
            raise self.error


class Gates:
    """One gate per item: ``fn(i)`` says it started, then waits until the test opens gate ``i``."""

    def __init__(self, n: int) -> None:
        self.gates = [threading.Event() for _ in range(n)]
        self.started = [threading.Event() for _ in range(n)]
        self.finished: list[int] = []

    def __call__(self, i: int) -> int:
        self.started[i].set()
        if not self.gates[i].wait(TIMEOUT):
            raise TimeoutError(f"the test never opened gate {i}")
        self.finished.append(i)
        return i * 10


class Recorder:
    """``fn(i)`` that records which items ran; ``hold`` items wait for a gate, ``fail`` raises."""

    def __init__(self, hold: int | None = None, fail: int | None = None) -> None:
        self.ran: list[int] = []
        self.hold = hold
        self.fail = fail
        self.gate = Gate()
        self.error = ValueError(f"item {fail} failed")

    def __call__(self, i: int) -> int:
        self.ran.append(i)
        if i == self.hold:
            self.gate.hold()()
        if i == self.fail:
            raise self.error
        return i


def feeders() -> list[asyncio.Task[Any]]:
    """The feeder tasks of pipelines still alive: none once a pipeline has ended, however it ended."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("eng.map feeder")]


async def collect(results: AsyncIterator[Any], into: list[Any] | None = None) -> list[Any]:
    out = [] if into is None else into
    async for value in results:
        out.append(value)
    return out


# -- order ---------------------------------------------------------------------------------------


async def test_ordered_keeps_source_order_when_items_finish_in_reverse() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        work = Gates(4)
        out: list[int] = []
        consumer = asyncio.create_task(collect(eng.map(work, range(4), max_inflight=4), out))
        for started in work.started:
            await wait_thread_event(started)
        for i in (3, 2, 1):
            work.gates[i].set()
            await until(lambda i=i: work.finished[-1:] == [i])
        await probe(eng)
        assert out == []  # items 1..3 are done, but item 0 comes first
        work.gates[0].set()
        assert await within(consumer) == [0, 10, 20, 30]
        assert work.finished == [3, 2, 1, 0]


async def test_unordered_yields_as_items_finish() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        work = Gates(4)
        out: list[int] = []
        consumer = asyncio.create_task(collect(eng.map(work, range(4), max_inflight=4, ordered=False), out))
        for started in work.started:
            await wait_thread_event(started)
        for n, i in enumerate((2, 0, 3, 1), start=1):
            work.gates[i].set()
            await until(lambda n=n: len(out) == n)
        assert await within(consumer) == [20, 0, 30, 10]


async def test_items_given_before_the_function_are_refused_with_the_order(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match=r"eng\.map\(\) takes the function first, then the items"):
        engine.map([1.0, 4.0], np.sqrt)  # type: ignore[arg-type]


@pytest.mark.parametrize("ordered", [True, False])
async def test_empty_source(engine: ss.Engine, ordered: bool) -> None:
    assert await within(collect(engine.map(abs, [], ordered=ordered))) == []


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("ordered", [True, False])
async def test_sync_and_async_sources(engine: ss.Engine, kind: str, ordered: bool) -> None:
    source = Source(50)
    items = source.sync() if kind == "sync" else source.aio()
    out = await within(collect(engine.map(operator.neg, items, max_inflight=3, ordered=ordered)))
    expected = [-i for i in range(50)]
    assert out == expected if ordered else sorted(out, reverse=True) == expected
    assert source.pulled == 50
    assert source.closed
    assert feeders() == []


async def test_keyword_options_reach_submit_and_the_function(engine: ss.Engine) -> None:
    def scaled(x: int, *, factor: int) -> int:
        return x * factor

    out = await within(collect(engine.map(scaled, range(4), factor=3, name="scale", priority=1, nbytes=8)))
    assert out == [0, 3, 6, 9]


# -- the window ----------------------------------------------------------------------------------


async def test_max_inflight_is_reached_and_never_exceeded() -> None:
    window = 3
    async with ss.Engine(cpu_workers=6) as eng:  # workers to spare: only the window limits the tasks
        lock = threading.Lock()
        running = most = 0
        pending_seen: list[int] = []
        gate = Gate()

        def work(i: int) -> int:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            pending_seen.append(eng.stats().pending)
            gate.hold()()
            with lock:
                running -= 1
            return i

        source = Source(20)
        consumer = asyncio.create_task(collect(eng.map(work, source.sync(), max_inflight=window)))
        await gate.wait_started(window)
        await probe(eng)  # a free worker ran the no-op: a 4th task submitted before it would have started too
        assert eng.stats().pending == window
        assert source.pulled == window  # a slot is taken before an item is pulled
        gate.open()
        assert await within(consumer) == list(range(20))
        assert most == window
        assert max(pending_seen) <= window


async def test_default_max_inflight_is_twice_the_workers() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        gate = Gate()
        source = Source(20)
        consumer = asyncio.create_task(collect(eng.map(lambda i: gate.hold()(), source.sync())))
        await gate.wait_started(2)
        await state(eng, lambda: eng.stats().pending >= 4)
        assert eng.stats().pending == 4
        assert source.pulled == 4
        gate.open()
        assert len(await within(consumer)) == 20


async def test_source_is_pulled_ahead_while_the_consumer_holds_a_result(engine: ss.Engine) -> None:
    source = Source(100)
    results = engine.map(operator.neg, source.aio(), max_inflight=3)
    async with contextlib.aclosing(results):
        assert await within(anext(results)) == 0
        # the consumer now works on item 0: the window refills without being asked
        await until(lambda: source.pulled == 4)
        await within(engine.waitall())
        assert source.pulled == 4  # and stops at the window
        assert [await within(anext(results)) for _ in range(3)] == [-1, -2, -3]


@pytest.mark.parametrize("bad", [0, -2])
async def test_max_inflight_below_one_is_a_value_error(engine: ss.Engine, bad: int) -> None:
    with pytest.raises(ValueError, match=r"max_inflight must be >= 1"):
        engine.map(abs, range(3), max_inflight=bad)


@pytest.mark.parametrize("bad", [1.5, "2", True])
async def test_max_inflight_not_an_int_is_a_type_error(engine: ss.Engine, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"max_inflight must be an int >= 1"):
        engine.map(abs, range(3), max_inflight=bad)


@pytest.mark.parametrize("bad", ["no", 0, None, np.bool_(False)])
async def test_ordered_not_a_bool_is_a_type_error(engine: ss.Engine, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"ordered=.*must be a bool"):
        engine.map(abs, range(3), ordered=bad)


async def test_bad_fn_source_or_device_fail_at_the_call(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match="callable"):
        engine.map(42, range(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        engine.map(abs, 42)  # type: ignore[arg-type]
    with pytest.raises(ss.DeviceError):
        engine.map(abs, range(3), device="cuda:9")


async def test_map_on_a_closed_or_unstarted_engine_raises_engine_closed() -> None:
    eng = ss.Engine(cpu_workers=1)
    with pytest.raises(ss.EngineClosed, match="not started"):
        eng.map(abs, range(3))
    async with eng:
        pass
    with pytest.raises(ss.EngineClosed, match="closed"):
        eng.map(abs, range(3))


@pytest.mark.parametrize("library", ["asyncio", "trio"])
async def test_iterating_on_another_threads_loop_is_refused(engine: ss.Engine, library: str) -> None:
    """Its feeder runs on the engine's loop: another loop (another thread's asyncio.run or trio.run)
    is told to iterate it there, at once, rather than hang or fail inside anyio."""
    gen = engine.map(abs, range(3))
    outcome: list[Any] = []

    async def consume() -> list[int]:
        return [x async for x in gen]

    def run() -> None:
        try:
            if library == "trio":
                trio = pytest.importorskip("trio")
                outcome.append(trio.run(consume))
            else:
                outcome.append(asyncio.run(consume()))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    await asyncio.to_thread(thread.join, TIMEOUT)
    assert not thread.is_alive(), "iterating eng.map on another loop hung"
    assert isinstance(outcome[0], ss.SchedsvcError), outcome
    assert "engine's" in str(outcome[0]) and "executor().map" in str(outcome[0])
    assert [x async for x in engine.map(abs, range(3))] == [0, 1, 2]  # on the engine's loop it works


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False])
async def test_error_at_an_item_is_raised_there_and_later_items_are_cancelled(ordered: bool) -> None:
    # one worker, FIFO: 0 runs, 1 fails, 2 holds the worker, so 3 and 4 wait in the queue
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=2, fail=1)
        source = Source(5)  # one window: all five are submitted before anything finishes
        out: list[int] = []
        with pytest.raises(ValueError) as info:
            await within(collect(eng.map(work, source.sync(), max_inflight=5, ordered=ordered), out))
        assert info.value is work.error
        assert out == [0]
        assert source.closed
        assert feeders() == []
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0, 1, 2]  # 2 had started; 3 and 4 were cancelled unstarted
        assert eng.stats().cancelled == 2


async def test_a_failing_future_item_fails_its_task_with_dependency_error(engine: ss.Engine) -> None:
    def boom() -> int:
        raise KeyError("upstream")

    items = [engine.submit_nowait(operator.add, 1, 1), engine.submit_nowait(boom)]
    out: list[int] = []
    with pytest.raises(ss.DependencyError) as info:
        await within(collect(engine.map(operator.neg, items), out))
    assert isinstance(info.value.__cause__, KeyError)
    assert out == [-2]


async def test_source_error_comes_after_the_items_pulled_before_it(engine: ss.Engine) -> None:
    gate = Gate()
    source = Source(10, fail_after=2)

    def work(i: int) -> int:
        if i == 0:
            gate.hold()()  # the slowest item is the first: the error must still wait for it
        return i

    out: list[int] = []
    consumer = asyncio.create_task(collect(engine.map(work, source.aio(), max_inflight=4), out))
    await gate.wait_started(1)
    await until(lambda: source.closed)  # the source has failed
    assert out == []
    gate.open()
    with pytest.raises(RuntimeError) as info:
        await within(consumer)
    assert info.value is source.error
    assert out == [0, 1]


async def test_unordered_source_error_is_raised_at_once_and_cancels_in_flight_work() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=0)
        error = RuntimeError("the source broke")

        async def source() -> AsyncIterator[int]:
            yield 0
            await work.gate.wait_started(1)  # 0 holds the only worker
            yield 1  # queued behind it
            raise error

        with pytest.raises(RuntimeError) as info:
            await within(collect(eng.map(work, source(), max_inflight=4, ordered=False)))
        assert info.value is error
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0]  # 1 was queued behind the held 0 and was cancelled
        assert eng.stats().cancelled == 1


async def test_sync_mode_raises_the_error_at_its_item() -> None:
    async with ss.Engine(cpu_workers=1, sync_mode=True) as eng:
        work = Recorder(fail=2)
        out: list[int] = []
        with pytest.raises(ValueError) as info:
            await within(collect(eng.map(work, range(6)), out))
        assert info.value is work.error
        assert out == [0, 1]


# -- cancellation --------------------------------------------------------------------------------


async def test_cancelling_the_consumer_cancels_queued_tasks_and_stops_the_source() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=0)
        source = Source(10)
        consumer = asyncio.create_task(collect(eng.map(work, source.aio(), max_inflight=4)))
        await work.gate.wait_started(1)
        await state(eng, lambda: eng.stats().pending == 4)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(consumer)
        assert source.closed
        assert feeders() == []
        assert eng.stats().cancelled == 3
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0]
        assert source.pulled == 4


async def test_a_timeout_around_the_consumer_cancels_queued_tasks() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=0)

        async def expire_when_held(scope: asyncio.Timeout) -> None:
            await work.gate.wait_started(1)
            await state(eng, lambda: eng.stats().pending == 3)
            scope.reschedule(asyncio.get_running_loop().time())  # time out now

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(TIMEOUT) as scope:
                expirer = asyncio.create_task(expire_when_held(scope))
                await collect(eng.map(work, range(10), max_inflight=3))
        await within(expirer)
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0]
        assert eng.stats().cancelled == 2


async def test_break_and_aclose_cancel_queued_tasks_and_close_the_source() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=1)
        source = Source(10)
        async with contextlib.aclosing(eng.map(work, source.aio(), max_inflight=4)) as results:
            async for value in results:
                assert value == 0
                await work.gate.wait_started(1)
                await state(eng, lambda: eng.stats().pending == 4)
                break
        assert source.closed
        assert feeders() == []
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0, 1]  # 1 was running; 2..4 were queued and never ran
        assert eng.stats().cancelled == 3


async def test_a_break_without_aclose_still_cleans_up() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        work = Recorder(hold=1)
        source = Source(10)
        async for _ in eng.map(work, source.aio(), max_inflight=4):
            await work.gate.wait_started(1)
            break
        # the dropped generator is closed by the event loop's async-generator finalizer
        await until(lambda: source.closed)
        await until(lambda: feeders() == [])
        await state(eng, lambda: eng.stats().pending == 1)
        work.gate.open()
        await within(eng.waitall())
        assert work.ran == [0, 1]


async def test_a_source_that_swallows_the_cancellation_cannot_hang_the_consumer() -> None:
    """Some retry loops catch CancelledError; ending the pipeline must still end, and submit nothing more."""
    inside, swallowed = asyncio.Event(), asyncio.Event()

    async def stubborn() -> AsyncIterator[int]:
        yield 0
        inside.set()
        try:
            await asyncio.Event().wait()  # nothing sets it: only the cancellation gets it out
        except asyncio.CancelledError:
            swallowed.set()
        yield 1
        yield 2

    async with ss.Engine(cpu_workers=1) as eng:
        results = eng.map(operator.neg, stubborn(), max_inflight=1)
        assert await within(anext(results)) == 0
        await within(inside.wait())  # the feeder has the slot and waits inside the source
        await within(results.aclose())
        assert swallowed.is_set()
        assert feeders() == []
        assert eng.stats().submitted == 1  # the item the source gave after the cancellation was dropped


async def test_nothing_is_left_when_the_engine_closes_during_a_pipeline() -> None:
    gate = Gate()
    async with ss.Engine(cpu_workers=1) as eng:
        results = eng.map(lambda i: gate.hold()(), range(10), max_inflight=2)
        first = asyncio.ensure_future(anext(results))
        await gate.wait_started(1)
        closing = asyncio.create_task(eng.aclose())
        await state(eng, lambda: eng.closed)
        gate.open()
        assert await within(first) is None
        assert await within(anext(results)) is None  # item 1 was admitted before the close
        with pytest.raises(ss.EngineClosed):
            await within(anext(results))  # the feeder could not submit the next item
        await within(closing)


# -- futures, tensors and chains -----------------------------------------------------------------


async def test_futures_and_tensors_as_items_are_dependencies(engine: ss.Engine) -> None:
    futures = [engine.submit_nowait(operator.add, i, 1) for i in range(5)]
    assert await within(collect(engine.map(operator.neg, futures))) == [-1, -2, -3, -4, -5]
    tensors = [engine.asarray(np.arange(3.0)) * i for i in range(4)]
    assert await within(collect(engine.map(np.sum, tensors))) == [0.0, 3.0, 6.0, 9.0]


async def test_a_three_stage_chain_equals_sequential_code() -> None:
    def load(i: int) -> np.ndarray:
        return np.random.default_rng(i).standard_normal((8, 8))

    def compute(x: np.ndarray) -> np.ndarray:
        return x @ x.T + 1.0

    def post(x: np.ndarray) -> float:
        return float(np.trace(x))

    async with ss.Engine(cpu_workers=3) as eng:
        stages = eng.map(post, eng.map(compute, eng.map(load, range(40), max_inflight=2)), max_inflight=5)
        out = await within(collect(stages))
    # the same operations on the same inputs (tiny matrices: BLAS uses one thread either way)
    assert out == [post(compute(load(i))) for i in range(40)]


async def test_chained_stages_overlap() -> None:
    """compute(0), stage 2 of item 0, runs while load(1), stage 1 of item 1, runs: each waits to see the other."""
    load_1_started = threading.Event()
    compute_0_started = threading.Event()

    def load(i: int) -> int:
        if i == 1:
            load_1_started.set()
            if not compute_0_started.wait(TIMEOUT):
                raise TimeoutError("compute(0) never ran while load(1) did: the stages do not overlap")
        return i

    def compute(x: int) -> int:
        if x == 0:
            compute_0_started.set()
            if not load_1_started.wait(TIMEOUT):
                raise TimeoutError("load(1) never ran while compute(0) did: the stages do not overlap")
        return x * 2

    async with ss.Engine(cpu_workers=4) as eng:
        loads = eng.map(load, range(6), max_inflight=2)
        out = await within(collect(eng.map(compute, loads, max_inflight=2)))
    assert out == [0, 2, 4, 6, 8, 10]


# -- backpressure --------------------------------------------------------------------------------


async def test_engine_limits_still_apply_with_a_larger_window() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2) as eng:
        gate = Gate()
        pending_seen: list[int] = []

        def work(i: int) -> int:
            pending_seen.append(eng.stats().pending)
            if i < 2:
                gate.hold()()
            return i

        consumer = asyncio.create_task(collect(eng.map(work, range(30), max_inflight=8)))
        await gate.wait_started(2)
        await state(
            eng, lambda: eng.stats().waiting_admission == 1
        )  # the feeder waits for room, no QueueFull
        assert eng.stats().pending == 2
        gate.open()
        assert await within(consumer) == list(range(30))
        assert max(pending_seen) <= 2
