"""Review of dynamic batching (issue 19): each test pins a bug found in review, driven deterministically (a held
worker keeps the engine busy while calls form a batch).  Every async test runs on asyncio and on trio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import schedsvc as ss

from ..helpers import Gate, until, within
from .helpers import assert_same_bits, batching_engine, both_backends, occupied

V4 = np.linspace(-1.0, 1.0, 4)
V3 = np.linspace(0.5, -0.5, 3)


anyio_backend = both_backends
engine = batching_engine


def stacks(n: int, seed: int) -> np.ndarray:
    """``n`` rows, each a 3x4 matrix."""
    return np.random.default_rng(seed).standard_normal((n, 3, 4))


# -- a matmul with a 1-d operand and the batch on a stack axis ----------------------------------------------

VECTOR_MIXING: list[tuple[str, Callable[[Any], Any], str]] = [
    ("(x @ v) summed over the batch", lambda x: (x @ V4).sum(axis=0), "sum"),
    ("(v @ x) summed over the batch", lambda x: (V3 @ x).sum(axis=0), "sum"),
    ("the first row of x @ v", lambda x: (x @ V4)[0], "getitem"),
]


@pytest.mark.parametrize(
    ("fn", "op"), [(fn, op) for _, fn, op in VECTOR_MIXING], ids=[name for name, _, _ in VECTOR_MIXING]
)
async def test_a_matrix_vector_product_keeps_the_batch_axis_so_mixing_after_it_is_refused(
    anyio_backend: str, fn: Callable[[Any], Any], op: str
) -> None:
    """``x @ v`` of (n, 3, 4) stacks and a vector is (n, 3): the batch stays on axis 0 (it was taken for axis
    -1, so a later reduction over axis 0 passed the proof and every caller got a sum over all callers)."""
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0)
        with pytest.raises(ss.BatchError, match=rf"{op}\(\) \(batch axis 0\)"):
            f(stacks(1, 0))


@pytest.mark.parametrize(
    "fn", [lambda x: np.tanh(x @ V4), lambda x: V3 @ x], ids=["stacks @ vector", "vector @ stacks"]
)
async def test_a_matrix_vector_product_of_stacks_batches_row_by_row(
    anyio_backend: str, fn: Callable[[Any], Any]
) -> None:
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0, max_batch=4)
        xs = [stacks(1, 0), stacks(3, 1)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, call in zip(xs, calls, strict=True):
            assert_same_bits(await within(call), fn(x))
        assert f.stats()["batch_sizes"] == {4: 1}


# -- an unbatched array is known by more than its id ------------------------------------------------------


async def test_an_unbatched_array_that_changed_shape_is_proved_again(anyio_backend: str) -> None:
    """The batch key knew an unbatched array by its id alone, so a later call with an array of another shape
    under that id (the same object resized, or -- the common way -- a new array that got a freed one's id)
    reused the plan proved for the old shape: ``x * w`` with ``w`` grown to 2 rows gave the caller 1 row of
    the 2 that ``fn`` gives, where it mixes rows and must be refused."""
    async with engine() as eng:
        f = eng.compile(lambda x, w: x * w, batch_axis=0, batched=[0])
        x = np.ones((1, 3))
        w = np.full((1, 3), 2.0)
        assert_same_bits(await within(f(x, w)), x * w)
        w.resize((2, 3), refcheck=False)  # the same object, now of 2 rows
        w[1] = 3.0
        with pytest.raises(ss.BatchError, match=r"multiply\(\) \(batch axis 0\): it broadcasts the batch"):
            f(x, w)
        assert_same_bits(await within(f(np.ones((2, 3)), w[:1].copy())), np.full((2, 3), 2.0))


# -- a call whose Future argument finishes while the engine closes ------------------------------------------


async def test_a_call_whose_future_argument_finishes_while_the_engine_closes_completes(
    anyio_backend: str,
) -> None:
    """A call made before the close is a task the close waits for: once its argument is there it runs, and
    gives its rows (it neither hangs nor fails)."""
    eng = await ss.Engine(cpu_workers=2, inline_threshold_us=0).start()
    f = eng.compile(lambda x: x * 2, batch_axis=0)
    argument, other = Gate(), Gate()
    fa = eng.submit_nowait(argument.hold(lambda: np.ones((1, 3))))
    eng.submit_nowait(other.hold())
    await argument.wait_started(1)
    await other.wait_started(1)
    call = f(fa)
    async with anyio.create_task_group() as tg:
        tg.start_soon(eng.aclose)
        await until(lambda: eng._port.state == "closing")
        argument.open()
        other.open()
    assert_same_bits(await within(call, 2.0), np.full((1, 3), 2.0))
