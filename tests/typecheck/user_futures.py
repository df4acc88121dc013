"""Submitting functions, and futures in asyncio's functions, under ``mypy --strict``: arguments are
checked against the function's parameters (a future of an argument's type is a dependency, and fits).
Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

import asyncio
import functools
from typing import reveal_type

import numpy as np
import numpy.typing as npt

import schedsvc as ss


def square(x: int) -> int:
    return x * x


def scale(x: int, factor: float = 2.0) -> float:
    return x * factor


def total(a: npt.NDArray[np.float64]) -> float:
    return float(a.sum())


async def main(eng: ss.Engine) -> None:
    a = await eng.submit(square, 3)
    b = await eng.submit(square, a)
    reveal_type(b)  # Future[int]
    reveal_type(await eng.submit(scale, b, 3.0, priority=1, name="scaled"))  # Future[float]
    reveal_type(eng.submit_nowait(scale, 1, factor=3.0))  # Future[float]
    reveal_type(await eng.submit(functools.partial(scale, factor=3.0), 1, device="cpu"))  # Future[float]
    reveal_type(await eng.submit(scale, b, factor=3.0, device="cpu"))  # Future[float]
    t = eng.asarray(np.zeros(3))
    reveal_type(await eng.submit(np.add, t, 1.0, out=t, name="add"))  # Future[Any]
    reveal_type(await eng.submit(total, eng.ones((2, 2))))  # Future[float]
    product = await eng.submit(np.dot, np.ones((2, 2)), np.ones((2, 2)))  # NumPy types it Any
    reveal_type(await eng.submit(total, product))  # Future[float]
    reveal_type(await eng.run(square, a, priority=2))  # int
    reveal_type(await eng.submit(len, [1, 2]))  # Future[int]
    reveal_type(await eng.submit(lambda: "made"))  # Future[str]

    done, pending = await asyncio.wait([a, b])
    reveal_type(done)  # set[Future[int]]
    reveal_type(pending)  # set[Future[int]]
    reveal_type(await asyncio.gather(a, eng.submit_nowait(scale, 2)))  # tuple[int, float]
    for first in asyncio.as_completed([a, b]):
        reveal_type(await first)  # int
    reveal_type(await asyncio.wait_for(a, timeout=1.0))  # int
    reveal_type(await asyncio.shield(b))  # int

    with eng.executor() as pool:
        reveal_type(pool.submit(scale, 2, factor=0.5))  # ExecutorFuture[float]
        reveal_type(await asyncio.wrap_future(pool.submit(square, 2)))  # int
        reveal_type(await eng.submit(square, pool.submit(square, 3)))  # Future[int]
