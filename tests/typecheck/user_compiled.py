"""What a call of a compiled function is, by what the function returns (as at run time: a Tensor for a
Tensor or a NumPy array, a tuple or list of Tensors for a tuple or list; batched, NumPy arrays the same way).
Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

import asyncio
from typing import Any, reveal_type

import numpy as np
import numpy.typing as npt

import schedsvc as ss

Floats = npt.NDArray[np.float64]


def forward(x: Floats) -> Floats:
    return x * 2.0


def pair(x: ss.Tensor) -> tuple[ss.Tensor, ss.Tensor]:
    return x + 1, x * 2


def halves(x: Floats) -> tuple[Floats, Floats]:
    return x[:1], x[1:]


def parts(x: ss.Tensor) -> list[ss.Tensor]:
    return [x + 1, x - 1]


def loss(x: ss.Tensor) -> ss.Tensor:
    return (x * x).sum()  # a 0-d Tensor


async def main(eng: ss.Engine, host: Floats, x: ss.Tensor) -> None:
    fwd = eng.compile(forward)
    reveal_type(fwd(host))  # Tensor
    reveal_type(await fwd(host))  # ndarray[Any, Any]
    reveal_type(await fwd.submit(host))  # Tensor
    reveal_type(await eng.compile(loss)(x))  # ndarray[Any, Any]
    two = eng.compile(pair)
    reveal_type(two(x))  # tuple[Tensor, Tensor]
    first, second = two(x)
    reveal_type(await asyncio.gather(first, second))  # tuple[ndarray[Any, Any], ndarray[Any, Any]]
    reveal_type(eng.compile(halves)(host))  # tuple[Tensor, ...]
    reveal_type(eng.compile(parts)(x))  # list[Tensor]
    rows = eng.compile(forward, batch_axis=0, max_batch=64)
    reveal_type(rows)  # Batched[[x: ndarray[tuple[Any, ...], dtype[float64]]], ndarray[Any, Any]]
    reveal_type(await rows(host))  # ndarray[Any, Any]
    reveal_type(rows(host).result(timeout=1.0))  # ndarray[Any, Any]
    reveal_type(await eng.compile(pair, batch_axis=0)(x))  # tuple[ndarray[Any, Any], ...]
    reveal_type(await eng.compile(parts, batch_axis=0, exact=True)(x))  # list[ndarray[Any, Any]]
    anything: Any = forward
    reveal_type(eng.compile(anything))  # Compiled[Any, Any]
