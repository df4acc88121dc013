"""Mistakes ``mypy --strict`` must find in a user's program: each line marked ``# error: CODE`` must give that
error code.  Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

import asyncio

import numpy as np

import schedsvc as ss


def layer(x: ss.Tensor, w: ss.Tensor) -> ss.Tensor:
    return x @ w


def pair(x: ss.Tensor) -> tuple[ss.Tensor, ss.Tensor]:
    return x, x


def mean(x: ss.Tensor) -> float:
    return 0.0


def square(x: int) -> int:
    return x * x


def scale(x: int, factor: float = 2.0) -> float:
    return x * factor


async def main(eng: ss.Engine) -> None:
    x = eng.asarray(np.ones((2, 3)))
    mlp = eng.compile(layer)
    mlp(x)  # error: call-arg
    mlp(x, "w")  # error: arg-type
    x + "a"  # error: operator
    rows = eng.compile(layer, batch_axis=0)
    rows(x, "w")  # error: arg-type
    out: ss.Tensor = await mlp(x, x)  # error: assignment
    fut = await eng.submit(len, [1, 2])
    n: str = await fut  # error: assignment
    print(out, n)
    eng.submit_nowait(square)  # error: arg-type
    eng.submit_nowait(square, "3")  # error: arg-type
    eng.submit_nowait(square, 1, 2)  # error: arg-type
    eng.submit_nowait(scale, "1", factor=3.0)  # error: arg-type
    await eng.run(scale, 1, "3")  # error: arg-type
    eng.submit_nowait(square, "3", name="sq")  # error: arg-type
    await eng.run(square, "3", device="cpu")  # error: arg-type
    eng.executor().submit(square, "3")  # error: arg-type
    await eng.compile(pair)(x)  # error: misc
    eng.compile(mean)  # error: arg-type
    done, _ = await asyncio.wait([fut])
    text: str = done.pop().result()  # error: assignment
    print(text)
