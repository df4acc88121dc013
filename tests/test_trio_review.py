"""Review of the trio bridge (issue 18): each test here failed before its fix."""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import numpy as np
import pytest
import trio

import schedsvc as ss
from tests.helpers import TIMEOUT, Gate, state, within


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def engine(**options: Any) -> ss.Engine:
    return ss.Engine(cpu_workers=2, inline_threshold_us=0, **options)


async def test_an_unordered_map_left_early_reports_no_error_for_its_tasks_finishing_later(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Any] = []
    async with engine() as eng:
        if anyio_backend == "asyncio":
            import asyncio

            asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        opened, started = threading.Event(), threading.Semaphore(0)

        def held(x: int) -> int:
            if x:
                started.release()
                assert opened.wait(TIMEOUT)
            return x

        results = eng.map(held, range(4), max_inflight=3, ordered=False)
        assert await within(results.__anext__()) == 0
        for _ in range(2):  # two more run, held: they cannot be cancelled
            assert await anyio.to_thread.run_sync(started.acquire, True, TIMEOUT)
        await results.aclose()
        opened.set()
        await within(eng.waitall())
        await state(eng, lambda: eng.stats().pending == 0)
    errors += [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
