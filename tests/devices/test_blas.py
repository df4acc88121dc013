"""The CPU budget: an engine holds BLAS at ``Config.blas_threads`` per CPU worker while open, and gives it back.

BLAS's threads are read with threadpoolctl, as a user would.  Each test first holds BLAS at a known count
(``threadpool_limits``) so that what the engine does shows whatever the machine's own default is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import schedsvc as ss
from schedsvc.devices import BLAS_VARIABLES, engine_cores, plan_blas

from ..helpers import TIMEOUT


def blas_threads() -> list[int]:
    """The threads of each BLAS library loaded (NumPy's at least), as threadpoolctl reads them."""
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture(autouse=True)
def _no_user_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No BLAS variable of the shell that runs pytest decides what "auto" does; BLAS as it was afterwards."""
    if not blas_threads():
        pytest.skip("no BLAS library that threadpoolctl controls is loaded")
    for name in BLAS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = blas_threads()
    yield
    assert blas_threads() == before


async def test_auto_holds_blas_at_cores_per_worker_while_open_and_restores_it_at_close() -> None:
    cores = engine_cores()
    with threadpool_limits(limits=cores + 2):
        held = blas_threads()  # (cores + 2, unless a library was built for fewer threads)
        eng = ss.Engine(cpu_workers=1)
        await eng.start()
        try:
            assert blas_threads() == [min(threads, cores) for threads in held]  # cores // 1 worker
            assert await eng.run(blas_threads) == blas_threads()  # the workers run with it
        finally:
            await eng.aclose()
        assert blas_threads() == held
        async with ss.Engine(cpu_workers=cores) as eng:
            assert blas_threads() == [1] * len(held)  # one per worker: workers x 1 = cores
        assert blas_threads() == held


async def test_auto_never_raises_a_count_that_was_lowered() -> None:
    """``one_blas_thread`` around a benchmark's engine keeps BLAS at one thread."""
    with threadpool_limits(limits=1):
        async with ss.Engine(cpu_workers=1):  # auto: at most the cores, here more than 1 (where there are)
            assert blas_threads() == [1] * len(blas_threads())
        assert blas_threads() == [1] * len(blas_threads())


async def test_an_explicit_setting_is_honoured_above_the_budget_and_over_the_user_s_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    with threadpool_limits(limits=1):
        async with ss.Engine(cpu_workers=engine_cores(), blas_threads=3):
            assert blas_threads() == [3] * len(blas_threads())
        assert blas_threads() == [1] * len(blas_threads())


@pytest.mark.parametrize("leave", ["leave", 0])
async def test_leave_touches_nothing(leave: Any) -> None:
    with threadpool_limits(limits=3):
        async with ss.Engine(cpu_workers=engine_cores(), blas_threads=leave) as eng:
            assert blas_threads() == [3] * len(blas_threads())
            pool: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
            assert pool.blas is None
        assert blas_threads() == [3] * len(blas_threads())


async def test_auto_leaves_blas_alone_where_the_user_set_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with threadpool_limits(limits=3):
        async with ss.Engine(cpu_workers=engine_cores()) as eng:
            assert blas_threads() == [3] * len(blas_threads())
            assert plan_blas(eng.config).reason == "left alone: OMP_NUM_THREADS=3 is set"


async def test_engines_open_together_share_the_smallest_count_and_the_last_close_restores() -> None:
    """Closed in the order they opened (not the reverse), the first to close must not restore yet."""
    with threadpool_limits(limits=5):
        first = await ss.Engine(cpu_workers=1, blas_threads=2).start()
        try:
            assert blas_threads() == [2] * len(blas_threads())
            second = await ss.Engine(cpu_workers=1, blas_threads=3).start()
            try:
                assert blas_threads() == [2] * len(blas_threads())  # the smaller of 2 and 3
            finally:
                await first.aclose()
            assert blas_threads() == [3] * len(blas_threads())  # the one still open
        finally:
            await first.aclose()
            await second.aclose()
        assert blas_threads() == [5] * len(blas_threads())  # as before the first started


async def test_after_an_engine_closes_another_thread_can_set_blas() -> None:
    """threadpoolctl (3.8+) lets one thread at a time set OpenBLAS's threads: the engine's start and close
    must not keep that for the loop's thread, or a later ``threadpool_limits`` elsewhere does nothing."""
    async with ss.Engine(cpu_workers=1, blas_threads=3):
        pass
    other = 2 if 1 in blas_threads() else 1  # not the count now: setting it must show
    seen: list[list[int]] = []

    def elsewhere() -> None:
        with threadpool_limits(limits=other):
            seen.append(blas_threads())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(TIMEOUT)
    assert seen == [[other] * len(blas_threads())]


def test_auto_is_the_cores_given_per_worker_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "process_cpu_count", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert engine_cores() == 8
    plans = {workers: plan_blas(ss.Config(cpu_workers=workers)) for workers in (1, 3, 8, 16)}
    assert {workers: plan.threads for workers, plan in plans.items()} == {1: 8, 3: 2, 8: 1, 16: 1}
    assert not any(plan.exact for plan in plans.values())
    assert plans[3].reason == "auto: at most 8 cores // 3 workers"
    assert plan_blas(ss.Config(blas_threads=12)).threads == 12
    assert plan_blas(ss.Config(blas_threads="leave")).threads is None


def test_no_cpu_threads_no_hold() -> None:
    """Without CPU worker threads (a Dask backend, CUDA devices only) an engine leaves BLAS alone."""
    assert plan_blas(ss.Config(backend="dask")).threads is None
    assert plan_blas(ss.Config(devices=("cuda:0",), blas_threads=2)).threads is None


def test_threadpoolctl_is_imported_when_an_engine_starts_not_with_schedsvc() -> None:
    code = (
        "import sys, asyncio, schedsvc\n"
        "assert 'threadpoolctl' not in sys.modules\n"
        "async def main():\n"
        "    async with schedsvc.Engine(cpu_workers=1):\n"
        "        assert 'threadpoolctl' in sys.modules\n"
        "asyncio.run(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARIABLES and not k.startswith("SCHEDSVC_")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=TIMEOUT)


async def test_an_engine_whose_workers_cannot_start_gives_blas_back(monkeypatch: pytest.MonkeyPatch) -> None:
    start = threading.Thread.start

    def refuse_workers(thread: threading.Thread) -> None:
        if thread.name.startswith("schedsvc-cpu"):
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse_workers)
    with threadpool_limits(limits=3):
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await ss.Engine(cpu_workers=1, blas_threads=2).start()
        assert blas_threads() == [3] * len(blas_threads())
