"""Shared fixtures: a running engine, a clean environment, and a check that no thread outlives its test."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

import schedsvc as ss


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the test, never from SCHEDSVC_* variables of the shell that runs pytest."""
    for key in list(os.environ):
        if key.startswith("SCHEDSVC_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _no_thread_left() -> Iterator[None]:
    """Every engine a test starts must have joined its threads by the end of the test."""
    yield
    leaked = [t.name for t in threading.enumerate() if t.name.startswith("schedsvc-")]
    assert not leaked, f"threads still alive after the test: {leaked}"


@pytest.fixture
async def engine() -> AsyncIterator[ss.Engine]:
    async with ss.Engine(cpu_workers=2) as eng:
        yield eng
