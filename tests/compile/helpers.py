"""Shared checks for compile tests: bit-for-bit comparison and awaiting whatever a call returned."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from ..helpers import Gate, started, within
from ..helpers import occupied as _occupied


def assert_same_bits(got: Any, want: Any, what: str = "result") -> None:
    """Equal as NumPy would hold them: same dtype, same shape, same bytes (so -0.0 != 0.0, NaN == NaN)."""
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert got_a.dtype == want_a.dtype, f"{what}: dtype {got_a.dtype} != {want_a.dtype}"
    assert got_a.shape == want_a.shape, f"{what}: shape {got_a.shape} != {want_a.shape}"
    assert np.array_equal(got_a, want_a, equal_nan=got_a.dtype.kind in "fc"), f"{what}: {got_a} != {want_a}"
    assert got_a.tobytes() == want_a.tobytes(), f"{what}: bits differ: {got_a!r} vs {want_a!r}"


def rows_tolerance(dtype: Any) -> float:
    """The relative tolerance a batched result in the default (fast) mode holds to: a row computed in a
    many-row product is rounded otherwise than in a one-row one, in the last bits of the dtype."""
    return 1e-5 if np.dtype(dtype).itemsize <= 4 else 1e-12


def assert_rows_close(got: Any, want: Any, what: str = "result") -> None:
    """Equal as the default (fast) batching promises: same dtype, same shape, values equal within rounding
    (relative to the largest value, as a product's rounding error scales with its terms)."""
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert got_a.dtype == want_a.dtype, f"{what}: dtype {got_a.dtype} != {want_a.dtype}"
    assert got_a.shape == want_a.shape, f"{what}: shape {got_a.shape} != {want_a.shape}"
    if got_a.dtype.kind not in "fc":
        assert np.array_equal(got_a, want_a), f"{what}: {got_a} != {want_a}"
        return
    rtol = rows_tolerance(got_a.dtype)
    scale = float(np.max(np.abs(want_a), initial=0.0, where=np.isfinite(want_a)))
    np.testing.assert_allclose(got_a, want_a, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=what)


async def values(result: Any) -> list[Any]:
    """The awaited value(s) of a compiled or eager call: one Tensor, or a tuple/list of them."""
    if isinstance(result, tuple | list):
        return [await within(t) for t in result]
    assert isinstance(result, ss.Tensor), f"expected a Tensor, got {type(result).__name__}"
    return [await within(result)]


async def assert_matches_eager(fn: Any, compiled: ss.Compiled, *args: Any) -> None:
    """``compiled(*args)`` equals ``fn(*args)`` run eagerly, bit for bit, output by output."""
    got = await values(compiled(*args))
    want = await values(fn(*args))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_bits(g, w, f"output {i}")


@pytest.fixture(params=["asyncio", "trio"])
def both_backends(request: pytest.FixtureRequest) -> str:
    """Use as ``anyio_backend = both_backends`` in a module: its anyio tests run under asyncio and trio."""
    return str(request.param)


@asynccontextmanager
async def batching_engine(**options: Any) -> AsyncIterator[ss.Engine]:
    """One worker (held busy by ``occupied``), and awaited tasks never run inline in the awaiting coroutine."""
    async with started(cpu_workers=1, inline_threshold_us=0, **options) as eng:
        yield eng


@asynccontextmanager
async def occupied(eng: ss.Engine, n: int) -> AsyncIterator[tuple[Gate, list[ss.Future[Any]]]]:
    """Hold ``n`` workers busy until the block exits; the calls made meanwhile are all handed to the
    workers' queue first (none held back for the end of the coroutine's turn), so the first worker let go
    finds them ready together and runs them as one batch."""
    async with _occupied(eng, n) as held:
        try:
            yield held
        finally:
            rt = eng._rt
            assert rt is not None
            rt.flush()
