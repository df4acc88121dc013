"""The engine under trio, and each library's cancellation rules: every async test here runs on asyncio
and on trio (``anyio_backend``), written with anyio's primitives; the rest drive ``trio.run`` themselves."""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import trio
import trio.testing

import schedsvc as ss
from tests.helpers import TIMEOUT, Gate, occupied, on_asyncio, state, until, within


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def engine(**options: Any) -> ss.Engine:
    """A small engine whose awaited tasks never run inline in the awaiting coroutine."""
    return ss.Engine(cpu_workers=1, inline_threshold_us=0, **options)


async def test_each_test_runs_on_the_library_it_names(anyio_backend: str) -> None:
    assert on_asyncio() == (anyio_backend == "asyncio")
    async with engine() as eng:
        assert (eng._rt is not None and eng._rt.loop is not None) == (anyio_backend == "asyncio")
        assert await within(eng.run(np.add, 1, 2)) == 3


async def test_futures_tensors_and_compiled_functions_are_awaited(anyio_backend: str) -> None:
    async with engine() as eng:
        t = eng.asarray(np.arange(4.0))
        np.testing.assert_array_equal(await within(t * 2 + 1), [1.0, 3.0, 5.0, 7.0])
        double = eng.compile(lambda x: x * 2)
        np.testing.assert_array_equal(await within(double(t)), [0.0, 2.0, 4.0, 6.0])
        futs = [await eng.submit(int, i) for i in range(20)]
        assert [await within(f) for f in futs] == list(range(20))
        await within(eng.waitall())


async def test_a_cancel_scope_around_await_cancels_the_unstarted_task(anyio_backend: str) -> None:
    async with engine() as eng, occupied(eng, 1) as (_gate, _held):
        queued = await eng.submit(int, 1)  # behind the held task: not started
        with anyio.CancelScope() as scope:
            scope.cancel()
            await queued
        assert scope.cancelled_caught
        assert queued.cancelled()
        assert eng.stats().cancelled == 1


async def test_a_deadline_around_await_cancels_the_task_waiting_for_its_parent(anyio_backend: str) -> None:
    async with engine() as eng:
        gate = Gate()
        parent = eng.submit_nowait(gate.hold(lambda: 5))
        child = eng.submit_nowait(np.add, parent, 1)
        await gate.wait_started(1)
        with anyio.move_on_after(0.01) as scope:
            await child
        assert scope.cancelled_caught and child.cancelled()
        gate.open()
        assert await within(parent) == 5  # only the awaited task was given up


async def test_a_shielded_await_keeps_the_task_and_gets_its_value(anyio_backend: str) -> None:
    async with engine() as eng:
        gate = Gate()
        fut = eng.submit_nowait(gate.hold(lambda: 42))
        got: list[int] = []

        async def waiter(outer: anyio.CancelScope) -> None:
            with outer:
                outer.cancel()
                with anyio.CancelScope(shield=True):
                    got.append(await fut)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, anyio.CancelScope())
            await until(lambda: fut.watchers is not None)  # the shielded await is parked on it
            gate.open()
        assert got == [42] and fut.state == "done"


async def test_a_submitter_cancelled_while_queued_for_admission_leaves_the_queue(anyio_backend: str) -> None:
    async with engine(max_pending=1) as eng, occupied(eng, 1) as (gate, held):
        async with anyio.create_task_group() as tg:
            tg.start_soon(eng.submit, int, 7)
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            tg.cancel_scope.cancel()
        assert eng.stats().waiting_admission == 0
        gate.open()
        await within(held[0])
        assert await within(eng.run(int, 8)) == 8
        assert eng.stats().submitted == 2  # the held task and the last: the cancelled one never got in


async def test_submit_waits_for_room_and_throttle_lets_one_through(anyio_backend: str) -> None:
    async with engine(max_pending=1) as eng:
        async with occupied(eng, 1) as (gate, _held):
            order: list[str] = []

            async def throttled() -> None:
                await eng.throttle()
                order.append("throttle")

            async with anyio.create_task_group() as tg:
                tg.start_soon(throttled)
                await state(eng, lambda: eng.stats().waiting_admission == 1)
                assert order == []
                gate.open()
        assert order == ["throttle"]
        assert await within(eng.run(int, 3)) == 3


async def test_map_pulls_an_async_source_and_a_cancelled_consumer_stops_it(anyio_backend: str) -> None:
    closed: list[bool] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            for i in range(1000):
                await anyio.sleep(0)
                yield i
        finally:
            closed.append(True)

    async with engine() as eng:
        got = [x async for x in eng.map(np.square, numbers(), max_inflight=3)]
        assert got[:4] == [0, 1, 4, 9] and len(got) == 1000 and closed == [True]
        closed.clear()
        seen: list[int] = []
        with anyio.CancelScope() as scope:
            async with aclosing(eng.map(np.square, numbers(), max_inflight=2)) as results:
                async for value in results:
                    seen.append(int(value))
                    if len(seen) == 3:
                        scope.cancel()
                        await anyio.sleep(0)  # the cancellation lands here
        assert seen == [0, 1, 4] and closed == [True]
        await within(eng.waitall())
        assert eng.stats().pending == 0


async def test_trace_records_the_tasks_of_the_block(anyio_backend: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    async with engine() as eng:
        with eng.trace(path):
            await within(eng.run(np.add, 1, 2, name="traced-add"))
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert [e["name"] for e in spans if "traced-add" in e["name"]]


async def test_aclose_finishes_the_work_in_flight(anyio_backend: str) -> None:
    eng = await engine().start()
    gate = Gate()
    held = eng.submit_nowait(gate.hold(lambda: 1))
    queued = [eng.submit_nowait(np.add, held, i) for i in range(5)]
    await gate.wait_started(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(eng.aclose)
        await until(lambda: eng.closed)
        with pytest.raises(ss.EngineClosed):
            eng.submit_nowait(int, 1)
        gate.open()
    assert [f.result() for f in queued] == [1, 2, 3, 4, 5]


async def test_a_cancelled_body_still_closes_the_engine(anyio_backend: str) -> None:
    with anyio.CancelScope() as scope:
        async with engine() as eng:
            gate = Gate()
            held = eng.submit_nowait(gate.hold())
            queued = eng.submit_nowait(np.add, held, 1)
            await gate.wait_started(1)
            gate.open()  # the running task finishes; the close cancels the queued one or lets it run
            scope.cancel()
            await anyio.sleep(TIMEOUT)  # the cancellation lands here
    assert scope.cancelled_caught
    assert eng.closed and held.done() and queued.done()
    # the threads were joined (the autouse fixture checks no schedsvc- thread is left)


async def test_done_callbacks_run_on_the_engine_loop(anyio_backend: str) -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[int, int]] = []
    async with engine() as eng:
        fut = eng.submit_nowait(int, 9)
        fut.add_done_callback(lambda f: seen.append((f.result(), threading.get_ident())))
        await within(eng.waitall())
        await until(lambda: bool(seen))
    assert seen == [(9, loop_thread)]


async def test_a_burst_of_awaited_completions_wakes_the_trio_run_once(anyio_backend: str) -> None:
    if anyio_backend != "trio":
        pytest.skip("asyncio's: tests/runtime/test_bridge.py")
    async with engine() as eng:
        rt = eng._rt
        assert rt is not None
        drains: list[int] = []
        real = rt.bridge._drain_guarded  # type: ignore[attr-defined]

        def counting() -> None:
            drains.append(1)
            real()

        gate, last_done = Gate(), threading.Event()
        eng.submit_nowait(gate.hold())
        futures = [eng.submit_nowait(int, i) for i in range(50)]
        futures.append(eng.submit_nowait(last_done.set))
        got: list[Any] = []

        async def gather() -> None:
            got.extend([await f for f in futures])

        async with anyio.create_task_group() as tg:
            tg.start_soon(gather)
            await until(lambda: futures[0].watchers is not None)  # parked on the first
            await gate.wait_started(1)
            rt.bridge._drain_guarded = counting  # type: ignore[attr-defined]
            gate.open()
            # block the run's thread until the worker has finished the whole burst
            assert last_done.wait(TIMEOUT)
            await state(eng, lambda: eng.stats().pending == 0)
        assert got[:50] == list(range(50))
        assert len(drains) <= 2, drains  # the burst, and at most the first waiter's own wake-up


def test_a_trio_task_awaits_a_future_of_an_engine_on_another_thread_loop() -> None:
    import asyncio

    ready, done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with engine() as eng:
            gate = Gate()
            box["fut"] = eng.submit_nowait(gate.hold(lambda: 11))
            box["gate"] = gate
            ready.set()
            await anyio.to_thread.run_sync(done.wait, TIMEOUT)

    server = threading.Thread(target=asyncio.run, args=(serve(),), name="asyncio-server")
    server.start()
    try:
        assert ready.wait(TIMEOUT)

        async def await_it() -> int:
            box["gate"].open()
            with trio.fail_after(TIMEOUT):
                return int(await box["fut"])

        assert trio.run(await_it) == 11
    finally:
        done.set()
        server.join(TIMEOUT)
    assert not server.is_alive()


def test_an_engine_left_open_when_the_trio_run_ends_warns_and_its_threads_end() -> None:
    async def main() -> ss.Future[int]:
        eng = await engine().start()
        return eng.submit_nowait(int, 4)

    with pytest.warns(ResourceWarning, match="still open when its event loop ended"):
        fut = trio.run(main)
    assert fut.result(TIMEOUT) == 4
    threads_end()


def threads_end() -> None:
    """Wait (bounded) for the threads of an engine whose loop ended: they finish the queue, then end."""
    deadline = time.monotonic() + TIMEOUT
    while any(t.name.startswith("schedsvc-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the engine's threads did not end"
        time.sleep(0.001)


def test_dask_refuses_a_trio_engine_and_says_what_to_do() -> None:
    async def main() -> None:
        await ss.Engine(backend="dask", dask_address="tcp://127.0.0.1:9").start()

    with pytest.raises(ss.DeviceError, match="asyncio only"):
        trio.run(main)


def test_start_outside_an_event_loop_says_where_an_engine_runs() -> None:
    coro = ss.Engine().start()
    with warnings.catch_warnings(), pytest.raises(ss.SchedsvcError, match="running event loop"):
        coro.send(None)
    coro.close()


@pytest.mark.parametrize("run", ["asyncio", "trio"])
def test_result_blocks_on_the_loop_thread_once_the_loop_has_ended(run: str) -> None:
    import asyncio

    gate = Gate()

    async def main() -> ss.Future[int]:
        eng = await engine().start()
        eng.submit_nowait(gate.hold())
        return eng.submit_nowait(int, 4)  # queued behind the held task when the run ends

    with pytest.warns(ResourceWarning, match="still open when its event loop ended"):
        fut = asyncio.run(main()) if run == "asyncio" else trio.run(main)
    assert not fut.done()
    gate.open()
    assert fut.result(TIMEOUT) == 4  # this thread drives no loop any more: it may block
    threads_end()


def test_engines_closed_in_a_long_trio_run_are_let_go() -> None:
    import gc
    import weakref

    async def main() -> list[weakref.ref[Any]]:
        refs = []
        for _ in range(3):
            async with engine() as eng:
                assert await eng.run(int, 1) == 1
                refs.append(weakref.ref(eng._rt))
            del eng
        await trio.testing.wait_all_tasks_blocked()  # the closed engines' watches have ended
        gc.collect()
        return [r for r in refs if r() is not None]

    assert trio.run(main) == []


def test_the_engines_own_background_jobs_leave_ctrl_c_to_the_main_task() -> None:
    """A second Ctrl-C that arrived while the engine's notice of what its close waits for was still running
    went to that notice, which kept it (the close then waited out the running task): the engine's own jobs
    run shielded from Ctrl-C under trio, which delivers it to the main task; only a job that runs the user's
    code (``eng.map``'s source) takes it, to hand it on."""
    protected: dict[bool, bool] = {}

    async def main() -> None:
        async with ss.Engine(cpu_workers=1) as eng:
            port = eng._port
            for interruptible in (False, True):
                ran = trio.Event()

                async def probe(interruptible: bool = interruptible, ran: trio.Event = ran) -> None:
                    protected[interruptible] = trio.lowlevel.currently_ki_protected()
                    ran.set()

                if interruptible:
                    port.spawn(probe, "a job that runs user code", interruptible=True)
                else:
                    port.spawn(probe, "a job of the engine's own")
                with trio.fail_after(TIMEOUT):
                    await ran.wait()

    trio.run(main)
    assert protected == {False: True, True: False}
