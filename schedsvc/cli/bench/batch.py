"""Dynamic batching benchmark: 1,797 concurrent batch-1 calls of a digits-sized MLP, batched by the engine,
against the plain per-row NumPy loop measured in the same run.

The model has the size of scikit-learn's digits classifier: 64 -> 128 -> 64 -> 10 with ReLU, float64,
weights from a fixed seed; the data are 1,797 rows of 64 whole values 0..16 (the digits set's shape).  Each
repetition runs every case below, in this order, ``passes`` times over all the rows (after one untimed pass),
and takes each ratio against the loop of the same repetition; the report gives the median of every figure
and ratio.  BLAS is held at one thread.  Where one coroutine makes the calls, the time it takes to make them
(``calls``, the event loop thread's part, before any is awaited) is reported too.

loop           for each row: fn(x[i:i+1]), plain NumPy: the baseline
batched        mlp = eng.compile(fn, batch_axis=0, exact=True); one coroutine makes every
               call, calls = [mlp(x[i:i+1]) for i ...], then awaits each; every row must equal the loop's
               bit for bit
batched.tasks  the serving shape: a task per call (a gather of coroutines that each await mlp(x[i:i+1])),
               with each call's latency, from the call to its coroutine running again
asyncio.floor  asyncio alone in that shape: as many tasks, each awaiting an asyncio future, the futures
               resolved all at once; what the shape costs before any work is done
batched.fast   batched in the default mode (exact=False): one BLAS product per matmul, rows equal to
               within rounding
unbatched      the same concurrent calls through eng.compile(fn): one engine task per call
threadpool     the same through loop.run_in_executor on a ThreadPoolExecutor of as many threads as workers

The target (a throughput over the loop's) is checked for batched.fast, batched and batched.tasks; the verdict
is batched.fast's: the default mode, what ``eng.compile(fn, batch_axis=0)`` gives.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

import schedsvc as ss

from .._common import (
    DIGITS_ROWS,
    Figures,
    bench_workers,
    digits_rows,
    digits_weights,
    make_mlp,
    median_figures,
    meets,
    one_blas_thread,
    runs_phrase,
    target_mark,
)

__all__ = ["CASES", "MAX_BATCH", "TARGET", "format_report", "run"]

CASES = ("loop", "batched", "batched.tasks", "asyncio.floor", "batched.fast", "unbatched", "threadpool")
#: the engine's batching settings measured (its defaults): on the 2-core machine max_batch 256 and 512 tied
#: (within the runs' spread) ahead of 128 and 64, and 1 and 2 workers tied
MAX_BATCH = 256
#: timed passes over the rows per case and repetition (``quick``: one)
PASSES = 5
#: throughput against the plain loop's that the batched calls should reach
TARGET = 5.0
#: figure prefix of each case in the report
PREFIX = {
    "loop": "loop",
    "batched": "batched",
    "batched.tasks": "tasks",
    "asyncio.floor": "floor",
    "batched.fast": "fast",
    "unbatched": "unbatched",
    "threadpool": "threadpool",
}

Rows = list[np.ndarray]
T = TypeVar("T")
Call = Callable[[np.ndarray], Awaitable[Any]]


# -- the shapes of the calls -------------------------------------------------------------------------------


def _loop(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, passes: int) -> tuple[float, Rows]:
    """Seconds for ``passes`` plain loops over the rows, one row at a time; the last pass's outputs."""
    out: Rows = []
    t0 = time.perf_counter()
    for _ in range(passes):
        out = [fn(x[i : i + 1]) for i in range(len(x))]
    return time.perf_counter() - t0, out


async def _issued(call: Call, x: np.ndarray, passes: int) -> tuple[float, float, Rows]:
    """One coroutine makes a call per row, then awaits each in turn: seconds in all, seconds making the
    calls, and the last pass's outputs."""
    out: Rows = []
    making = 0.0
    t0 = time.perf_counter()
    for _ in range(passes):
        t = time.perf_counter()
        calls = [call(x[i : i + 1]) for i in range(len(x))]
        making += time.perf_counter() - t
        out = [await c for c in calls]
    return time.perf_counter() - t0, making, out


async def _tasks(call: Call, x: np.ndarray, passes: int) -> tuple[float, Rows, np.ndarray]:
    """A task per call, each awaiting its own: seconds, the last pass's outputs, each call's latency (s)."""
    n = len(x)
    out: list[Any] = [None] * n
    latency = np.empty(passes * n)

    async def one(i: int, k: int) -> None:
        t = time.perf_counter()
        out[i] = await call(x[i : i + 1])
        latency[k] = time.perf_counter() - t

    t0 = time.perf_counter()
    for p in range(passes):
        await asyncio.gather(*[one(i, p * n + i) for i in range(n)])
    return time.perf_counter() - t0, out, latency


async def _floor(n: int, passes: int) -> tuple[float, np.ndarray]:
    """asyncio's own cost of the tasks' shape: ``n`` tasks each awaiting a future, all resolved at once."""
    loop = asyncio.get_running_loop()
    latency = np.empty(passes * n)

    async def one(future: asyncio.Future[None], k: int) -> None:
        t = time.perf_counter()
        await future
        latency[k] = time.perf_counter() - t

    async def resolve(futures: list[asyncio.Future[None]]) -> None:
        for future in futures:  # gather started this last: every other task is waiting by now
            future.set_result(None)

    t0 = time.perf_counter()
    for p in range(passes):
        futures = [loop.create_future() for _ in range(n)]
        await asyncio.gather(*[one(f, p * n + i) for i, f in enumerate(futures)], resolve(futures))
    return time.perf_counter() - t0, latency


# -- one repetition --------------------------------------------------------------------------------------


class _Run:
    """One repetition: the model, the rows, the loop's outputs, and what each case measured."""

    def __init__(self, passes: int, workers: int, max_batch: int) -> None:
        self.fn = make_mlp(digits_weights())
        self.x = digits_rows()
        self.n, self.passes, self.workers = len(self.x), passes, workers
        self.max_batch = max_batch
        self.figures: Figures = {}
        self.checks: dict[str, Any] = {}
        self.batch_sizes: dict[str, dict[int, int]] = {}
        _, self.expected = _loop(self.fn, self.x, 1)

    def per_row_us(self, case: str, seconds: float, making: float | None = None) -> None:
        """Microseconds per row in all (and making the calls, on the event loop's thread)."""
        self.figures[f"{PREFIX[case]}_us"] = seconds / (self.passes * self.n) * 1e6
        if making is not None:
            self.figures[f"{PREFIX[case]}_call_us"] = making / (self.passes * self.n) * 1e6

    def latency(self, case: str, seconds: np.ndarray) -> None:
        p50, p99 = np.percentile(seconds, [50, 99]) * 1e6
        self.figures |= {f"{PREFIX[case]}_p50_us": float(p50), f"{PREFIX[case]}_p99_us": float(p99)}

    def equal(self, case: str, out: Rows) -> None:
        """Whether every row is the loop's, bit for bit."""
        self.checks[f"{case} equal"] = all(
            np.array_equal(o, e) for o, e in zip(out, self.expected, strict=True)
        )

    def close(self, case: str, out: Rows) -> None:
        """Whether every row is the loop's to within rounding, and how many are so bit for bit."""
        pairs = list(zip(out, self.expected, strict=True))
        self.checks[f"{case} close"] = all(np.allclose(o, e, rtol=1e-9, atol=1e-9) for o, e in pairs)
        self.checks[f"{case} rows bit-equal"] = sum(bool(np.array_equal(o, e)) for o, e in pairs)

    async def timed(self, measure: Callable[[int], Awaitable[T]], mlp: Any = None, case: str = "") -> T:
        """``measure(passes)`` after one untimed pass; the sizes of the batches ``mlp`` made in the timed ones."""
        await measure(1)
        gc.collect()
        before = Counter(mlp.stats()["batch_sizes"]) if mlp is not None else None
        result = await measure(self.passes)
        if before is not None:
            made = Counter(mlp.stats()["batch_sizes"]) - before
            self.batch_sizes[case] = {rows: made[rows] for rows in sorted(made)}
        return result

    async def batched(self, case: str, mlp: Any) -> Rows:
        """``mlp``'s calls made by one coroutine: their outputs."""
        seconds, making, out = await self.timed(lambda passes: _issued(mlp, self.x, passes), mlp, case)
        self.per_row_us(case, seconds, making)
        return out

    async def tasks(self, case: str, mlp: Any) -> Rows:
        """``mlp``'s calls made by a task each: their outputs, and the calls' latencies."""
        seconds, out, latency = await self.timed(lambda passes: _tasks(mlp, self.x, passes), mlp, case)
        self.per_row_us(case, seconds)
        self.latency(case, latency)
        return out


async def one_run(passes: int, workers: int, max_batch: int) -> _Run:
    """Every case once (``passes`` timed passes each), in the order of CASES; ratios against this loop."""
    run = _Run(passes, workers, max_batch)
    seconds, _ = _loop(run.fn, run.x, passes)
    run.per_row_us("loop", seconds)
    async with ss.Engine(cpu_workers=workers, max_pending=2 * run.n) as eng:
        batching = functools.partial(eng.compile, run.fn, batch_axis=0, max_batch=max_batch)
        exact, fast = batching(name="mlp", exact=True), batching(name="mlp_fast")
        plain = eng.compile(run.fn, name="mlp_unbatched")
        for mlp in (exact, fast, plain):
            await mlp(run.x[:1])  # the first call traces (and proves the rows independent); not timed
        await _batched_cases(run, exact, fast)
        seconds, making, out = await run.timed(lambda passes: _issued(plain, run.x, passes))
        run.per_row_us("unbatched", seconds, making)
        run.equal("unbatched", out)
    await _threadpool(run)
    for case in CASES[1:]:  # the floor's too: no shape can beat the asyncio it is made of
        run.figures[f"{PREFIX[case]}_ratio"] = run.figures["loop_us"] / run.figures[f"{PREFIX[case]}_us"]
    return run


async def _batched_cases(run: _Run, exact: Any, fast: Any) -> None:
    run.equal("batched", await run.batched("batched", exact))
    run.equal("batched.tasks", await run.tasks("batched.tasks", exact))
    seconds, latency = await run.timed(lambda passes: _floor(run.n, passes))
    run.per_row_us("asyncio.floor", seconds)
    run.latency("asyncio.floor", latency)
    run.close("batched.fast", await run.batched("batched.fast", fast))


async def _threadpool(run: _Run) -> None:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(run.workers) as pool:

        def call(row: np.ndarray) -> asyncio.Future[np.ndarray]:
            return loop.run_in_executor(pool, run.fn, row)

        seconds, making, out = await run.timed(lambda passes: _issued(call, run.x, passes))
    run.per_row_us("threadpool", seconds, making)
    run.equal("threadpool", out)


# -- the report ------------------------------------------------------------------------------------------

#: (label, figure) of the cases the target applies to; the first, the default mode, is the verdict's
TARGETS: list[tuple[str, str]] = [
    ("batched, the default (exact=False), one coroutine", "fast_ratio"),
    ("batched, exact=True, one coroutine", "batched_ratio"),
    ("batched, exact=True, a task per call", "tasks_ratio"),
]


def run(
    reps: int = 5,
    progress: Callable[[str], None] | None = None,
    *,
    quick: bool = False,
    max_batch: int = MAX_BATCH,
    workers: int | None = None,
) -> dict[str, Any]:
    """``reps`` interleaved repetitions (``quick``: one timed pass each); medians, and the target checks."""
    workers = workers or bench_workers()
    passes = 1 if quick else PASSES
    runs: list[_Run] = []
    with one_blas_thread():
        for rep in range(reps):
            runs.append(asyncio.run(one_run(passes, workers, max_batch)))
            if progress is not None:
                progress(f"rep {rep + 1}/{reps}")
    samples = [r.figures for r in runs]
    medians = median_figures(samples)
    checks = {k: all(r.checks[k] for r in runs) for k in runs[0].checks if not k.endswith("bit-equal")}
    checks["batched.fast rows bit-equal"] = min(r.checks["batched.fast rows bit-equal"] for r in runs)
    targets = [_target(label, key, medians, samples) for label, key in TARGETS]
    return {
        "reps": reps,
        "rows": DIGITS_ROWS,
        "passes": passes,
        "model": "MLP 64-128-64-10, ReLU, float64",
        "config": {"cpu_workers": workers, "max_batch": max_batch, "blas_threads": 1},
        "medians": medians,
        "range": {k: [min(s[k] for s in samples), max(s[k] for s in samples)] for k in medians},
        "checks": checks,
        "batch_sizes": {
            case: {str(k): v for k, v in sizes.items()} for case, sizes in runs[-1].batch_sizes.items()
        },
        "targets": targets,
        "verdict": _verdict(targets[0], checks),
    }


def _verdict(headline: dict[str, Any], checks: dict[str, Any]) -> str:
    """Whether batching in its default mode reached the target, in one sentence."""
    met = "met" if headline["met"] else "NOT met"
    rows = (
        "every row the loop's to within rounding" if checks["batched.fast close"] else "rows NOT the loop's"
    )
    return (
        f"target {headline['target']}x the plain loop's throughput in the default mode: {met} "
        f"({headline['value']:.2f}x, {rows})"
    )


def _target(label: str, key: str, medians: Figures, samples: list[Figures]) -> dict[str, Any]:
    return {
        "label": label,
        "figure": key,
        "value": medians[key],
        "range": [min(s[key] for s in samples), max(s[key] for s in samples)],
        "target": f">= {TARGET:g}",
        "met": meets(medians[key], ">=", TARGET),
    }


def _results(checks: dict[str, Any], case: str) -> str:
    if case == "batched.fast":
        ok = "within rounding" if checks["batched.fast close"] else "NOT within rounding"
        return f"{ok} ({checks['batched.fast rows bit-equal']:,} of {DIGITS_ROWS:,} rows bit-equal)"
    if case == "asyncio.floor":
        return "(no work)"
    if case == "loop":
        return "(the baseline)"
    return "equal bit for bit" if checks[f"{case} equal"] else "NOT EQUAL to the loop's"


def _batches(report: dict[str, Any], case: str) -> str:
    sizes = report["batch_sizes"].get(case)
    if not sizes:
        return "-"
    batches = sum(sizes.values()) / report["passes"]
    rows = sum(int(k) * v for k, v in sizes.items()) / sum(sizes.values())
    return f"{batches:.3g}/pass, mean {rows:.0f}"


def _cell(m: Figures, key: str, fmt: str, width: int, unit: str = "") -> str:
    return (format(m[key], fmt) + unit if key in m else "-").rjust(width)


def format_report(report: dict[str, Any]) -> str:
    m, c = report["medians"], report["config"]
    lines = [
        f"schedsvc bench batch: {runs_phrase(report['reps'])}, {report['rows']:,} concurrent batch-1 calls "
        f"x {report['passes']} passes each, {report['model']}, BLAS at 1 thread",
        f"  engine: cpu_workers={c['cpu_workers']}, max_batch={c['max_batch']}. "
        "x loop: the loop's time per row / the case's; "
        "calls: making the calls alone",
        "  case             us/row  x loop  calls us  p50 us  p99 us  batches          results",
    ]
    for case in CASES:
        p = PREFIX[case]
        lines.append(
            f"  {case:15s} {m[f'{p}_us']:7.2f} {_cell(m, f'{p}_ratio', '.2f', 7, 'x')} "
            f"{_cell(m, f'{p}_call_us', '.2f', 9)} {_cell(m, f'{p}_p50_us', '.0f', 7)} "
            f"{_cell(m, f'{p}_p99_us', '.0f', 7)}  {_batches(report, case):16s} {_results(report['checks'], case)}"
        )
    for case, sizes in report["batch_sizes"].items():
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        lines.append(f"  batch sizes, {case} (rows: batches, over {report['passes']} passes): {shown}")
    for t in report["targets"]:
        lo, hi = t["range"]
        lines.append(
            f"  [{target_mark(t['met'])}] {t['label']:44s} {t['value']:5.2f}x the loop's throughput "
            f"(range {lo:.2f}-{hi:.2f}), target {t['target']}"
        )
    lines.append(f"  verdict: {report['verdict']}")
    return "\n".join(lines)
