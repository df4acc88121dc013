"""``schedsvc demo``: the sources' CPU experiments, measured on this machine.

The "Computational Performance" chapter of *Dive into Deep Learning* shows
five things about an asynchronous engine; each row of the table measures one
of them here, with schedsvc as the engine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import schedsvc as ss

from ._bench import core as bench
from ._bench import tensor as tensor_bench

__all__ = ["main", "register"]


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the sources' experiments on this machine and print a table")
    demo.add_argument("--reps", type=int, default=3, help="repetitions per experiment (median shown)")
    demo.set_defaults(run=lambda args: main(reps=args.reps))


async def _frontend_returns_at_once() -> dict[str, float]:
    """c = a * b + 2: submitting returns at once; the result comes when the work is done."""
    rng = np.random.default_rng(0)
    a, b = rng.random((2000, 2000)), rng.random((2000, 2000))
    async with ss.Engine() as eng:
        t0 = time.perf_counter()
        prod = eng.submit_nowait(np.multiply, a, b)
        c = eng.submit_nowait(np.add, prod, 2)
        t1 = time.perf_counter()
        value = await c
        t2 = time.perf_counter()
    assert np.allclose(value, a * b + 2)
    return {"submit_us": (t1 - t0) * 1e6, "result_ms": (t2 - t0) * 1e3}


def _median(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    runs = [asyncio.run(fn()) for _ in range(reps)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(reps: int = 3) -> int:
    """Run the experiments and print the table."""
    from threadpoolctl import threadpool_limits

    print(
        "schedsvc demo: the sources' experiments on this machine (median of "
        f"{reps} runs, BLAS at 1 thread, {bench._workers()} CPU workers)\n"
    )
    with threadpool_limits(limits=1):
        c = _median(_frontend_returns_at_once, reps)
        w4 = _median(bench.w4_schedsvc, reps)
        w5 = _median(bench.w5_schedsvc, reps)
        w6 = _median(bench.w6_schedsvc, reps)
        mlp = _median(tensor_bench.one_run, reps)
    rows = [
        (
            "c = a * b + 2 (2000x2000)",
            f"submit {c['submit_us']:.0f} us, result {c['result_ms']:.1f} ms",
            "submit returns a future at once; the work runs behind it until you await",
        ),
        (
            "1,000 x (y = x + 1)",
            f"awaited each: {w4['w4_sync_handoff_us']:.1f} us/op through a worker, "
            f"{w4['w4_sync_us']:.1f} us/op run inline; all then waitall: {w4['w4_async_us']:.1f} us/op",
            "a round trip per op costs more than waiting once; tiny awaited ops skip the trip",
        ),
        (
            "8 x np.dot 1000x1000",
            f"1 worker {w5['w5_1worker_s']:.2f} s, {bench._workers()} workers {w5['w5_nworkers_s']:.2f} s "
            f"({w5['w5_speedup']:.2f}x)",
            "independent tasks run in parallel on the worker threads (automatic parallelism)",
        ),
        (
            "200 batches through a matmul",
            f"16 MiB bound: peak {w6['w6_bounded_peak_mib']:.0f} MiB in {w6['w6_bounded_s']:.2f} s; "
            f"unbounded: peak {w6['w6_unbounded_peak_mib']:.0f} MiB in {w6['w6_unbounded_s']:.2f} s",
            "backpressure keeps a fast producer's memory bounded at no cost in time",
        ),
        (
            "MLP 512-256-128-2, 1,000 calls",
            f"NumPy {mlp['mlp_numpy_us']:.1f} us/call, engine Tensors {mlp['mlp_eager_us']:.1f}, "
            f"compiled {mlp['mlp_compiled_us']:.1f} ({mlp['mlp_eager_over_compiled']:.1f}x faster than eager)",
            "compiling (hybridize) replays the traced graph as one task instead of one task per op",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for label, figures, why in rows:
        print(f"{label:<{width}}  {figures}\n{'':<{width}}  -> {why}")
    return 0
