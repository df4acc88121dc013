"""What a user's program sees of schedsvc under ``mypy --strict``: each ``reveal_type`` line ends with the
type it must reveal (module paths left out).  Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

from typing import cast, reveal_type

import numpy as np

import schedsvc as ss


def square(x: int) -> int:
    return x * x


def layer(x: ss.Tensor, w: ss.Tensor) -> ss.Tensor:
    # NumPy's stubs type a ufunc on a Tensor (ndarray | Any): the Tensor it gives is cast back
    return cast(ss.Tensor, np.maximum(x @ w, 0))


async def main(eng: ss.Engine) -> None:
    x = eng.asarray(np.ones((2, 3)))
    w = eng.ones((3, 4))
    a = np.ones((3, 4))
    reveal_type(x @ w)  # Tensor
    reveal_type(x @ a)  # Tensor
    reveal_type(x + 1)  # Tensor
    reveal_type(2.0 * x)  # Tensor
    reveal_type(1 - x)  # Tensor
    reveal_type(x / np.float64(2))  # Tensor
    reveal_type(x**2)  # Tensor
    reveal_type(-x)  # Tensor
    reveal_type(abs(x))  # Tensor
    reveal_type(x == 1)  # Tensor
    reveal_type(x < w.sum())  # Tensor
    reveal_type(x.sum(axis=0))  # Tensor
    reveal_type(x.mean())  # Tensor
    reveal_type(x.T)  # Tensor
    reveal_type(x[0])  # Tensor
    reveal_type(x.reshape(3, 2).astype(np.float32))  # Tensor
    for row in x:
        reveal_type(row)  # Tensor
    x += 1
    reveal_type(x)  # Tensor
    reveal_type(x.shape)  # tuple[int, ...]
    reveal_type(await x)  # ndarray[Any, Any]
    reveal_type(await (x @ w).max())  # ndarray[Any, Any]

    mlp = eng.compile(layer)
    reveal_type(mlp)  # Compiled[[x: Tensor, w: Tensor], Tensor]
    reveal_type(mlp(x, w))  # Tensor
    reveal_type(await mlp(x, w))  # ndarray[Any, Any]
    reveal_type(await mlp.submit(x, w))  # Tensor
    reveal_type(ss.load("mlp.json", eng))  # Compiled[..., Any]
    rows = eng.compile(layer, batch_axis=0)
    reveal_type(rows)  # Batched[[x: Tensor, w: Tensor], ndarray[Any, Any]]
    reveal_type(rows(x, w))  # BatchCall[ndarray[Any, Any]]
    reveal_type(await rows(x, w))  # ndarray[Any, Any]
    reveal_type(await rows.submit(x, w))  # BatchCall[ndarray[Any, Any]]

    fut = await eng.submit(square, 3)
    reveal_type(fut)  # Future[int]
    reveal_type(await fut)  # int
    reveal_type(fut.result())  # int
    reveal_type(eng.submit_nowait(square, 4))  # Future[int]
    reveal_type(await eng.run(square, 5))  # int
    try:
        await fut
    except ss.TaskCancelled as cancelled:
        reveal_type(cancelled)  # TaskCancelled
