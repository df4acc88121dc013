"""A pipeline of ``eng.map`` stages under ``mypy --strict``: each stage's items are typed by its function.
Checked by ``tests/typecheck/test_typing.py``, never run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import reveal_type

import schedsvc as ss


def parse(line: str) -> int:
    return int(line)


def square(x: int) -> int:
    return x * x


async def lines() -> AsyncIterator[str]:
    for line in ("1", "2", "3"):
        yield line


async def main(eng: ss.Engine) -> int:
    parsed = eng.map(parse, lines(), max_inflight=8)
    reveal_type(parsed)  # AsyncGenerator[int, None]
    total = 0
    async for value in eng.map(square, parsed, ordered=False, priority=1):
        reveal_type(value)  # int
        total += value
    futures = [eng.submit_nowait(square, n) for n in range(3)]
    reveal_type([v async for v in eng.map(square, futures)])  # list[int]
    return total
