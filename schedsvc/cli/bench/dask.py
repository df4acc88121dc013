"""Dask benchmark: schedsvc on Dask against plain ``client.submit``, on one local cluster, in one run.

One LocalCluster (2 single-threaded worker processes on 127.0.0.1) serves every
case; after one uncounted warm-up round, repetitions interleave schedsvc and
plain Dask (alternating which goes first) so that machine noise hits both
alike; figures are medians, and each ratio is the median of the per-repetition
ratios of schedsvc to plain Dask.  Each case connects its own client (not
timed) and warms it with one task first.

W2  N_W2 tiny independent tasks (np.add on 2 elements), submitted then waited for, us/task
W3  a chain of N_W3 tiny tasks, each taking the previous result, us/task
W5  8 independent 1000x1000 float64 np.dot, inputs made on the workers, s in all
G   the values of N_G finished tiny tasks brought here: ``await asyncio.gather(*futures)``
    against ``client.gather(futures)``, us/value
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import schedsvc as ss

from .._common import Figures, median_figures, target_line

__all__ = ["CASES", "run"]

N_W2 = 2_000
N_W3 = 500
N_W5 = 8
N_G = 1_000
W5_SIZE = 1000


def _tiny() -> np.ndarray:
    return np.ones(2)


def _matrix(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((W5_SIZE, W5_SIZE))


def _engine(address: str) -> ss.Engine:
    return ss.Engine(backend="dask", dask_address=address, max_pending=4 * N_W2)


async def _client(address: str) -> Any:
    from distributed import Client

    return await Client(address, asynchronous=True, set_as_default=False)


# -- W2: independent tiny tasks ---------------------------------------------------------------


async def w2_schedsvc(address: str) -> Figures:
    x = _tiny()
    async with _engine(address) as eng:
        await eng.run(np.add, x, 1)  # warm
        t0 = time.perf_counter()
        for _ in range(N_W2):
            eng.submit_nowait(np.add, x, 1)
        await eng.waitall()
        t1 = time.perf_counter()
    return {"w2_us": (t1 - t0) / N_W2 * 1e6}


async def w2_dask(address: str) -> Figures:
    from distributed.client import _wait

    x = _tiny()
    client = await _client(address)
    try:
        await client.submit(np.add, x, 1, pure=False)  # warm
        t0 = time.perf_counter()
        futures = [client.submit(np.add, x, 1, pure=False) for _ in range(N_W2)]
        await _wait(futures)
        t1 = time.perf_counter()
    finally:
        await client.close()
    return {"w2_us": (t1 - t0) / N_W2 * 1e6}


# -- W3: a chain ------------------------------------------------------------------------------


async def w3_schedsvc(address: str) -> Figures:
    async with _engine(address) as eng:
        await eng.run(np.add, _tiny(), 1)
        t0 = time.perf_counter()
        f: Any = _tiny()
        for _ in range(N_W3):
            f = eng.submit_nowait(np.add, f, 1)
        last = await f
        t1 = time.perf_counter()
    assert last[0] == 1 + N_W3
    return {"w3_us": (t1 - t0) / N_W3 * 1e6}


async def w3_dask(address: str) -> Figures:
    client = await _client(address)
    try:
        await client.submit(np.add, _tiny(), 1, pure=False)
        t0 = time.perf_counter()
        f: Any = _tiny()
        for _ in range(N_W3):
            f = client.submit(np.add, f, 1, pure=False)
        last = await f
        t1 = time.perf_counter()
    finally:
        await client.close()
    assert last[0] == 1 + N_W3
    return {"w3_us": (t1 - t0) / N_W3 * 1e6}


# -- W5: parallel matrix products -------------------------------------------------------------


async def w5_schedsvc(address: str) -> Figures:
    async with _engine(address) as eng:
        await eng.run(np.add, 1, 1)
        t0 = time.perf_counter()
        mats = [eng.submit_nowait(_matrix, i) for i in range(N_W5)]
        prods = [eng.submit_nowait(np.dot, m, m) for m in mats]
        traces = [eng.submit_nowait(np.trace, p) for p in prods]  # only scalars come back
        values = [await t for t in traces]
        t1 = time.perf_counter()
    assert all(v > 0 for v in values)
    return {"w5_s": t1 - t0}


async def w5_dask(address: str) -> Figures:
    client = await _client(address)
    try:
        await client.submit(np.add, 1, 1, pure=False)
        t0 = time.perf_counter()
        mats = [client.submit(_matrix, i, pure=False) for i in range(N_W5)]
        prods = [client.submit(np.dot, m, m, pure=False) for m in mats]
        traces = [client.submit(np.trace, p, pure=False) for p in prods]
        values = [await t for t in traces]  # as the schedsvc case: each awaited, one by one
        t1 = time.perf_counter()
    finally:
        await client.close()
    assert all(v > 0 for v in values)
    return {"w5_s": t1 - t0}


# -- G: bringing many results back ------------------------------------------------------------


async def g_schedsvc(address: str) -> Figures:
    async with _engine(address) as eng:
        await eng.run(np.add, 1, 1)
        futures = [eng.submit_nowait(np.add, 0.5, i) for i in range(N_G)]
        await eng.waitall()  # all on the cluster; only the fetching is timed
        t0 = time.perf_counter()
        values = await asyncio.gather(*futures)
        t1 = time.perf_counter()
    assert values[-1] == N_G - 0.5
    return {"g_us": (t1 - t0) / N_G * 1e6}


async def g_dask(address: str) -> Figures:
    from distributed.client import _wait

    client = await _client(address)
    try:
        await client.submit(np.add, 1, 1, pure=False)
        futures = [client.submit(np.add, 0.5, i, pure=False) for i in range(N_G)]
        await _wait(futures)
        t0 = time.perf_counter()
        values = await client.gather(futures)
        t1 = time.perf_counter()
    finally:
        await client.close()
    assert values[-1] == N_G - 0.5
    return {"g_us": (t1 - t0) / N_G * 1e6}


CASES: dict[str, Callable[[str], Awaitable[Figures]]] = {
    "w2.schedsvc": w2_schedsvc,
    "w2.dask": w2_dask,
    "w3.schedsvc": w3_schedsvc,
    "w3.dask": w3_dask,
    "w5.schedsvc": w5_schedsvc,
    "w5.dask": w5_dask,
    "g.schedsvc": g_schedsvc,
    "g.dask": g_dask,
}

#: (label, figure, target): schedsvc on Dask over plain Dask, per workload.
TARGETS: list[tuple[str, str, float]] = [
    ("W2 tiny independent tasks / plain Dask", "w2_vs_dask", 1.1),
    ("W3 chain / plain Dask", "w3_vs_dask", 1.1),
    ("W5 8 np.dot / plain Dask", "w5_vs_dask", 1.1),
    ("G gather 1,000 results / client.gather", "g_vs_dask", 1.1),
]


async def _run_all(reps: int, progress: Callable[[str], None] | None) -> dict[str, list[Figures]]:
    from distributed import LocalCluster

    samples: dict[str, list[Figures]] = {name: [] for name in CASES}
    async with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        asynchronous=True,
    ) as cluster:
        address = cluster.scheduler_address
        for case in CASES.values():  # warm-up round, not counted: workers import the code, BLAS starts
            await case(address)
        names = list(CASES)
        for rep in range(reps):
            for pair in zip(names[::2], names[1::2], strict=True):
                first, second = pair if rep % 2 == 0 else pair[::-1]  # alternate which goes first
                # untimed: the first run after another workload is slower (0.41 s against 0.30 s
                # for W5 after W3), whichever side it is; it would count against the side timed first
                await CASES[first](address)
                gc.collect()
                for name in (first, second):
                    samples[name].append(await CASES[name](address))
                    gc.collect()  # the last case's handles are released now, not inside the next timing
                    if progress is not None:
                        progress(f"rep {rep + 1}/{reps} {name}")
    return samples


def run(reps: int = 5, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every case ``reps`` times, interleaved, on one local cluster; medians and ratios."""
    samples = asyncio.run(_run_all(reps, progress))
    medians = {n: median_figures(runs) for n, runs in samples.items()}
    # a ratio per repetition (both measured back to back), then the median of those
    ratios = {
        f"{w}_vs_dask": statistics.median(
            s[f"{w}_{unit}"] / d[f"{w}_{unit}"]
            for s, d in zip(samples[f"{w}.schedsvc"], samples[f"{w}.dask"], strict=True)
        )
        for w, unit in (("w2", "us"), ("w3", "us"), ("w5", "s"), ("g", "us"))
    }
    return {
        "reps": reps,
        "cluster": "LocalCluster, 2 worker processes x 1 thread, 127.0.0.1",
        "cases": medians,
        "ratios": ratios,
        "targets": [
            {
                "label": label,
                "figure": key,
                "value": ratios[key],
                "target": f"<= {target:.3g}",
                "met": ratios[key] <= target,
            }
            for label, key, target in TARGETS
        ],
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [f"schedsvc bench dask: median of {report['reps']} interleaved runs, {report['cluster']}"]
    for name, figures in report["cases"].items():
        shown = ", ".join(f"{k}={v:.4g}" for k, v in figures.items())
        lines.append(f"  {name:12s} {shown}")
    lines += [target_line(t) for t in report["targets"]]
    return "\n".join(lines)
