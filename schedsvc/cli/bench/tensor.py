"""Tensor benchmark: plain NumPy, engine Tensors run eagerly, and the same code compiled.

Each repetition runs the three variants back to back in one process, and the
ratios are taken within that repetition; the report gives the median of each
figure and of each ratio over repetitions.  BLAS is held at one thread.

MLP    the sources' network: Dense 512->256->128->2 with ReLU, batch 1; 1,000 calls queued,
       then one wait (as ``net(x)`` x 1000 then ``npx.waitall()``); also awaited call by call
FANCY  the sources' ``fancy_func``: g = (a + b) + (c + d) on 100-element arrays, 1,000 calls
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import schedsvc as ss

from .._common import (
    Figures,
    fancy_func,
    make_mlp,
    median_figures,
    meets,
    mlp_weights,
    one_blas_thread,
    target_mark,
)

__all__ = ["TARGETS", "format_report", "run"]

N_CALLS = 1_000


async def _variants(fn: Callable[..., Any], args: list[np.ndarray], prefix: str, awaited: bool) -> Figures:
    """Seconds per call: NumPy, eager Tensors and compiled, queued then waited (and awaited each)."""
    figures: Figures = {}
    t0 = time.perf_counter()
    for _ in range(N_CALLS):
        fn(*args)
    figures[f"{prefix}_numpy_us"] = (time.perf_counter() - t0) / N_CALLS * 1e6
    async with ss.Engine(cpu_workers=2, max_pending=4 * N_CALLS * 8) as eng:
        tensors = [eng.asarray(a) for a in args]
        compiled = eng.compile(fn)
        await compiled(*tensors)  # the first call traces; not timed
        await fn(*tensors)  # warm the eager path too
        figures[f"{prefix}_eager_us"] = await _queued(eng, fn, tensors)
        figures[f"{prefix}_compiled_us"] = await _queued(eng, compiled, tensors)
        if awaited:
            figures[f"{prefix}_eager_awaited_us"] = await _awaited(fn, tensors)
            figures[f"{prefix}_compiled_awaited_us"] = await _awaited(compiled, tensors)
        assert compiled.stats()["traces"] == 1
    return figures


async def _queued(eng: ss.Engine, fn: Callable[..., Any], tensors: list[Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(N_CALLS):
        fn(*tensors)
    await eng.waitall()
    return (time.perf_counter() - t0) / N_CALLS * 1e6


async def _awaited(fn: Callable[..., Any], tensors: list[Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(N_CALLS):
        await fn(*tensors)
    return (time.perf_counter() - t0) / N_CALLS * 1e6


async def one_run() -> Figures:
    """One repetition of every variant, with its ratios."""
    mlp = make_mlp(mlp_weights())
    x = np.random.default_rng(1).standard_normal((1, 512))
    figures = await _variants(mlp, [x], "mlp", awaited=True)
    arrays = [np.full(100, float(i)) for i in range(1, 5)]
    figures.update(await _variants(fancy_func, arrays, "fancy", awaited=False))
    for p in ("mlp", "fancy"):
        figures[f"{p}_eager_over_compiled"] = figures[f"{p}_eager_us"] / figures[f"{p}_compiled_us"]
        figures[f"{p}_compiled_over_numpy"] = figures[f"{p}_compiled_us"] / figures[f"{p}_numpy_us"]
    figures["mlp_awaited_eager_over_compiled"] = (
        figures["mlp_eager_awaited_us"] / figures["mlp_compiled_awaited_us"]
    )
    figures["mlp_awaited_compiled_over_numpy"] = figures["mlp_compiled_awaited_us"] / figures["mlp_numpy_us"]
    return figures


#: (label, figure, comparison, target)
TARGETS: list[tuple[str, str, str, float]] = [
    ("MLP eager / compiled (speed-up of compiling)", "mlp_eager_over_compiled", ">=", 3.0),
    ("MLP compiled / plain NumPy", "mlp_compiled_over_numpy", "<=", 1.3),
]


def run(reps: int = 5, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``reps`` repetitions; medians of every figure and ratio, and the target checks."""
    samples: list[Figures] = []
    with one_blas_thread():
        for rep in range(reps):
            samples.append(asyncio.run(one_run()))
            if progress is not None:
                progress(f"rep {rep + 1}/{reps}")
    medians = median_figures(samples)
    targets = [
        {
            "label": label,
            "figure": key,
            "value": medians[key],
            "range": [min(s[key] for s in samples), max(s[key] for s in samples)],
            "target": f"{op} {target:.3g}",
            "met": meets(medians[key], op, target),
        }
        for label, key, op, target in TARGETS
    ]
    return {"reps": reps, "calls": N_CALLS, "medians": medians, "targets": targets}


def format_report(report: dict[str, Any]) -> str:
    m = report["medians"]
    lines = [
        f"schedsvc bench tensor: median of {report['reps']} runs, {report['calls']} calls each, "
        "ratios within each run, BLAS at 1 thread",
        "  us per call          numpy   eager  compiled   eager/compiled  compiled/numpy",
    ]
    rows = [("mlp", "MLP, queued", ""), ("mlp", "MLP, awaited each", "_awaited"), ("fancy", "fancy_func", "")]
    for p, label, a in rows:
        eager, comp = m[f"{p}_eager{a}_us"], m[f"{p}_compiled{a}_us"]
        lines.append(
            f"  {label:18s} {m[f'{p}_numpy_us']:7.1f} {eager:7.1f} {comp:9.1f} "
            f"{eager / comp:15.2f}x {comp / m[f'{p}_numpy_us']:14.2f}x"
        )
    for t in report["targets"]:
        lo, hi = t["range"]
        lines.append(
            f"  [{target_mark(t['met'])}] {t['label']:46s} {t['value']:6.2f} (range {lo:.2f}-{hi:.2f}) target {t['target']}"
        )
    return "\n".join(lines)
