"""Dynamic batching of compiled calls (``eng.compile(fn, batch_axis=...)``), driven deterministically: a
held worker keeps the engine busy while calls form batches, so how they were batched is asserted from the
stats, never from timing.  Every async test runs on asyncio and on trio (``anyio_backend``)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import schedsvc as ss

from ..helpers import TIMEOUT, Gate, on_asyncio, started, state, within
from .helpers import assert_rows_close, assert_same_bits, batching_engine, both_backends, occupied

# features of a row: long enough that BLAS rounds a row of a many-row product differently from a one-row
# product (the default, fast mode gives other bits here), so "bit for bit" tests exact=True and the default
# mode's results are compared within rounding (assert_rows_close)
F = 64
W1 = np.linspace(-1.0, 1.0, F * 32).reshape(F, 32) / 8
B1 = np.linspace(-0.2, 0.3, 32)
W2 = np.linspace(0.7, -0.9, 32 * 2).reshape(32, 2)
W6 = np.linspace(-1.0, 1.0, 6 * 4).reshape(6, 4)


def mlp(x: Any) -> Any:
    return np.tanh(x @ W1 + B1) @ W2


def rows(n: int, seed: int = 0, features: int = F) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, features))


anyio_backend = both_backends
engine = batching_engine


def sizes(compiled: ss.Batched) -> dict[int, int]:
    return dict(compiled.stats()["batch_sizes"])


def cancelled_error() -> type[BaseException]:
    """What awaiting a cancelled call raises: asyncio's CancelledError, or on trio concurrent.futures'."""
    import asyncio
    import concurrent.futures

    return asyncio.CancelledError if on_asyncio() else concurrent.futures.CancelledError


async def results(calls: list[Any]) -> list[Any]:
    return [await within(c) for c in calls]


class Background:
    """A coroutine run in a task group, its outcome kept for the test to look at."""

    def __init__(self) -> None:
        self.value: Any = None
        self.finished = anyio.Event()

    async def run(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.value = await fn(*args)
        finally:
            self.finished.set()


# -- each caller's rows ---------------------------------------------------------------------------------


async def test_calls_of_different_row_counts_form_one_batch_and_each_gets_its_own_rows(
    anyio_backend: str,
) -> None:
    counts = [1, 3, 2, 5]
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=sum(counts))
        xs = [rows(n, seed) for seed, n in enumerate(counts)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
            assert all(isinstance(c, ss.BatchCall) for c in calls)
            assert not any(c.done() for c in calls)
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))  # what NumPy gives on this caller's rows alone, within rounding
        assert sizes(f) == {sum(counts): 1}
        assert f.stats()["batches"] == 1 and f.stats()["rows"] == sum(counts)
        assert all(c.done() and not c.cancelled() and c.exception() is None for c in calls)


async def test_equal_row_counts_batch_and_match_bit_for_bit(anyio_backend: str) -> None:
    """Same row counts: the stacked matmul of the exact mode."""
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=8, exact=True)
        xs = [rows(2, seed) for seed in range(4)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, mlp(x))
        assert sizes(f) == {8: 1}


async def test_results_match_an_unbatched_compiled_call(anyio_backend: str) -> None:
    async with engine() as eng:
        batched = eng.compile(mlp, batch_axis=0, max_batch=6, exact=True)
        plain = eng.compile(mlp)
        xs = [rows(n, seed) for seed, n in enumerate([1, 2, 3])]
        async with occupied(eng, 1):
            calls = [batched(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, await within(plain(x)))


async def test_a_function_returning_a_tuple_gives_each_caller_a_tuple_of_its_rows(anyio_backend: str) -> None:
    def two(x: Any) -> Any:
        return x @ W1, np.abs(x).sum(axis=1)

    async with engine() as eng:
        f = eng.compile(two, batch_axis=0, max_batch=4)
        xs = [rows(1, 0), rows(3, 1)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, got in zip(xs, await results(calls), strict=True):
            assert isinstance(got, tuple) and len(got) == 2
            for g, w in zip(got, two(x), strict=True):
                assert_rows_close(g, w)


async def test_batch_axis_one(anyio_backend: str) -> None:
    def fn(x: Any) -> Any:
        return np.exp(x) - x.max(axis=0, keepdims=True)

    async with engine() as eng:
        f = eng.compile(fn, batch_axis=1, max_batch=5)
        xs = [rows(4, 0).T, rows(1, 1).T]  # (3, 4) and (3, 1): rows along axis 1
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert y.shape == x.shape
            assert_same_bits(y, fn(x))
        assert sizes(f) == {5: 1}


def sum_over_axis_0(x: Any) -> Any:
    return x.sum(axis=0)


def arctan2_of_reversed(x: Any) -> Any:
    return np.arctan2(x[:, ::-1], x)


@pytest.mark.parametrize(
    ("fn", "batch_axis"),
    [(sum_over_axis_0, 1), (arctan2_of_reversed, 0)],
    ids=["sum over an axis before the batch axis", "arctan2 of a reversed view"],
)
async def test_exact_holds_where_numpy_rounds_a_one_row_array_differently(
    anyio_backend: str, fn: Callable[[Any], Any], batch_axis: int
) -> None:
    """float32 cases where NumPy gives a one-row caller's own array other bits than the same row of a
    many-row array (another summation order; another arctan2 loop): exact=True must still give each caller
    the bits of its own call."""
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=batch_axis, max_batch=4, exact=True)
        xs = [rows(n, seed, features=16).astype(np.float32) for seed, n in enumerate([1, 3])]
        if batch_axis == 1:
            xs = [np.ascontiguousarray(x.T) for x in xs]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, fn(x))


async def test_exact_false_gives_the_rows_within_rounding(anyio_backend: str) -> None:
    w = np.linspace(-1.0, 1.0, 64 * 8).reshape(64, 8)
    async with engine() as eng:
        f = eng.compile(lambda x: x @ w, batch_axis=0, max_batch=6, exact=False)
        xs = [rows(n, seed, features=64) for seed, n in enumerate([1, 2, 3])]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert y.shape == (len(x), 8) and y.dtype == np.float64
            np.testing.assert_allclose(y, x @ w, rtol=1e-12, atol=1e-12)
        assert sizes(f) == {6: 1}


@pytest.mark.parametrize("bad", ["yes", 1, None])
async def test_exact_not_a_bool_is_a_type_error_at_compile(anyio_backend: str, bad: Any) -> None:
    async with engine() as eng:
        with pytest.raises(TypeError, match=r"exact=.*must be a bool"):
            eng.compile(lambda x: x * 2, batch_axis=0, exact=bad)
        with pytest.raises(TypeError, match=r"exact=.*must be a bool"):  # without batch_axis too
            eng.compile(lambda x: x * 2, exact=bad)


async def test_a_renamed_batched_function_names_its_calls_by_the_new_name(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, name="first")
        assert "batch:first" in repr(f(rows(1)))
        f.name = "second"
        call = f(rows(1))
        assert "batch:second" in repr(call) and call.label == "batch:second"
        await within(call)


async def test_a_call_with_more_rows_than_max_batch_runs_as_one_batch(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=4)
        x = rows(10)
        async with occupied(eng, 1):
            call = f(x)
            await state(eng, lambda: eng.stats().pending == 2)  # sent at once: it is full
        assert_rows_close(await within(call), mlp(x))  # (run padded to 16 rows: within rounding)
        assert sizes(f) == {10: 1}


ALLOWED: list[tuple[str, Callable[[Any], Any]]] = [
    ("where", lambda x: np.where(x > 0, x, 0.5 * x)),
    ("clip", lambda x: np.clip(x, -0.5, 0.5)),
    ("astype", lambda x: x.astype(np.float32) * 2),
    ("copy", lambda x: np.copy(x) + 1),
    ("matmul", lambda x: x @ W6),
    ("dot", lambda x: np.dot(x, W6)),
    ("sum over axis 1", lambda x: x.sum(axis=1)),
    ("max over the last axis, keepdims", lambda x: x.max(axis=-1, keepdims=True)),
    ("reshape with len(x)", lambda x: x.reshape(len(x), 2, 3).sum(axis=2)),
    ("reshape with -1", lambda x: x.reshape(-1, 2, 3).transpose(0, 2, 1)),
    ("slice of another axis", lambda x: x[:, :4]),
    ("index of another axis", lambda x: x[..., 0]),
    ("concatenate along axis 1", lambda x: np.concatenate([x, np.sin(x)], axis=1)),
    ("stack along axis 1", lambda x: np.stack([x, x * 2], axis=1)),
    ("a constant of one row", lambda x: x + np.arange(6.0)[None, :]),
    ("each row over its norm", lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)),
]


@pytest.mark.parametrize("fn", [fn for _, fn in ALLOWED], ids=[name for name, _ in ALLOWED])
async def test_row_wise_functions_batch(anyio_backend: str, fn: Callable[[Any], Any]) -> None:
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0, max_batch=4)
        xs = [rows(1, 0, features=6), rows(3, 1, features=6)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, fn(x))
        assert sizes(f) == {4: 1}


# -- row-mixing functions are refused ---------------------------------------------------------------------

C2 = np.linspace(-1.0, 1.0, 2 * F).reshape(2, F)  # as many rows as the calls below: rows paired with rows
W22 = np.linspace(-1.0, 1.0, 4).reshape(2, 2)
W42 = np.linspace(-1.0, 1.0, 8).reshape(4, 2)

MIXING: list[tuple[str, Callable[[Any], Any], list[str]]] = [
    ("centred by the batch mean", lambda x: x - x.mean(axis=0), ["mean", "axis 0"]),
    ("x.T @ w", lambda x: x.T @ W22, ["matmul"]),
    ("w @ x", lambda x: W42 @ x, ["matmul"]),
    ("sum of everything", lambda x: x.sum(), ["sum"]),
    ("the first row", lambda x: x[0], ["axis 0"]),
    ("concatenated along the batch", lambda x: np.concatenate([x, x], axis=0), ["concatenate"]),
    ("flattened", lambda x: x.reshape(-1), ["reshape"]),
    ("a constant with the batch's rows", lambda x: x + C2, ["add"]),
]


@pytest.mark.parametrize(
    ("fn", "named"), [(fn, named) for _, fn, named in MIXING], ids=[name for name, _, _ in MIXING]
)
async def test_row_mixing_functions_raise_batch_error_at_the_first_call(
    anyio_backend: str, fn: Callable[[Any], Any], named: list[str]
) -> None:
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0)
        with pytest.raises(ss.BatchError) as info:
            f(rows(2))
        assert isinstance(info.value, ss.TraceError) and isinstance(info.value, ss.SchedsvcError)
        for word in named:
            assert word in str(info.value), f"{word!r} not in: {info.value}"
        assert eng.stats().submitted == 0


async def test_a_norm_over_the_batch_axis_says_the_rows_mix_which_axis_to_reduce_and_where(
    anyio_backend: str,
) -> None:
    async with engine() as eng:
        f = eng.compile(lambda x: x / np.linalg.norm(x, axis=0), batch_axis=0)  # the line the message shows
        with pytest.raises(ss.BatchError) as info:
            f(rows(2))
    message = str(info.value)
    assert "mix the rows of different callers" in message
    assert "reduce only each row's own axes (axis=1;" in message
    assert "test_batching.py:" in message and "np.linalg.norm(x, axis=0)" in message
    assert "eng.submit" not in message


REDUCTION_ADVICE: list[tuple[Callable[[Any], Any], tuple[int, ...], str]] = [
    (lambda x: x.sum(axis=(0, 1)), (2, 3, 4), "reduce only each row's own axes (axis=1;"),
    (lambda x: x - x.sum(), (2, 3), "reduce only each row's own axes (axis=1;"),
    (lambda x: x - x.mean(axis=0), (2, 3, 4), "reduce only each row's own axes (axis=(1, 2);"),
    (lambda x: x - x.mean(axis=0), (3,), "leave this op out of the batched function: each row is one value"),
]


@pytest.mark.parametrize(("fn", "shape", "advice"), REDUCTION_ADVICE)
async def test_a_reduction_over_the_batch_axis_is_advised_the_axes_of_a_rows_own(
    anyio_backend: str, fn: Callable[[Any], Any], shape: tuple[int, ...], advice: str
) -> None:
    async with engine() as eng:
        with pytest.raises(ss.BatchError, match=re.escape(f"To batch, {advice}")):
            eng.compile(fn, batch_axis=0)(np.ones(shape))


async def test_an_op_of_a_function_of_schedsvcs_own_names_no_line_outside_it(anyio_backend: str) -> None:
    """The line shown is inside the traced function: for one whose file is schedsvc's own, none (not the
    line of whatever called the engine)."""
    path = os.path.join(os.path.dirname(ss.__file__), "_a_model.py")
    namespace: dict[str, Any] = {}
    exec(compile("def centred(x):\n    return x - x.mean(axis=0)\n", path, "exec"), namespace)
    async with engine() as eng:
        with pytest.raises(ss.BatchError) as info:
            eng.compile(namespace["centred"], batch_axis=0)(np.ones((2, 3)))
    assert "is made at" not in str(info.value)


async def test_an_op_that_mixes_rows_otherwise_is_advised_to_be_left_out(anyio_backend: str) -> None:
    async with engine() as eng:
        with pytest.raises(ss.BatchError, match=r"To batch, leave this op out of the batched function \("):
            eng.compile(lambda x: x.T @ x, batch_axis=0)(np.ones((2, 3)))


async def test_a_numpy_function_tensors_do_not_queue_is_advised_for_inside_a_compiled_function(
    anyio_backend: str,
) -> None:
    async with engine() as eng:
        f = eng.compile(lambda x: np.linalg.svd(x)[1])
        with pytest.raises(TypeError, match="inside a compiled function, compose it of operations") as info:
            await f(rows(2))
        assert "await the compiled call, then eng.submit(np.linalg.svd, ...) on its result" in str(info.value)


async def test_an_output_that_does_not_depend_on_the_rows_is_refused(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(lambda x: (x * 2, W1.sum(axis=0)), batch_axis=0)
        with pytest.raises(ss.BatchError, match="does not depend on the batched arguments"):
            f(rows(2))


async def test_a_call_without_rows_is_refused(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        with pytest.raises(ss.BatchError, match="no rows"):
            f(rows(0))
        with pytest.raises(ss.BatchError, match="batch axis 1"):
            eng.compile(np.tanh, batch_axis=1)(np.ones(3))  # a 1-D argument has no axis 1


async def test_a_call_from_another_thread_is_admitted_like_submit_nowait(anyio_backend: str) -> None:
    """A call is a task of its own, admitted like ``eng.submit_nowait``: from any thread."""
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        call = await anyio.to_thread.run_sync(f, rows(1))
        assert isinstance(call, ss.BatchCall)
        assert_same_bits(await within(call), mlp(rows(1)))


async def test_calls_after_close_are_refused(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
    with pytest.raises(ss.EngineClosed):
        f(rows(1))


async def test_closing_the_engine_completes_the_calls_it_accepted(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64)
        async with occupied(eng, 1):
            calls = [f(rows(1, 0)), f(rows(2, 1))]
    for seed, (n, c) in enumerate(zip((1, 2), calls, strict=True)):
        assert c.done()
        assert_rows_close(c.result(), mlp(rows(n, seed)))
    assert sizes(f) == {3: 1}


# -- when a batch is sent -------------------------------------------------------------------------------


async def test_a_lone_call_on_an_idle_engine_runs_at_once(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        for n in (2, 1):  # the engine is idle again once the first has finished
            x = rows(n, n)
            assert_same_bits(await within(f(x)), mlp(x))  # within TIMEOUT: no timer holds it
        assert sizes(f) == {2: 1, 1: 1}


async def test_max_delay_is_deprecated_and_changes_nothing(anyio_backend: str) -> None:
    async with engine() as eng:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            eng.compile(mlp, batch_axis=0)  # left out: no warning
        with pytest.warns(DeprecationWarning, match=r"max_delay=\.\.\.\) has no effect") as caught:
            f = eng.compile(mlp, batch_axis=0, max_delay=0.5)
        assert caught[0].filename == __file__  # pointed at the caller's line
        x = rows(1, 3)
        assert_same_bits(await within(f(x)), mlp(x))  # within TIMEOUT, far under the 0.5 s asked for
        with pytest.raises(ValueError, match="max_delay must be a non-negative number"):
            eng.compile(mlp, batch_axis=0, max_delay=-1)


async def test_a_batch_takes_at_most_max_batch_rows_of_the_calls_ready(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=4)
        xs = [rows(1, seed) for seed in range(8)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
            assert eng.stats().pending == 1 + len(xs)  # each call is a task of its own
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))
        assert sizes(f) == {4: 2}


async def test_no_batch_has_more_rows_than_max_batch(anyio_backend: str) -> None:
    counts = [3, 2, 4, 1, 2, 1, 3]
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=4)
        xs = [rows(n, seed) for seed, n in enumerate(counts)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))
        batch_sizes = sizes(f)
        assert max(batch_sizes) <= 4, batch_sizes
        assert sum(n * k for n, k in batch_sizes.items()) == sum(counts)


async def test_calls_that_are_not_a_full_batch_run_as_soon_as_a_worker_is_free(anyio_backend: str) -> None:
    """No call waits for more calls: the worker let go takes those that are ready, however few."""
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=64)
        xs = [rows(1, 0), rows(2, 1)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))
        assert sizes(f) == {3: 1}


async def test_calls_beyond_max_batch_form_the_next_batch(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        xs = [rows(1, seed) for seed in range(3)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))
        assert sizes(f) == {2: 1, 1: 1}


async def test_a_batch_waits_for_a_write_queued_to_its_tensor_argument(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(lambda v: v * 2.0, batch_axis=0, max_batch=4)
        t = eng.asarray(np.zeros((2, 3)))
        await within(t)
        async with occupied(eng, 1):
            t += 1.0  # a write queued behind the held task
            call = f(t)
        assert_same_bits(await within(call), np.full((2, 3), 2.0))


# -- batching keys: weights and static arguments ----------------------------------------------------------


def affine(x: Any, w: Any, b: Any) -> Any:
    return x @ w + b


async def test_weights_declared_unbatched_by_position_batch_when_the_same_object(anyio_backend: str) -> None:
    w, b = W1, B1
    w_equal = W1.copy()  # equal values, another object: another batch
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0, batched=[0], max_batch=2)
        xs = [rows(1, seed) for seed in range(4)]
        weights = [w, w_equal, w, w_equal]
        async with occupied(eng, 1):
            calls = [f(x, wi, b) for x, wi in zip(xs, weights, strict=True)]
        for x, wi, y in zip(xs, weights, await results(calls), strict=True):
            assert_rows_close(y, affine(x, wi, b))
        assert sizes(f) == {2: 2}  # {x0, x2} with w and {x1, x3} with its copy


async def test_weights_declared_unbatched_by_keyword(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0, batched=["x"], max_batch=3)
        xs = [rows(n, seed) for seed, n in enumerate([1, 2])]
        async with occupied(eng, 1):
            calls = [f(x=x, w=W1, b=B1) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, affine(x, W1, B1))
        assert sizes(f) == {3: 1}


def scaled(x: Any, *rest: Any, scale: float = 1.0, **options: Any) -> Any:
    return x * scale


async def test_batched_naming_no_parameter_is_refused_at_compile(anyio_backend: str) -> None:
    """Regression: batched=[5] for a function of three parameters was accepted, and every call failed with
    'called without a batched array argument'."""
    async with engine() as eng:
        for batched, match in [
            ([5], r"batched=\[5\]\): position 5 names no parameter: affine takes 3 positional \(x, w, b\)"),
            ([0, -1], "position -1 names no parameter"),
            (["z"], r"'z' is not a parameter of affine \(its keywords: x, w, b\)"),
        ]:
            with pytest.raises(ValueError, match=match):
                eng.compile(affine, batch_axis=0, batched=batched)
        f = eng.compile(
            scaled, batch_axis=0, batched=[5, "scale", "anything"]
        )  # *rest and **options take them
        assert f.batch_axis == 0
        g = eng.compile(affine, batch_axis=0, batched=[0, "x"])  # x, passed by position or by keyword
        assert_rows_close(await within(g(rows(2), W1, B1)), affine(rows(2), W1, B1))


async def test_different_weights_give_each_caller_its_own_weights(anyio_backend: str) -> None:
    """Four weights, one call each, one row each: whatever the batching, nobody gets another's weights."""
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0, batched=(0,), max_batch=4)
        ws = [W1 * k for k in (1.0, -1.0, 0.5, 2.0)]
        xs = [rows(1, seed) for seed in range(4)]
        async with occupied(eng, 1):
            calls = [f(x, w, B1) for x, w in zip(xs, ws, strict=True)]
        for x, w, y in zip(xs, ws, await results(calls), strict=True):
            assert_same_bits(y, affine(x, w, B1))
        assert sizes(f) == {1: 4}


async def test_static_arguments_are_part_of_the_batch_key(anyio_backend: str) -> None:
    def scaled(x: Any, scale: float) -> Any:
        return np.tanh(x * scale)

    async with engine() as eng:
        f = eng.compile(scaled, batch_axis=0, max_batch=2)
        xs = [rows(1, seed) for seed in range(4)]
        scales = [2.0, 3.0, 2.0, 3.0]
        async with occupied(eng, 1):
            calls = [f(x, s) for x, s in zip(xs, scales, strict=True)]
        for x, s, y in zip(xs, scales, await results(calls), strict=True):
            assert_same_bits(y, scaled(x, s))
        assert sizes(f) == {2: 2}


async def test_static_strings_are_part_of_the_batch_key(anyio_backend: str) -> None:
    def activated(x: Any, how: str) -> Any:
        return np.tanh(x) if how == "tanh" else np.sin(x)

    async with engine() as eng:
        f = eng.compile(activated, batch_axis=0, max_batch=2)
        hows = ["tanh", "sin", "sin", "tanh"]
        xs = [rows(1, seed) for seed in range(4)]
        async with occupied(eng, 1):
            calls = [f(x, how) for x, how in zip(xs, hows, strict=True)]
        for x, how, y in zip(xs, hows, await results(calls), strict=True):
            assert_same_bits(y, activated(x, how))
        assert sizes(f) == {2: 2}


async def test_by_default_every_array_argument_is_batched(anyio_backend: str) -> None:
    """Without ``batched=``, a weight passed as an argument is batched too: its rows must match x's."""
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0)
        with pytest.raises(ss.BatchError, match="disagree on their rows"):
            f(rows(2), W1, B1)


@pytest.mark.parametrize(
    "n",
    [2, 3],
)
async def test_a_batched_argument_on_the_right_of_a_matmul_is_refused(anyio_backend: str, n: int) -> None:
    """``x @ w`` with ``w`` batched too (square, n rows each): NumPy runs it, but it sums over w's rows."""
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0)
        with pytest.raises(ss.BatchError, match="matmul"):
            f(rows(n, 0, features=n), rows(n, 1, features=n), rows(n, 2, features=n))


async def test_a_function_whose_shapes_hold_only_at_its_own_row_count_is_refused(anyio_backend: str) -> None:
    """Row-wise at the call's 3 rows, but the weight's shape follows the rows: at more rows NumPy fails,
    which is a BatchError (the function cannot batch), not NumPy's ValueError."""

    def shaped_by_rows(x: Any) -> Any:
        return x @ np.ones((x.shape[0], 4))

    async with engine() as eng:
        f = eng.compile(shaped_by_rows, batch_axis=0)
        with pytest.raises(ss.BatchError, match=r"works with 3 rows .* but not with \d+") as info:
            f(rows(3, 0, features=3))
        assert isinstance(info.value.__cause__, ValueError)


# -- Tensors and Futures as arguments ---------------------------------------------------------------------


async def test_tensors_done_and_pending_are_arguments(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=6)
        x0, x1, x2 = rows(1, 0), rows(2, 1), rows(3, 2)
        done = eng.asarray(x0)
        await within(done)
        async with occupied(eng, 1):
            pending = eng.asarray(x1) * 2  # queued behind the held task
            calls = [f(done), f(pending), f(x2)]
        got = await results(calls)
        assert_rows_close(got[0], mlp(x0))
        assert_rows_close(got[1], mlp(x1 * 2))
        assert_rows_close(got[2], mlp(x2))


async def test_futures_done_and_pending_are_arguments(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=6)
        x0, x1, x2 = rows(1, 0), rows(2, 1), rows(3, 2)
        done = eng.submit_nowait(np.copy, x0)
        await within(done)
        gate = Gate()
        pending = eng.submit_nowait(gate.hold(lambda: x1.copy()))  # holds the only worker
        await gate.wait_started(1)
        calls = [f(done), f(pending), f(x2)]
        assert not calls[1].done()
        gate.open()
        got = await results(calls)
        for x, y in zip((x0, x1, x2), got, strict=True):
            assert_rows_close(y, mlp(x))


def broken() -> np.ndarray:
    raise ValueError("no rows today")


async def test_a_failed_future_argument_fails_the_call_with_dependency_error(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        failed = eng.submit_nowait(broken)
        with pytest.raises(ValueError):
            await within(failed)
        with pytest.raises(ss.DependencyError) as info:  # at the call, or at its await
            await within(f(failed))
        assert info.value.__cause__ is failed.exception()
        assert_same_bits(await within(f(rows(2))), mlp(rows(2)))  # the engine keeps serving


async def test_a_future_argument_that_fails_later_fails_only_its_call(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        gate = Gate()
        failing = eng.submit_nowait(gate.hold(broken))  # holds the only worker
        await gate.wait_started(1)
        doomed = f(failing)
        calls = [f(rows(1, 0)), f(rows(1, 1))]  # a full batch without it
        gate.open()
        with pytest.raises(ss.DependencyError) as info:
            await within(doomed)
        assert info.value.__cause__ is failing.exception()
        for seed, y in enumerate(await results(calls)):
            assert_rows_close(y, mlp(rows(1, seed)))
        assert sizes(f) == {2: 1}


async def test_a_function_that_captures_arrays_is_refused_on_a_gpu_with_what_to_do(
    anyio_backend: str,
) -> None:
    """A batch on a device takes its weights as arguments (here the CUDA simulator's cuda:0, or a real GPU);
    the same function with host rows runs on the host."""
    from ..devices.cuda_helpers import cuda_engine

    async with cuda_engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        on_gpu = eng.asarray(rows(2), device="cuda:0")
        with pytest.raises(ss.BatchError, match=r"cuda:0.*as Tensors on that device"):
            await within(f(on_gpu))
        assert_same_bits(await within(f(eng.asarray(rows(2)))), mlp(rows(2)))


# -- errors --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # so NumPy's invalid-value warning raises at replay
async def test_an_error_in_a_batch_fails_only_the_caller_whose_rows_raise_it(anyio_backend: str) -> None:
    """The batch is split until each caller has the outcome it would have had alone."""
    async with engine() as eng:
        f = eng.compile(np.log, batch_axis=0, max_batch=4)
        xs = [np.ones((1, F)), -np.ones((1, F)), np.full((1, F), 2.0), np.full((2, F), 3.0)]  # -1 has no log
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        with pytest.raises(RuntimeWarning) as info:
            await within(calls[1])
        assert calls[1].exception() is info.value
        for i in (0, 2, 3):
            assert_same_bits(await within(calls[i]), np.log(xs[i]))
            assert calls[i].exception() is None
        assert_same_bits(await within(f(np.ones((2, F)))), np.zeros((2, F)))  # the engine keeps serving


@pytest.mark.filterwarnings("error::RuntimeWarning")  # so NumPy's invalid-value warning raises at replay
async def test_a_batch_split_after_an_error_is_one_warning_on_schedsvc_compile(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Splitting replays the batch in parts: said once per batch (not per part, nor per caller)."""
    caplog.set_level(logging.DEBUG, logger="schedsvc")
    async with engine() as eng:
        f = eng.compile(np.log, batch_axis=0, max_batch=8)
        signs = [1.0, -1.0, 2.0, 3.0, -1.0]  # -1 has no log
        async with occupied(eng, 1):
            calls = [f(np.full((1, F), sign)) for sign in signs]
        for call in calls:
            await within(call.wait())
        assert [c.exception() is not None for c in calls] == [False, True, False, False, True]
    (split,) = [r for r in caplog.records if "split" in r.getMessage()]
    assert (split.name, split.levelno) == ("schedsvc.compile", logging.WARNING)
    said = split.getMessage()
    assert "a batch of 5 calls raised, and was split to give each caller its own outcome" in said
    assert "2 of the calls failed alone (the first: RuntimeWarning: " in said


@pytest.mark.filterwarnings("error::RuntimeWarning")
async def test_calls_run_apart_for_another_unbatched_array_are_not_said_to_be_split(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls of one key whose unbatched arrays are not the same object (an address reused) run one by one:
    no batch raised, so no split is said, though one of them fails alone."""
    caplog.set_level(logging.DEBUG, logger="schedsvc")
    async with engine() as eng:
        f = eng.compile(lambda x, w: np.log(x * w), batch_axis=0, batched=[0])
        w1, w2 = np.ones(F), np.ones(F)  # equal; w2 stands for an array at w1's reused address
        call = f(np.ones((1, F)), w1)
        await within(call)
        runs = [[np.ones((1, F)), w1], [np.full((1, F), -1.0), w2]]
        outcomes, _ = call.fusion.run([call, call], runs)
    assert [error is None for _, error in outcomes] == [True, False]
    assert not [r for r in caplog.records if "split" in r.getMessage()]


# -- cancellation -------------------------------------------------------------------------------------------


async def test_a_call_cancelled_before_it_runs_is_left_out_of_the_batch(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=3)
        xs = [rows(1, seed) for seed in range(4)]
        async with occupied(eng, 1):
            a, b = f(xs[0]), f(xs[1])
            assert b.cancel()
            assert b.cancelled() and b.done()
            c, d = f(xs[2]), f(xs[3])
            assert eng.stats().pending == 4  # the held task and a, c, d
        for x, y in zip((xs[0], xs[2], xs[3]), await results([a, c, d]), strict=True):
            assert_rows_close(y, mlp(x))
        with pytest.raises(cancelled_error()):
            await within(b)
        assert b.cancel()  # still cancelled (as Future.cancel says)
        assert sizes(f) == {3: 1}


async def test_a_call_cancelled_while_queued_behind_a_busy_worker_leaves_the_batch(
    anyio_backend: str,
) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=3)
        xs = [rows(1, seed) for seed in range(3)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
            await state(eng, lambda: eng.stats().pending == 4)
            assert calls[1].cancel()
            assert calls[1].cancelled()
        got = await results([calls[0], calls[2]])
        assert_rows_close(got[0], mlp(xs[0]))
        assert_rows_close(got[1], mlp(xs[2]))
        with pytest.raises(cancelled_error()):
            await within(calls[1])
        assert f.stats()["batches"] == 1


async def test_cancelled_calls_never_run(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        async with occupied(eng, 1) as (_, held):
            calls = [f(rows(1, 0)), f(rows(1, 1))]
            await state(eng, lambda: eng.stats().pending == 3)
            assert all(c.cancel() for c in calls)
            await state(eng, lambda: eng.stats().pending == 1)
        await within(held[0])
        for c in calls:
            with pytest.raises(cancelled_error()):
                await within(c)
        s = eng.stats()
        assert (s.cancelled, s.completed) == (2, 1)  # the calls never ran; the held task did
        assert f.stats()["batches"] == 0


async def test_a_call_cancelled_while_its_future_argument_is_pending_never_joins_a_batch(
    anyio_backend: str,
) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        gate = Gate()
        source = eng.submit_nowait(gate.hold(lambda: rows(2)))
        await gate.wait_started(1)
        call = f(source)
        assert call.cancel() and call.cancelled()
        gate.open()
        assert_same_bits(await within(source), rows(2))  # the argument's task is not cancelled with it
        await within(eng.waitall())
        assert sizes(f) == {} and f.stats()["batches"] == 0


async def test_a_done_call_cannot_be_cancelled(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0)
        call = f(rows(2))
        y = await within(call)
        assert not call.cancel()
        assert not call.cancelled()
        assert_same_bits(y, mlp(rows(2)))


async def test_cancelling_the_awaiting_coroutine_cancels_the_call(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=3)
        async with occupied(eng, 1):
            kept = f(rows(1, 0))
            given_up = f(rows(1, 1))
            with anyio.CancelScope() as scope:
                scope.cancel()
                await given_up
            assert scope.cancelled_caught
            assert given_up.cancelled()
            last = [f(rows(1, 2)), f(rows(1, 3))]  # fill the batch the cancelled call left
        got = await results([kept, *last])
        for seed, y in zip((0, 2, 3), got, strict=True):
            assert_rows_close(y, mlp(rows(1, seed)))
        assert sizes(f) == {3: 1}


# -- backpressure ---------------------------------------------------------------------------------------


async def test_each_call_is_one_task_for_max_pending(anyio_backend: str) -> None:
    async with engine(max_pending=4) as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=6)
        xs = [rows(2, seed) for seed in range(3)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
            assert eng.stats().pending == 4
            with pytest.raises(ss.QueueFull):
                f(rows(2, 3))
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))
        assert sizes(f) == {6: 1}


async def test_at_max_pending_a_call_raises_queue_full_and_submit_waits(anyio_backend: str) -> None:
    async with engine(max_pending=2) as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        xs = [rows(1, seed) for seed in range(3)]
        async with occupied(eng, 1) as (gate, _):
            calls = [f(xs[0])]
            with pytest.raises(ss.QueueFull, match=r"fn\.submit"):
                f(xs[1])
            waiter = Background()
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter.run, f.submit, xs[1])
                await state(eng, lambda: eng.stats().waiting_admission == 1)
                assert not waiter.finished.is_set()  # waiting for room
                gate.open()
                with anyio.fail_after(TIMEOUT):
                    await waiter.finished.wait()
            assert isinstance(waiter.value, ss.BatchCall)
            calls.append(waiter.value)
            calls.append(await within(f.submit(xs[2])))
        for x, y in zip(xs, await results(calls), strict=True):
            assert_rows_close(y, mlp(x))


async def test_a_batch_holds_the_bytes_of_its_rows(anyio_backend: str) -> None:
    """The bytes the calls hold while they wait are those their unbatched calls would hold one by one."""
    xs = [rows(2, seed) for seed in range(3)]
    async with engine() as eng:
        plain = eng.compile(mlp)
        alone = []
        for x in xs:
            async with occupied(eng, 1):
                before = eng.stats().pending_bytes
                out = plain(x)
                alone.append(eng.stats().pending_bytes - before)
            await within(out)
        f = eng.compile(mlp, batch_axis=0, max_batch=6)
        async with occupied(eng, 1):
            before = eng.stats().pending_bytes
            calls = [f(x) for x in xs]
            held = eng.stats().pending_bytes - before
        await results(calls)
    assert held == sum(alone), (held, alone)
    assert held >= sum(mlp(x).nbytes for x in xs)


async def submitted_while_busy(eng: ss.Engine, f: Any, xs: list[Any], waiting: int) -> list[Any]:
    """``await f.submit(x)`` for each of ``xs`` at once while a worker is held, until ``waiting`` of them wait
    for admission; the calls, once every submission got in."""
    calls: list[Any] = [None] * len(xs)

    async def call(i: int) -> None:
        calls[i] = await f.submit(xs[i])

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg, occupied(eng, 1):
            for i in range(len(xs)):
                tg.start_soon(call, i)
            await state(eng, lambda: eng.stats().waiting_admission == waiting)
    return calls


async def test_calls_that_fit_max_pending_bytes_one_by_one_are_not_failed_by_batching(
    anyio_backend: str,
) -> None:
    """Each call holds 2 KiB (1 KiB in, 1 KiB out) of a 4 KiB budget: alone it runs.  Four of them made while
    the engine is busy wait for room one by one, as any task does, and never fail together."""
    async with engine(max_pending_bytes=4096) as eng:
        f = eng.compile(np.negative, batch_axis=0, max_batch=64)
        xs = [rows(8, seed, features=16) for seed in range(4)]
        assert_same_bits(await within(f(xs[0])), -xs[0])
        calls = await submitted_while_busy(eng, f, xs, waiting=2)
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, -x)
        assert eng.stats().peak_pending_bytes <= 4096


# -- stats and trace -------------------------------------------------------------------------------------


async def test_stats_count_batches_rows_and_sizes_per_function_and_engine(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=4)
        g = eng.compile(np.tanh, batch_axis=0, max_batch=3)
        assert f.stats()["batches"] == 0 and f.stats()["rows"] == 0 and sizes(f) == {}
        await within(f(rows(2)))  # alone: the engine was idle
        async with occupied(eng, 1):
            calls = [f(rows(1, i)) for i in range(4)] + [g(rows(1, i)) for i in range(3)]
        await results(calls)
        assert (f.stats()["batches"], f.stats()["rows"], sizes(f)) == (2, 6, {2: 1, 4: 1})
        assert (g.stats()["batches"], g.stats()["rows"], sizes(g)) == (1, 3, {3: 1})
        s = eng.stats()
        assert (s.batches, s.batch_rows, dict(s.batch_sizes)) == (3, 9, {2: 1, 4: 1, 3: 1})


async def test_the_trace_shows_a_batch_span_with_its_callers(anyio_backend: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=6)
        with eng.trace(path):
            async with occupied(eng, 1):
                calls = [f(rows(n, n)) for n in (1, 2, 3)]
            await results(calls)
    events = json.loads(path.read_text())["traceEvents"]
    (span,) = [e for e in events if e.get("ph") == "X" and e["name"] == "batch:mlp"]
    assert span["args"]["calls"] == 3
    assert span["args"]["rows"] == 6
    assert span["args"]["callers"] == [c.number for c in calls]  # the callers, in order


async def test_in_sync_mode_a_call_runs_at_once_in_the_caller(anyio_backend: str) -> None:
    async with started(sync_mode=True) as eng:
        f = eng.compile(mlp, batch_axis=0)
        call = f(rows(2))
        assert call.done()
        assert_same_bits(await within(call), mlp(rows(2)))
        assert sizes(f) == {2: 1}


# -- BatchCall from threads -------------------------------------------------------------------------------


async def test_result_and_exception_from_another_thread(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        async with occupied(eng, 1) as (gate, _):
            calls = [f(rows(1, 0)), f(rows(1, 1))]
            seen: list[Any] = []

            def in_a_thread() -> None:
                seen.append(calls[0].result(timeout=TIMEOUT))

            thread = threading.Thread(target=in_a_thread)
            thread.start()
            gate.open()
            await anyio.to_thread.run_sync(thread.join, TIMEOUT)
        assert_rows_close(seen[0], mlp(rows(1, 0)))
        assert calls[0].exception() is None
        assert_rows_close(await within(calls[1]), mlp(rows(1, 1)))


# -- each call is a task from the moment it is made --------------------------------------------------------


async def test_a_write_submitted_after_a_call_waits_for_it(anyio_backend: str) -> None:
    """The call reads its array at the call: a write submitted after it, while the engine is busy, runs
    after it, so the call sees the array as it was (sequential consistency)."""
    async with engine() as eng:
        f = eng.compile(lambda v: v * 2.0, batch_axis=0)
        x = np.ones((2, 3))
        async with occupied(eng, 1):
            call = f(x)
            write = eng.submit_nowait(np.copyto, x, 5.0, writes=[x])
        await within(write)
        assert_same_bits(await within(call), np.full((2, 3), 2.0))
        assert_same_bits(x, np.full((2, 3), 5.0))


async def test_a_write_to_a_tensor_after_a_call_waits_for_it(anyio_backend: str) -> None:
    async with engine() as eng:
        f = eng.compile(lambda v: v * 2.0, batch_axis=0)
        t = eng.asarray(np.zeros((2, 3)))
        await within(t)
        async with occupied(eng, 1):
            call = f(t)
            t += 1.0  # queued behind the held task, after the call
        assert_same_bits(await within(call), np.zeros((2, 3)))
        assert_same_bits(await within(t), np.ones((2, 3)))


async def test_calls_that_waited_for_room_leave_no_refusal_behind(anyio_backend: str) -> None:
    """Calls admitted after waiting for room (``await fn.submit``) once the engine is idle again: a call
    is admitted at once, as a task would be."""
    async with engine(max_pending=1) as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        xs = [rows(1, seed) for seed in range(3)]
        calls = await submitted_while_busy(eng, f, xs, waiting=len(xs))
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, mlp(x))
        await within(eng.waitall())
        assert eng.stats().pending == 0
        assert_same_bits(await within(f(xs[0])), mlp(xs[0]))  # not QueueFull: the engine is idle


async def test_traced_plans_are_bounded_by_max_signatures(anyio_backend: str) -> None:
    """Calls whose unbatched weights are new arrays each time (same shape): plans are kept by shape, as the
    signature cache keys them, never by the arrays' addresses, and at most ``max_signatures`` of them."""
    async with engine() as eng:
        f = eng.compile(affine, batch_axis=0, batched=[0], max_signatures=4)
        weights = []  # kept alive: no address is reused
        for i in range(40):
            x = rows(1 + i % 3, i)
            w = W1 * (1.0 + i)  # a new array each call
            weights.append(w)
            assert_rows_close(
                await within(f(x, w, B1)), affine(x, w, B1)
            )  # (a call of 3 rows runs padded to 4)
            assert f.stats()["plans"] <= 4, f.stats()
        assert f.stats()["signatures"] <= 4


async def test_calls_cancelled_while_waiting_for_room_leave_no_refusal_behind(anyio_backend: str) -> None:
    """Calls given up while they waited for room (their awaiting coroutines cancelled) leave the engine's
    admission as it was: on the idle engine a call is admitted at once."""
    async with engine(max_pending=1) as eng:
        f = eng.compile(mlp, batch_axis=0, max_batch=2)
        xs = [rows(1, seed) for seed in range(3)]
        async with occupied(eng, 1) as (_, held):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(f.submit, xs[0])
                    tg.start_soon(f.submit, xs[1])
                    await state(eng, lambda: eng.stats().waiting_admission == 2)
                    scope.cancel()
        await within(held[0])
        await within(eng.waitall())
        assert (eng.stats().pending, eng.stats().waiting_admission) == (0, 0)
        assert_same_bits(await within(f(xs[2])), mlp(xs[2]))
        assert sizes(f) == {1: 1}


async def test_a_tensor_of_another_engine_is_refused_at_the_call(anyio_backend: str) -> None:
    async with engine() as eng, engine() as other:
        f = eng.compile(mlp, batch_axis=0)
        theirs = other.asarray(rows(2))
        with pytest.raises(ss.InvalidTask, match="another engine"):
            f(theirs)
        assert eng.stats().submitted == 0


# -- functions that read the number of rows are refused ------------------------------------------------------

ROW_COUNTING: list[tuple[str, Callable[[Any], Any], int, str]] = [
    ("divided by x.shape[0]", lambda x: x / x.shape[0], 2, "divide"),
    ("times len(x)", lambda x: x * len(x), 2, "multiply"),
    ("divided by x.size", lambda x: x / x.size, 3, "divide"),
    ("a branch on the row count", lambda x: x * 2.0 if x.shape[0] > 1 else x, 1, "other operations"),
    ("another axis cut at the row count", lambda x: x[:, : x.shape[0]], 2, "getitem"),
    ("rows moved across the batch axis", lambda x: x.reshape(x.shape[0] * 2, -1), 2, "reshape"),
]


@pytest.mark.parametrize(
    ("fn", "n", "named"), [c[1:] for c in ROW_COUNTING], ids=[c[0] for c in ROW_COUNTING]
)
async def test_a_function_that_reads_the_number_of_rows_is_refused_at_the_first_call(
    anyio_backend: str, fn: Callable[[Any], Any], n: int, named: str
) -> None:
    """Its result would depend on how many rows its batch holds: refused, naming what differs."""
    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0)
        with pytest.raises(ss.BatchError, match=named):
            f(rows(n, features=6))
        assert eng.stats().submitted == 0


async def test_a_program_that_changes_at_a_batch_size_runs_its_calls_alone_there(anyio_backend: str) -> None:
    """A branch on the row count that the first call's two traces do not reach (4 and many rows take the
    same side) is found when a batch's size does: that batch is split, each caller gets fn(its rows)."""

    def fn(x: Any) -> Any:
        return x * 2.0 if x.shape[0] >= 4 else x * 3.0

    async with engine() as eng:
        f = eng.compile(fn, batch_axis=0, max_batch=8)
        x4 = rows(4, 9, features=3)
        assert_same_bits(await within(f(x4)), fn(x4))
        xs = [rows(1, seed, features=3) for seed in range(2)]
        async with occupied(eng, 1):
            calls = [f(x) for x in xs]
        for x, y in zip(xs, await results(calls), strict=True):
            assert_same_bits(y, fn(x))  # x * 3.0: what fn gives one row, not the two-row batch's x * 2.0
        assert sizes(f) == {4: 1, 1: 2}
