"""Batched calls on cuda devices: ``eng.compile(fn, batch_axis=0)`` with device weights, host or device rows.

On the CUDA simulator (or CuPy and a real GPU: ``SCHEDSVC_TEST_CUDA=cupy``).  Each test starts from a
reset simulator and ends with no race and no fault recorded.  A burst of calls made in one turn of the
event loop is launched as one batch when the coroutine yields; a caller of host rows gets host rows, a
caller of device rows device rows.  Results are compared within rounding (a batch runs one matrix
product per layer for all its rows).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from tests.devices.cuda_helpers import (
    checked_simulator,
    cuda_api,
    cuda_engine,
    host,
    sim,
    simulator_only,
    two_devices,
)
from tests.helpers import TIMEOUT, within

DEVICE = "cuda:0"
F = 16
RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((F, 32)) / 4
W2 = RNG.standard_normal((32, 4)) / 4


@pytest.fixture(autouse=True)
def _simulator(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from checked_simulator(request)


def mlp(x: Any, w1: Any, w2: Any) -> Any:
    return np.maximum(x @ w1, 0) @ w2


def rows(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, F))


def close(got: Any, want: Any) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def weights(eng: ss.Engine, device: str = DEVICE) -> list[ss.Tensor]:
    return [eng.asarray(W1, device=device), eng.asarray(W2, device=device)]


async def test_a_burst_of_host_rows_with_device_weights_is_one_batch_and_each_caller_gets_host_rows() -> None:
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        await within(f(rows(1, 0), *w))  # the key proved, its first size traced
        xs = [rows(1 + i % 3, i) for i in range(32)]
        results = await within(asyncio.gather(*(f(x, *w) for x in xs)))
        for x, got in zip(xs, results, strict=True):
            assert type(got) is np.ndarray  # host rows in, host rows out
            close(got, mlp(x, W1, W2))
        assert f.stats()["batch_sizes"] == {1: 1, sum(x.shape[0] for x in xs): 1}
        assert eng.stats().batches == 2


async def test_coroutines_that_each_call_and_await_in_one_turn_of_the_loop_are_one_batch() -> None:
    """Each call is staged, and its await does not hand it over: the flush at the end of the turn launches
    them together (as a server's handlers, woken together, each awaiting its own call)."""
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        await within(f(rows(1, 0), *w))

        async def client(i: int) -> None:
            close(await f(rows(1, i), *w), mlp(rows(1, i), W1, W2))

        await within(asyncio.gather(*(client(i) for i in range(16))))
        assert f.stats()["batch_sizes"] == {1: 1, 16: 1}


async def test_device_rows_give_each_caller_its_rows_on_the_device() -> None:
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        xs = [rows(2, i) for i in range(8)]
        before: dict[int, int] = {}
        for _ in range(2):  # (the second time, the copies in are launched by the calls that make them)
            before = dict(f.stats()["batch_sizes"])
            on_device = [eng.asarray(x, device=DEVICE) for x in xs]
            results = await within(asyncio.gather(*(f(t, *w) for t in on_device)))
        for x, got in zip(xs, results, strict=True):
            assert isinstance(got, cuda_api().ndarray)
            close(host(got), mlp(x, W1, W2))
        after = f.stats()["batch_sizes"]
        second = sum(after.values()) - sum(before.values())
        # the second burst's calls run together: one batch of its 8 calls as a rule (its copies in are
        # launched at once), a few where a loaded machine finishes the copies apart
        assert 1 <= second < len(xs), (before, after)


async def test_a_lone_awaited_call_is_launched_at_its_await() -> None:
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        for i in range(3):
            close(await within(f(rows(1, i), *w)), mlp(rows(1, i), W1, W2))
        assert f.stats()["batch_sizes"] == {1: 3}


async def test_a_batch_replays_as_cuda_graphs_after_its_warm_up() -> None:
    async with cuda_engine(streams_per_device=1) as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        for i in range(4):
            xs = [rows(1, 10 * i + j) for j in range(4)]
            for x, got in zip(xs, await within(asyncio.gather(*(f(x, *w) for x in xs))), strict=True):
                close(got, mlp(x, W1, W2))
        stats = f.stats()
        assert stats["batch_sizes"][4] == 4
        assert stats["cuda_graphs"] >= 1 and stats["graph_replays"] >= 2, stats


@simulator_only
async def test_a_batch_whose_launch_fails_is_split_and_each_caller_gets_its_own_outcome() -> None:
    """The launch of the whole batch runs out of memory once: its halves are launched instead."""
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        await within(f(rows(1, 0), *w))
        xs = [rows(1, i) for i in range(8)]
        calls = [f(x, *w) for x in xs]
        sim().fail_allocations(1)
        for x, got in zip(xs, await within(asyncio.gather(*calls)), strict=True):
            close(got, mlp(x, W1, W2))
        assert 8 not in f.stats()["batch_sizes"]  # split: no batch held all eight


async def test_a_function_that_mixes_rows_is_refused_at_the_first_call() -> None:
    async with cuda_engine() as eng:
        w = weights(eng)
        f = eng.compile(lambda x, w1, w2: mlp(x, w1, w2).sum(axis=0), batch_axis=0, batched=[0])
        with pytest.raises(ss.BatchError, match="rows"):
            f(rows(2, 0), *w)


async def test_captured_arrays_are_refused_on_a_device_with_what_to_do() -> None:
    async with cuda_engine() as eng:
        f = eng.compile(lambda x: mlp(x, W1, W2), batch_axis=0)
        with pytest.raises(ss.BatchError, match=r"captures arrays.*eng\.asarray\(w, device="):
            f(eng.asarray(rows(2, 0), device=DEVICE))
        close(await within(f(rows(2, 0))), mlp(rows(2, 0), W1, W2))  # host rows alone: on the host


async def test_exact_mode_is_refused_on_a_device() -> None:
    async with cuda_engine() as eng:
        f = eng.compile(mlp, batch_axis=0, batched=[0], exact=True)
        with pytest.raises(ss.BatchError, match="exact=True"):
            f(rows(1, 0), *weights(eng))


@two_devices
async def test_arguments_on_two_devices_are_refused() -> None:
    async with cuda_engine() as eng:
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        w1, _ = weights(eng, "cuda:0")
        _, w2 = weights(eng, "cuda:1")
        with pytest.raises(ss.BatchError, match="cuda:0 and cuda:1"):
            f(rows(1, 0), w1, w2)


async def test_a_pending_future_argument_of_a_call_on_a_device_is_refused() -> None:
    opened = threading.Event()

    def later() -> np.ndarray[Any, Any]:
        assert opened.wait(TIMEOUT)
        return rows(1, 0)

    async with cuda_engine() as eng:
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        pending = eng.submit_nowait(later, device="cpu")
        try:
            with pytest.raises(ss.BatchError, match="pending Future"):
                f(pending, *weights(eng))
        finally:
            opened.set()
        await within(pending)


async def test_the_calls_count_one_task_each_and_the_engine_ends_idle() -> None:
    async with cuda_engine(max_pending=64) as eng:
        w = weights(eng)
        f = eng.compile(mlp, batch_axis=0, batched=[0])
        xs = [rows(1, i) for i in range(16)]
        before = eng.stats().submitted
        await within(asyncio.gather(*(f(x, *w) for x in xs)))
        await within(eng.waitall())
        stats = eng.stats()
        assert stats.submitted - before == 16
        assert stats.pending == 0 and stats.failed == 0
