"""Core benchmark: schedsvc against ThreadPoolExecutor and asyncio's run_in_executor.

Every case runs in one process; repetitions interleave the cases so that
machine noise hits all of them alike; figures are medians over repetitions,
and each schedsvc figure is reported as a ratio to a baseline from the same
run.  BLAS is held at one thread throughout (threadpoolctl), so that parallel
speed-up comes from the engine, not from BLAS.

W1  submit cost of 10,000 tiny independent tasks (np.add on 2 elements), us/task
W2  10,000 tiny independent tasks end to end, us/task; and inside ``eng.trace`` against outside it,
    in alternating blocks on one engine (the cost of recording)
W3  a chain of 10,000 tiny tasks, each taking the previous result, us/task
W4  the sources' experiment: 1,000 x (y = x + 1), awaited one by one vs all then waitall
W5  8 independent 1000x1000 float64 np.dot: speed-up of cpu_workers over 1 worker
W6  the sources' memory experiment: 200 batches of 1024x512 float32 through a 512x512
    matmul, peak traced memory and time, max_pending_bytes=16 MiB vs unbounded
W7  ``ss.executor()`` from a program with no event loop: 2,000 round trips of submit(np.add) + result(),
    us each, against ThreadPoolExecutor's; and 2,000 with concurrent.futures.wait before result()
W1-W4 again under trio (``*.trio``, when trio is installed): each figure over asyncio's (``trio_*_vs_asyncio``)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib.util
import os
import threading
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future as CFuture
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

import schedsvc as ss

from .._common import Figures, MiB, bench_workers, median_figures, meets, one_blas_thread, target_line

__all__ = ["CASES", "TARGETS", "run"]

N_TINY = 10_000
#: W2 blocks of the traced case, untraced (False) and traced (True): each kind comes first, last and
#: after each kind equally often, since a block's place (after a trace was written, say) moves its time
W2_TRACED_ORDER = (False, True, True, False, True, False, False, True)
W2_TRACED_PAIRS = len(W2_TRACED_ORDER) // 2
N_W4 = 1_000


def _tiny() -> np.ndarray:
    return np.ones(2)


def _engine(workers: int | None = None, **kw: Any) -> ss.Engine:
    return ss.Engine(cpu_workers=workers or bench_workers(), max_pending=4 * N_TINY, **kw)


# -- W1 / W2: independent tiny tasks -------------------------------------------


async def w1_w2_schedsvc() -> Figures:
    x = _tiny()
    async with _engine() as eng:
        await eng.run(np.add, x, 1)  # warm
        t0 = time.perf_counter()
        for _ in range(N_TINY):
            eng.submit_nowait(np.add, x, 1)
        t1 = time.perf_counter()
        await eng.waitall()
        t2 = time.perf_counter()
        for _ in range(N_TINY):
            await eng.submit(np.add, x, 1)
        t3 = time.perf_counter()
        await eng.waitall()
    return {
        "w1_submit_nowait_us": (t1 - t0) / N_TINY * 1e6,
        "w1_submit_await_us": (t3 - t2) / N_TINY * 1e6,
        "w2_us": (t2 - t0) / N_TINY * 1e6,
    }


async def w2_traced() -> Figures:
    """W2 inside ``eng.trace`` against W2 outside it, on one engine, in blocks of balanced order.

    Pairing the blocks on one warm engine keeps machine drift out of the ratio;
    writing the file is timed apart.
    """
    import tempfile

    x = _tiny()
    plain = traced = write = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        async with _engine() as eng:
            await eng.run(np.add, x, 1)  # warm
            for on in W2_TRACED_ORDER:
                trace = eng.trace(os.path.join(tmp, "w2.json")) if on else contextlib.nullcontext()
                with trace as timeline:
                    t0 = time.perf_counter()
                    for _ in range(N_TINY):
                        eng.submit_nowait(np.add, x, 1)
                    await eng.waitall()
                    t1 = time.perf_counter()
                t2 = time.perf_counter()
                if on:
                    assert timeline is not None and timeline.recorded == N_TINY
                    traced, write = traced + t1 - t0, write + t2 - t1
                else:
                    plain += t1 - t0
    n = N_TINY * W2_TRACED_PAIRS
    return {
        "w2_untraced_us": plain / n * 1e6,
        "w2_traced_us": traced / n * 1e6,
        "w2_traced_ratio": traced / plain,
        "trace_write_s": write / W2_TRACED_PAIRS,
    }


def w1_w2_threadpool() -> Figures:
    x = _tiny()
    with ThreadPoolExecutor(bench_workers()) as ex:
        ex.submit(np.add, x, 1).result()
        t0 = time.perf_counter()
        futs = [ex.submit(np.add, x, 1) for _ in range(N_TINY)]
        t1 = time.perf_counter()
        for f in futs:
            f.result()
        t2 = time.perf_counter()
    return {"w1_submit_us": (t1 - t0) / N_TINY * 1e6, "w2_us": (t2 - t0) / N_TINY * 1e6}


async def w1_w2_executor() -> Figures:
    x = _tiny()
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(bench_workers()) as ex:
        await loop.run_in_executor(ex, np.add, x, 1)
        t0 = time.perf_counter()
        futs = [loop.run_in_executor(ex, np.add, x, 1) for _ in range(N_TINY)]
        t1 = time.perf_counter()
        await asyncio.gather(*futs)
        t2 = time.perf_counter()
    return {"w1_submit_us": (t1 - t0) / N_TINY * 1e6, "w2_us": (t2 - t0) / N_TINY * 1e6}


# -- W3: a chain ------------------------------------------------------------------


async def w3_schedsvc() -> Figures:
    async with _engine() as eng:
        await eng.run(np.add, _tiny(), 1)
        t0 = time.perf_counter()
        f: Any = _tiny()
        for _ in range(N_TINY):
            f = eng.submit_nowait(np.add, f, 1)
        last = await f
        t1 = time.perf_counter()
    assert last[0] == 1 + N_TINY
    return {"w3_us": (t1 - t0) / N_TINY * 1e6}


def w3_threadpool() -> Figures:
    """Each link is submitted from its parent's done-callback: no thread blocks on a result.

    A callback added to a future that is already done runs at once, in the
    adding thread; the trampoline turns that re-entry into a loop, so a long
    chain does not recurse.
    """
    done: CFuture[np.ndarray] = CFuture()
    parents: deque[CFuture[np.ndarray]] = deque()
    local = threading.local()
    count = [0]
    with ThreadPoolExecutor(bench_workers()) as ex:
        ex.submit(np.add, _tiny(), 1).result()

        def link(parent: CFuture[np.ndarray]) -> None:
            parents.append(parent)
            if getattr(local, "active", False):
                return
            local.active = True
            try:
                while parents:
                    value = parents.popleft().result()
                    count[0] += 1
                    if count[0] == N_TINY:
                        done.set_result(value)
                    else:
                        ex.submit(np.add, value, 1).add_done_callback(link)
            finally:
                local.active = False

        t0 = time.perf_counter()
        ex.submit(np.add, _tiny(), 1).add_done_callback(link)
        last = done.result(timeout=120)
        t1 = time.perf_counter()
    assert last[0] == 1 + N_TINY
    return {"w3_us": (t1 - t0) / N_TINY * 1e6}


# -- W4: the sources' sync vs async loop --------------------------------------------


async def w4_schedsvc() -> Figures:
    """Awaited one by one (tiny tasks then run in the awaiting coroutine), and all then waitall.

    ``w4_sync_handoff_us`` is the one-by-one loop with inline runs turned off:
    every op makes the thread round trip.
    """
    x = np.ones(1)
    figures = {}
    for key, threshold in (("w4_sync_handoff_us", 0.0), ("w4_sync_us", 20.0)):
        async with _engine(inline_threshold_us=threshold) as eng:
            await eng.run(np.add, x, 1)
            t0 = time.perf_counter()
            for _ in range(N_W4):
                await eng.run(np.add, x, 1)
            figures[key] = (time.perf_counter() - t0) / N_W4 * 1e6
            t1 = time.perf_counter()
            for _ in range(N_W4):
                eng.submit_nowait(np.add, x, 1)
            await eng.waitall()
            figures["w4_async_us"] = (time.perf_counter() - t1) / N_W4 * 1e6
    return figures


async def w4_executor() -> Figures:
    x = np.ones(1)
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(bench_workers()) as ex:
        await loop.run_in_executor(ex, np.add, x, 1)
        t0 = time.perf_counter()
        for _ in range(N_W4):
            await loop.run_in_executor(ex, np.add, x, 1)
        t1 = time.perf_counter()
        await asyncio.gather(*[loop.run_in_executor(ex, np.add, x, 1) for _ in range(N_W4)])
        t2 = time.perf_counter()
    return {"w4_sync_us": (t1 - t0) / N_W4 * 1e6, "w4_async_us": (t2 - t1) / N_W4 * 1e6}


# -- W5: automatic parallelism ----------------------------------------------------------


async def w5_schedsvc() -> Figures:
    rng = np.random.default_rng(0)
    mats = [rng.random((1000, 1000)) for _ in range(8)]
    times = {}
    for workers in (1, bench_workers()):
        async with _engine(workers) as eng:
            await eng.run(np.dot, mats[0], mats[0])
            t0 = time.perf_counter()
            futs = [eng.submit_nowait(np.dot, m, m) for m in mats]
            for f in futs:
                await f
            times[workers] = time.perf_counter() - t0
    return {
        "w5_1worker_s": times[1],
        "w5_nworkers_s": times[bench_workers()],
        "w5_speedup": times[1] / times[bench_workers()],
    }


# -- W6: memory with and without backpressure ----------------------------------------------


W6_BATCHES = 200
W6_BOUND = 16 * MiB


async def _w6(max_pending_bytes: int | None) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    w = rng.random((512, 512), dtype=np.float32)
    out_bytes = 1024 * 512 * 4

    def step(batch: np.ndarray) -> float:
        return float((batch @ w).sum())

    opts: dict[str, Any] = {} if max_pending_bytes is None else {"max_pending_bytes": max_pending_bytes}
    async with _engine(**opts) as eng:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        futs = []
        for _ in range(W6_BATCHES):
            batch = rng.random((1024, 512), dtype=np.float32)
            futs.append(await eng.submit(step, batch, reads=w, nbytes=out_bytes))
            del batch
        await eng.waitall()
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        assert all(f.done() and f.exception() is None for f in futs)
    return peak, elapsed


async def w6_schedsvc() -> Figures:
    bounded_peak, bounded_s = await _w6(W6_BOUND)
    free_peak, free_s = await _w6(None)
    return {
        "w6_bounded_peak_mib": bounded_peak / MiB,
        "w6_bounded_s": bounded_s,
        "w6_unbounded_peak_mib": free_peak / MiB,
        "w6_unbounded_s": free_s,
    }


# -- W7: ss.executor() round trips from plain synchronous code --------------------------------

N_W7 = 2_000


def _round_trips(ex: Any) -> Figures:
    """Microseconds per ``ex.submit(np.add, x, 1)`` and ``result()``, after one to warm up; and per the
    same with ``concurrent.futures.wait`` before ``result()`` (the caller waits without taking part: on
    schedsvc, a ``result()`` that finds the task still queued runs it in the caller, as ``Future.result``
    does)."""
    x = _tiny()
    ex.submit(np.add, x, 1).result()
    t0 = time.perf_counter()
    for _ in range(N_W7):
        ex.submit(np.add, x, 1).result()
    t1 = time.perf_counter()
    for _ in range(N_W7):
        fut = ex.submit(np.add, x, 1)
        wait([fut])
        fut.result()
    t2 = time.perf_counter()
    return {"w7_round_trip_us": (t1 - t0) / N_W7 * 1e6, "w7_handoff_us": (t2 - t1) / N_W7 * 1e6}


def w7_executor() -> Figures:
    with ss.executor(max_workers=bench_workers()) as ex:
        return _round_trips(ex)


def w7_threadpool() -> Figures:
    with ThreadPoolExecutor(bench_workers()) as ex:
        return _round_trips(ex)


# -- the same cases under trio ----------------------------------------------------------------


def _on_trio(fn: Callable[[], Any]) -> Figures:
    """Run a case's coroutine under trio (the engine's trio bridge) instead of asyncio."""
    import trio

    return trio.run(fn)


#: W1-W4 of schedsvc again under trio, when it is installed (the ``trio`` extra): the same code, the
#: other bridge; compared with the asyncio figures of the same run
TRIO_CASES: dict[str, Callable[[], Any]] = (
    {
        "w1_w2.trio": functools.partial(_on_trio, w1_w2_schedsvc),
        "w3.trio": functools.partial(_on_trio, w3_schedsvc),
        "w4.trio": functools.partial(_on_trio, w4_schedsvc),
    }
    if importlib.util.find_spec("trio") is not None
    else {}
)


# -- the run ----------------------------------------------------------------------------------

CASES: dict[str, Callable[[], Any]] = {
    "w1_w2.schedsvc": w1_w2_schedsvc,
    "w1_w2.threadpool": w1_w2_threadpool,
    "w1_w2.executor": w1_w2_executor,
    "w2.traced": w2_traced,
    "w3.schedsvc": w3_schedsvc,
    "w3.threadpool": w3_threadpool,
    "w4.schedsvc": w4_schedsvc,
    "w4.executor": w4_executor,
    "w5.schedsvc": w5_schedsvc,
    "w6.schedsvc": w6_schedsvc,
    "w7.executor": w7_executor,
    "w7.threadpool": w7_threadpool,
    **TRIO_CASES,
}

#: (label, figure, comparison, target) -- figures below are computed in ``_ratios``.
TARGETS: list[tuple[str, str, str, float]] = [
    ("W1 submit_nowait, us/task", "w1_us", "<=", 3.0),
    ("W2 end to end / ThreadPoolExecutor", "w2_vs_threadpool", "<=", 1 / 3),
    ("W2 traced / W2 untraced", "w2_traced_vs_untraced", "<=", 1.2),
    ("W3 chain / ThreadPoolExecutor", "w3_vs_threadpool", "<=", 1 / 3),
    ("W4 sync loop / run_in_executor", "w4_sync_vs_executor", "<=", 0.4),
    ("W4 async loop / run_in_executor", "w4_async_vs_executor", "<=", 0.33),
    ("W5 speed-up, cpu_workers vs 1", "w5_speedup", ">=", 1.8),
    ("W6 bounded peak - (bound + 1 batch), MiB", "w6_peak_over_bound_mib", "<=", 0.0),
    ("W6 bounded time / unbounded", "w6_time_ratio", "<=", 1.1),
]


def _run_case(fn: Callable[[], Any]) -> Figures:
    result = asyncio.run(fn()) if asyncio.iscoroutinefunction(fn) else fn()
    gc.collect()
    return dict(result)


def _ratios(m: dict[str, Figures]) -> Figures:
    s, tp, ex = m["w1_w2.schedsvc"], m["w1_w2.threadpool"], m["w1_w2.executor"]
    batch_mib = 1024 * 512 * 4 / MiB
    return {
        "w1_us": s["w1_submit_nowait_us"],
        "w1_vs_threadpool": s["w1_submit_nowait_us"] / tp["w1_submit_us"],
        "w2_vs_threadpool": s["w2_us"] / tp["w2_us"],
        "w2_vs_executor": s["w2_us"] / ex["w2_us"],
        "w2_traced_vs_untraced": m["w2.traced"]["w2_traced_ratio"],
        "w3_vs_threadpool": m["w3.schedsvc"]["w3_us"] / m["w3.threadpool"]["w3_us"],
        "w4_sync_vs_executor": m["w4.schedsvc"]["w4_sync_us"] / m["w4.executor"]["w4_sync_us"],
        "w4_sync_handoff_vs_executor": m["w4.schedsvc"]["w4_sync_handoff_us"]
        / m["w4.executor"]["w4_sync_us"],
        "w4_async_vs_executor": m["w4.schedsvc"]["w4_async_us"] / m["w4.executor"]["w4_async_us"],
        "w5_speedup": m["w5.schedsvc"]["w5_speedup"],
        "w6_peak_over_bound_mib": m["w6.schedsvc"]["w6_bounded_peak_mib"] - W6_BOUND / MiB - batch_mib,
        "w6_time_ratio": m["w6.schedsvc"]["w6_bounded_s"] / m["w6.schedsvc"]["w6_unbounded_s"],
        **_paired_ratios(m),
    }


def _paired_ratios(m: dict[str, Figures]) -> Figures:
    """The ratios of cases that have their baseline beside them, for whichever pairs ran: W7's round trips
    over ThreadPoolExecutor's, and each tiny-task figure under trio over the same figure under asyncio."""
    pairs = {
        "w7_vs_threadpool": ("w7", "w7_round_trip_us", "executor", "threadpool"),
        "w7_handoff_vs_threadpool": ("w7", "w7_handoff_us", "executor", "threadpool"),
        "trio_w1_vs_asyncio": ("w1_w2", "w1_submit_nowait_us", "trio", "schedsvc"),
        "trio_w1_await_vs_asyncio": ("w1_w2", "w1_submit_await_us", "trio", "schedsvc"),
        "trio_w2_vs_asyncio": ("w1_w2", "w2_us", "trio", "schedsvc"),
        "trio_w3_vs_asyncio": ("w3", "w3_us", "trio", "schedsvc"),
        "trio_w4_sync_vs_asyncio": ("w4", "w4_sync_us", "trio", "schedsvc"),
        "trio_w4_handoff_vs_asyncio": ("w4", "w4_sync_handoff_us", "trio", "schedsvc"),
        "trio_w4_async_vs_asyncio": ("w4", "w4_async_us", "trio", "schedsvc"),
    }
    return {
        key: m[f"{case}.{case_a}"][fig] / m[f"{case}.{case_b}"][fig]
        for key, (case, fig, case_a, case_b) in pairs.items()
        if f"{case}.{case_a}" in m and f"{case}.{case_b}" in m
    }


def run(
    reps: int = 5, cases: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the cases ``reps`` times, interleaved; return medians, ratios and target checks."""
    names = cases or list(CASES)
    samples: dict[str, list[Figures]] = {n: [] for n in names}
    with one_blas_thread():
        for rep in range(reps):
            for name in names:
                samples[name].append(_run_case(CASES[name]))
                if progress is not None:
                    progress(f"rep {rep + 1}/{reps} {name}")
    medians = {n: median_figures(runs) for n, runs in samples.items()}
    report: dict[str, Any] = {"reps": reps, "workers": bench_workers(), "cases": medians}
    if not set(CASES) <= set(names):
        if paired := _paired_ratios(medians):  # cases run with their baselines: compared anyway
            report["ratios"] = paired
    else:
        ratios = _ratios(medians)
        report["ratios"] = ratios
        report["targets"] = [
            {
                "label": label,
                "figure": key,
                "value": ratios[key],
                "target": f"{op} {target:.3g}",
                "met": meets(ratios[key], op, target),
            }
            for label, key, op, target in TARGETS
        ]
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"schedsvc bench core: median of {report['reps']} interleaved runs, "
        f"{report['workers']} workers, BLAS at 1 thread"
    ]
    for name, figures in report["cases"].items():
        shown = ", ".join(f"{k}={v:.3g}" for k, v in figures.items())
        lines.append(f"  {name:18s} {shown}")
    lines += [target_line(t) for t in report.get("targets", [])]
    trio = {k: v for k, v in report.get("ratios", {}).items() if k.startswith("trio_")}
    if trio:
        lines.append(
            "  under trio / under asyncio: " + ", ".join(f"{k[5:]}={v:.2f}" for k, v in trio.items())
        )
    return "\n".join(lines)
