"""How big batches are, and which calls they hold: batch sizes from the load (a lone call at once, a burst
in full batches), the default mode's one product for the whole batch, calls of any number of rows traced at
a few padded sizes, and a caller that gives up (a deadline) dropped from its batch before it runs.  Driven
event by event: a held worker keeps the engine busy while calls queue, never sleeps."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from ..helpers import on_asyncio, started, within
from .helpers import assert_rows_close, assert_same_bits, batching_engine, both_backends, occupied

F = 64
W1 = np.linspace(-1.0, 1.0, F * 32).reshape(F, 32) / 8
W2 = np.linspace(0.7, -0.9, 32 * 2).reshape(32, 2)

anyio_backend = both_backends
engine = batching_engine


def mlp(x: Any) -> Any:
    return np.tanh(x @ W1) @ W2


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, F))


def sizes(f: Any) -> dict[int, int]:
    return dict(f.stats()["batch_sizes"])


# -- batch sizes follow the load ---------------------------------------------------------------------------


async def test_a_lone_call_runs_at_once_and_a_burst_fills_batches(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=8)
        assert_rows_close(await within(f(rows(1, 0))), mlp(rows(1, 0)))  # no timer: nothing to wait for
        assert sizes(f) == {1: 1}
        xs = [rows(1, seed) for seed in range(20)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
            assert not any(c.done() for c in calls)
        for x, call in zip(xs, calls, strict=True):
            assert_rows_close(await within(call), mlp(x))
        assert sizes(f) == {1: 1, 8: 2, 4: 1}  # the backlog is the batch: full ones, then the rest


async def test_a_burst_made_in_one_turn_is_one_batch_however_many_workers_are_idle(
    anyio_backend: str,
) -> None:
    """Four idle workers, and sixteen calls made in one turn of the loop: they go to the workers together
    at the turn's end, and the worker that takes the first takes the others with it -- no worker woken
    beside it gets one of them alone."""
    async with started(cpu_workers=4, inline_threshold_us=0) as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64)
        assert_rows_close(await within(f(rows(1, 0))), mlp(rows(1, 0)))
        for burst in range(3):
            xs = [rows(1, seed) for seed in range(16 * burst, 16 * burst + 16)]
            calls = [f(x) for x in xs]
            for x, call in zip(xs, calls, strict=True):
                assert_rows_close(await within(call), mlp(x))
        assert sizes(f) == {1: 1, 16: 3}


# -- the default mode: one product for the batch, up to max_batch rows ------------------------------------


async def test_the_default_mode_takes_up_to_max_batch_rows(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64)
        assert f.exact is False
        xs = [rows(1, seed) for seed in range(40)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, call in zip(xs, calls, strict=True):
            assert_rows_close(await within(call), mlp(x))
        assert sizes(f) == {40: 1}


async def test_the_default_mode_runs_one_product_for_the_whole_batch(anyio_backend: str) -> None:
    """Each caller's rows are, bit for bit, its rows of the function run on the batch's rows at once (8 rows:
    no padding): one matrix product per layer, not one per caller."""
    counts = [1, 3, 4]
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=8)
        xs = [rows(n, seed) for seed, n in enumerate(counts)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        whole = mlp(np.concatenate(xs))
        start = 0
        for n, call in zip(counts, calls, strict=True):
            assert_same_bits(await within(call), whole[start : start + n])
            start += n
        assert sizes(f) == {8: 1}


@pytest.mark.parametrize("counts", [[1] * 10, [1, 3, 2], [2, 2, 2]], ids=["ten one-row", "1+3+2", "2+2+2"])
async def test_exact_mode_gives_each_caller_its_own_bits_in_a_padded_batch(
    anyio_backend: str, counts: list[int]
) -> None:
    """A batch padded to a power of two (10 rows to 16, 6 to 8) whose padding rows are not computed one by
    one: each caller still gets its own call's bits."""
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64, exact=True)
        xs = [rows(n, seed) for seed, n in enumerate(counts)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, call in zip(xs, calls, strict=True):
            assert_same_bits(await within(call), mlp(x))
        assert sizes(f) == {sum(counts): 1}


# -- calls of many sizes trace a few ------------------------------------------------------------------------


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
async def test_calls_of_1_to_40_rows_trace_the_powers_of_two_only(anyio_backend: str, exact: bool) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, exact=exact)
        for n in range(1, 41):
            x = rows(n, n)
            y = await within(f(x))
            if exact:
                assert_same_bits(y, mlp(x))  # padded to a power of two, still its own call's bits
            else:
                assert_rows_close(y, mlp(x))
        stats = f.stats()
        # the first call's own rows and the many rows it is proved with (256), then 2, 4, ..., 64
        assert stats["traces"] == 8 and stats["plans"] == 8
        assert sizes(f) == dict.fromkeys(range(1, 41), 1)


async def test_mixed_row_counts_in_batches_reuse_the_padded_sizes(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64)
        await within(f(rows(1)))
        traced = f.stats()["traces"]
        for counts in ([1, 2], [3, 4, 5], [2, 2, 2, 2], [7], [5, 11]):  # 3, 12, 8, 7, 16 rows
            xs = [rows(n, n) for n in counts]
            async with occupied(eng, 1):
                calls = [f(x) for x in xs]
            for x, call in zip(xs, calls, strict=True):
                assert_rows_close(await within(call), mlp(x))
        assert f.stats()["traces"] - traced == 3  # 4, 8 and 16 rows: 3 and 7 pad to 4 and 8


# -- a caller that gives up leaves its batch ---------------------------------------------------------------


async def await_by(deadline: str, call: Any) -> Any:
    """``await call`` within 10 ms, the way ``deadline`` names."""
    import asyncio

    if deadline == "asyncio.timeout":
        async with asyncio.timeout(0.01):
            return await call
    if deadline == "asyncio.wait_for":
        return await asyncio.wait_for(call, 0.01)
    with anyio.fail_after(0.01):
        return await call


@pytest.mark.parametrize("deadline", ["anyio.fail_after", "asyncio.timeout", "asyncio.wait_for"])
async def test_a_call_whose_deadline_passes_before_it_runs_never_runs(
    anyio_backend: str, deadline: str
) -> None:
    """A deadline around ``await model(x)``: it passes while the call waits for a worker (held), so the call
    is cancelled and left out of the batch; the other callers' rows run without it."""
    if deadline.startswith("asyncio") and not on_asyncio():
        pytest.skip("asyncio's own timeouts run under asyncio only")
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=8)
        await within(f(rows(1)))
        async with occupied(eng, 1):
            kept = [f(rows(1, seed)) for seed in (1, 2)]
            late = f(rows(1, 3))
            with pytest.raises(TimeoutError):  # the held worker cannot run it before the deadline
                await await_by(deadline, late)
            assert late.cancelled()
            assert not any(c.done() for c in kept)
        for seed, call in zip((1, 2), kept, strict=True):
            assert_rows_close(await within(call), mlp(rows(1, seed)))
        assert late.cancelled()
        assert sizes(f) == {1: 1, 2: 1}  # the batch held the two callers that stayed
        assert eng.stats().pending == 0
