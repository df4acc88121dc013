"""The public contract, run on both backends -- threads, and Dask (a local cluster of 2 worker processes)
-- and on both async libraries: asyncio (pytest-asyncio) and trio (anyio's plugin; threads only, as Dask's
client is built on asyncio).

Task bodies are module-level functions, so a Dask worker imports them by name; tasks that must be held
use a ``FileGate``, which works across processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import schedsvc as ss
from tests.helpers import FileGate, on_asyncio, state, until, within


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every test of this module runs on asyncio and on trio (``conftest.pytest_pycollect_makeitem``)."""
    return str(request.param)


@pytest.fixture
def backend_options(anyio_backend: str, backend_options: dict[str, Any]) -> dict[str, Any]:
    if anyio_backend == "trio" and backend_options["backend"] == "dask":
        pytest.skip("Dask's client runs on asyncio only (tests/test_trio.py: a trio engine refuses it)")
    return backend_options


def cancelled_error() -> type[BaseException]:
    """What awaiting a cancelled task raises: asyncio's CancelledError, or on trio concurrent.futures'."""
    return asyncio.CancelledError if on_asyncio() else concurrent.futures.CancelledError


class Boom(Exception):
    """The failure a task raises on purpose."""


def boom(x: Any = None) -> None:
    raise Boom(f"boom on {x!r}")


def add_all(items: list[Any], mapping: dict[str, Any]) -> Any:
    return sum(items) + sum(mapping.values())


def scaled(x: np.ndarray, *, by: float) -> np.ndarray:
    return x * by


def fill_then_fail(*, out: np.ndarray) -> None:
    out[:2] = 7  # a partial write, then a failure: the write stays, as NumPy leaves it
    raise Boom("half written")


async def test_submit_and_await_a_value(backend_options: dict[str, Any]) -> None:
    async with ss.Engine(**backend_options) as eng:
        fut = await eng.submit(np.add, np.arange(4), 1)
        np.testing.assert_array_equal(await within(fut), [1, 2, 3, 4])
        assert fut.done() and fut.exception() is None
        assert await within(eng.run(np.multiply, 6, 7)) == 42


async def test_futures_as_arguments_also_inside_containers(backend_options: dict[str, Any]) -> None:
    async with ss.Engine(**backend_options) as eng:
        a = await eng.submit(np.add, 1, 1)
        b = eng.submit_nowait(np.multiply, a, 10)
        c = eng.submit_nowait(add_all, [a, b], {"k": b})
        d = eng.submit_nowait(scaled, np.ones(3), by=c)
        assert await within(c) == 2 + 20 + 20
        np.testing.assert_array_equal(await within(d), [42.0, 42.0, 42.0])


async def test_an_error_propagates_and_dependents_fail_without_running(
    backend_options: dict[str, Any],
) -> None:
    async with ss.Engine(**backend_options) as eng:
        bad = await eng.submit(boom, 1)
        child = eng.submit_nowait(np.add, bad, 1)
        grandchild = eng.submit_nowait(add_all, [child], {})
        with pytest.raises(Boom, match="boom on 1"):
            await within(bad)
        for fut in (child, grandchild):
            with pytest.raises(ss.DependencyError) as info:
                await within(fut)
            assert isinstance(info.value.__cause__, Boom)
        assert await within(eng.run(np.add, 2, 2)) == 4  # the engine keeps serving
        assert eng.stats().failed == 3


async def test_out_writes_are_ordered_with_reads_in_submission_order(
    backend_options: dict[str, Any],
) -> None:
    buf = np.zeros(4)
    async with ss.Engine(**backend_options) as eng:
        before = eng.submit_nowait(np.sum, buf)
        write = eng.submit_nowait(np.add, buf, 5, out=buf)
        after = eng.submit_nowait(np.sum, buf)
        view = eng.submit_nowait(np.multiply, buf[::2], 2, out=buf[::2])
        last = eng.submit_nowait(np.sum, buf)
        assert await within(before) == 0
        assert (await within(write)) is buf
        assert await within(after) == 20
        await within(view)
        assert await within(last) == 30
    np.testing.assert_array_equal(buf, [10, 5, 10, 5])


async def test_a_failing_writer_leaves_its_partial_write_as_numpy_would(
    backend_options: dict[str, Any],
) -> None:
    buf = np.zeros(4)
    async with ss.Engine(**backend_options) as eng:
        fut = eng.submit_nowait(fill_then_fail, out=buf)
        after = eng.submit_nowait(np.sum, buf)
        with pytest.raises(Boom):
            await within(fut)
        assert await within(after) == 14
    np.testing.assert_array_equal(buf, [7, 7, 0, 0])


async def test_backpressure_submit_nowait_raises_and_submit_waits(
    backend_options: dict[str, Any], tmp_path: Path
) -> None:
    gate = FileGate(str(tmp_path))
    async with ss.Engine(**backend_options, max_pending=2) as eng:
        held = [eng.submit_nowait(gate.hold(i)) for i in range(2)]
        with pytest.raises(ss.QueueFull):
            eng.submit_nowait(np.add, 1, 1)
        admitted: list[ss.Future[Any]] = []

        async def submit_waiting() -> None:
            admitted.append(await eng.submit(np.add, 1, 2))

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit_waiting)
            await state(eng, lambda: eng.stats().waiting_admission == 1)  # queued: no room
            assert not admitted
            gate.open()
        assert await within(admitted[0]) == 3
        assert [await within(f) for f in held] == [0, 1]


async def test_max_pending_bytes_counts_array_arguments(
    backend_options: dict[str, Any], tmp_path: Path
) -> None:
    gate = FileGate(str(tmp_path))
    big = np.zeros(100)  # 800 bytes
    async with ss.Engine(**backend_options, max_pending_bytes=1000) as eng:
        first = eng.submit_nowait(gate.hold(), reads=big)
        with pytest.raises(ss.QueueFull):
            eng.submit_nowait(np.sum, np.zeros(50))  # 400 more bytes would exceed 1000
        with pytest.raises(ss.MemoryLimitError):
            eng.submit_nowait(np.sum, np.zeros(200))  # could never fit
        gate.open()
        await within(first)
        assert await within(eng.run(np.sum, np.ones(50))) == 50


async def test_cancel_a_task_that_has_not_started(backend_options: dict[str, Any], tmp_path: Path) -> None:
    gate = FileGate(str(tmp_path))
    async with ss.Engine(**backend_options) as eng:
        held = eng.submit_nowait(gate.hold(1))
        waiting = eng.submit_nowait(np.add, held, 1)  # waits for its input: not started
        assert waiting.cancel()
        with pytest.raises(cancelled_error()):
            await within(waiting)
        gate.open()
        assert await within(held) == 1


async def test_waitall_and_done_callbacks(backend_options: dict[str, Any]) -> None:
    seen: list[Any] = []
    async with ss.Engine(**backend_options) as eng:
        futs = [eng.submit_nowait(np.add, i, 1) for i in range(5)]
        futs[0].add_done_callback(seen.append)
        await within(eng.waitall())
        assert all(f.done() for f in futs)
        assert [await f for f in futs] == [1, 2, 3, 4, 5]
        await until(lambda: bool(seen))
        assert seen == [futs[0]]


async def test_result_from_another_thread(backend_options: dict[str, Any]) -> None:
    async with ss.Engine(**backend_options) as eng:
        fut = eng.submit_nowait(np.add, np.arange(3), 1)
        value = await within(anyio.to_thread.run_sync(fut.result, 10.0))
        np.testing.assert_array_equal(value, [1, 2, 3])


async def test_aclose_waits_for_pending_work_and_then_refuses(backend_options: dict[str, Any]) -> None:
    eng = ss.Engine(**backend_options)
    await eng.start()
    futs = [eng.submit_nowait(np.add, i, i) for i in range(4)]
    await within(eng.aclose())
    assert all(f.state == "done" for f in futs)
    with pytest.raises(ss.EngineClosed):
        eng.submit_nowait(np.add, 1, 1)


async def test_aclose_cancel_pending_cancels_unstarted_work(
    backend_options: dict[str, Any], tmp_path: Path
) -> None:
    gate = FileGate(str(tmp_path))
    eng = ss.Engine(**backend_options)
    await eng.start()
    held = eng.submit_nowait(gate.hold(1))
    queued = eng.submit_nowait(np.add, held, 1)
    gate.open()
    await within(eng.aclose(cancel_pending=True))
    assert queued.done() and held.done()


async def test_map_pipeline(backend_options: dict[str, Any]) -> None:
    async with ss.Engine(**backend_options) as eng:
        got = [x async for x in eng.map(np.square, range(6), max_inflight=3)]
    assert got == [0, 1, 4, 9, 16, 25]
