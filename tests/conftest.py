"""Shared fixtures: a running engine, a clean environment, and a check that no thread outlives its test."""

from __future__ import annotations

import importlib.util
import inspect
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

import schedsvc as ss

#: Without trio (the trio extra; a GPU machine may lack it), its modules are not collected: they import it.
collect_ignore = [] if importlib.util.find_spec("trio") else ["test_trio.py", "test_trio_review.py"]


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pycollect_makeitem(collector: Any, name: str, obj: object) -> Iterator[None]:
    """Which async library runs each coroutine test: trio (anyio's plugin) for the ``anyio_backend="trio"``
    parameter of the tests run on both libraries, else asyncio (pytest-asyncio, in its strict mode, which
    lets two plugins share a suite).  Runs inside pytest-asyncio's own hook, before it looks for the mark."""
    outcome: Any = yield
    items = outcome.get_result()
    for item in items if isinstance(items, list) else [items] if items else []:
        if not isinstance(item, pytest.Function):
            continue
        hypothesis = getattr(item.obj, "hypothesis", None)  # a @given test: its inner test is the coroutine
        if not inspect.iscoroutinefunction(getattr(hypothesis, "inner_test", item.obj)):
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("anyio_backend") == "trio":
            item.add_marker("anyio")
        elif item.get_closest_marker("anyio") is None:
            item.add_marker("asyncio")


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


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[ss.Engine]:
    async with ss.Engine(cpu_workers=2) as eng:
        yield eng


def start_local_cluster(**config: Any) -> Any:
    """A LocalCluster of 2 single-threaded worker processes on 127.0.0.1 (``config``: dask settings)."""
    distributed = pytest.importorskip("distributed")
    import dask

    with dask.config.set(config):  # read by the scheduler as it starts
        return distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
        )


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    """The scheduler address of a Dask cluster shared by a module's tests.

    Per module, not per session: the cluster's threads must not outlive the modules that
    use it (tests elsewhere measure this process's memory with tracemalloc).
    """
    cluster = start_local_cluster()
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@pytest.fixture(params=["threads", pytest.param("dask", marks=pytest.mark.dask)])
def backend_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Engine options for each backend: threads, and Dask on the shared local cluster."""
    if request.param == "threads":
        return {"backend": "threads", "cpu_workers": 2}
    address = request.getfixturevalue("dask_address")
    return {"backend": "dask", "dask_address": address, "cpu_workers": 2}
