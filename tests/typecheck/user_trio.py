"""An engine under trio with ``mypy --strict`` (the guide's program, with its types).  Checked by
``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

from typing import reveal_type

import numpy as np
import numpy.typing as npt
import trio

import schedsvc as ss


def negate(x: int) -> int:
    return -x


def dot(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return a @ b


async def main() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        fut = await eng.submit(dot, np.ones((200, 200)), np.ones(200))
        reveal_type(await fut)  # ndarray[tuple[Any, ...], dtype[float64]]
        reveal_type([v async for v in eng.map(negate, [1, 2, 3])])  # list[int]
        with trio.move_on_after(0.5):
            reveal_type(await eng.run(len, [1, 2]))  # int
        async with trio.open_nursery() as nursery:
            nursery.start_soon(eng.waitall)
        reveal_type(await eng.asarray(np.ones(3)).sum())  # ndarray[Any, Any]


trio.run(main)
