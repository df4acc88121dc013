"""Mistakes ``mypy --strict`` must find in a user's program: each line marked ``# error: CODE`` must give that
error code.  Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

import numpy as np

import schedsvc as ss


def layer(x: ss.Tensor, w: ss.Tensor) -> ss.Tensor:
    return x @ w


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
