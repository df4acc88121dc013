"""``schedsvc tune``: sweep queue depth (and worker count) on a workload; recommend settings.

For every setting (``cpu_workers`` x ``max_pending``) the workload runs on a
fresh engine, first a few warm-up items, then ``items`` timed ones, ``reps``
times (the repetitions interleave the settings, so machine noise hits them
alike), plus one more pass under ``tracemalloc`` for memory.  BLAS is held at
one thread, so that parallel speed-up comes from the engine.

A workload is an async generator ``workload(eng, items)`` that submits
``items`` items and yields, per item, the Future (or Tensor) of the item's
last task as soon as it is submitted; a pipeline whose results come back as
values (``eng.map``) yields instead, per finished item, the
``time.perf_counter()`` at which that item started.  A plain ``async def``
that returns nothing is timed as a whole (throughput and memory, no latency).
Built-in: ``chain``, ``fanout``, ``mlp``, ``pipeline``; a user's
``module:function`` is imported (the working directory first).  Figures per
setting:

throughput  items (and tasks) finished per second, wall clock from the first
            item's submission to the moment the loop learns the last is final
latency     per item: from the moment tune asks the generator for the item
            (so waiting for admission counts) to the moment the event loop
            learns its yielded Future is final (a done callback, which is
            what an ``await`` would see); p50 and p99 by nearest rank
memory      peak bytes allocated during the run and live at once
            (``tracemalloc``; NumPy reports its buffers there), from the
            separate traced pass; and the engine's ``peak_pending_bytes``
knee        per worker count, the smallest depth whose throughput is within
            5% of that worker count's best
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import gc
import importlib
import inspect
import math
import os
import platform
import statistics
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import (
    MiB,
    fail,
    make_mlp,
    mlp_weights,
    one_blas_thread,
    output_problem,
    print_json,
    runs_phrase,
    write_json,
)

if TYPE_CHECKING:
    import numpy as np

    import schedsvc as ss

__all__ = [
    "DEFAULT_DEPTHS",
    "KNEE_TOLERANCE",
    "WORKLOADS",
    "TuneError",
    "knee",
    "load_workload",
    "recommend",
    "register",
    "run",
    "sweep",
]

#: max_pending values swept by default: 1, 2, 4, ..., 1024.
DEFAULT_DEPTHS: tuple[int, ...] = tuple(2**k for k in range(11))
#: A depth is at the knee when its throughput is within this fraction of the best.
KNEE_TOLERANCE = 0.05
WARM_ITEMS = 8
PLOT_HINT = "pip install 'schedsvc[plot]'"

Workload = Callable[..., Any]


class TuneError(Exception):
    """A bad argument or workload spec (the message says what to change), or a workload that failed."""


# -- the built-in workloads -----------------------------------------------------------------


def _link(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    import numpy as np

    out: np.ndarray = np.tanh(w @ x)
    return out


async def chain(eng: ss.Engine, items: int) -> AsyncIterator[ss.Future[Any]]:
    """Each task takes the previous result: tanh(W @ x), W 256x256; an item is one link."""
    import numpy as np

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)) / 16
    f: Any = rng.standard_normal(256)
    for _ in range(items):
        f = await eng.submit(_link, f, w)
        yield f


FANOUT_WIDTH = 8


def _branch(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    import numpy as np

    out: np.ndarray = np.tanh(x @ w)
    return out


def _reduce(*parts: np.ndarray) -> float:
    return float(sum(p.mean() for p in parts))


async def fanout(eng: ss.Engine, items: int) -> AsyncIterator[ss.Future[Any]]:
    """A fresh 64x256 batch feeds 8 independent 256x32 layers, then a reduction; an item is one round."""
    import numpy as np

    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 256))
    ws = [rng.standard_normal((256, 32)) / 16 for _ in range(FANOUT_WIDTH)]
    for i in range(items):
        src = await eng.submit(np.multiply, base, 1.0 + i / items)
        parts = [await eng.submit(_branch, src, w) for w in ws]
        yield await eng.submit(_reduce, *parts)


#: What a built-in workload keeps from the warm-up to the timed runs of one setting (one engine).
_setting_state: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "schedsvc_tune_setting", default=None
)


def _mlp_for(eng: ss.Engine) -> Any:
    """The compiled MLP: the warm-up traces it, the timed run replays it."""
    state = _setting_state.get()
    net = None if state is None else state.get("mlp")
    if net is None:
        net = eng.compile(make_mlp(mlp_weights()), name="mlp")
        if state is not None:
            state["mlp"] = net
    return net


async def mlp(eng: ss.Engine, items: int) -> AsyncIterator[ss.Tensor]:
    """The sources' MLP (512->256->128->2, ReLU), compiled; an item is one request of batch 1.

    Each request brings its own input; the producer waits for room
    (``await net.submit(...)``, first come first served) before each one.
    """
    import numpy as np

    net = _mlp_for(eng)
    rng = np.random.default_rng(1)
    for _ in range(items):
        yield await net.submit(eng.asarray(rng.standard_normal((1, 512))))


def _load(i: int) -> np.ndarray:
    import numpy as np

    return np.random.default_rng(i).standard_normal((64, 256))


def _postprocess(y: np.ndarray) -> int:
    return int(y.mean(axis=0).argmax())


async def pipeline(eng: ss.Engine, items: int) -> AsyncIterator[float]:
    """Three ``eng.map`` stages: load (a 64x256 batch) -> tanh(x @ W), W 256x256 -> postprocess.

    Each stage's window (``max_inflight``) is the engine's ``max_pending``, so
    the swept depth bounds the whole pipeline.  An item's latency runs from
    the moment the load stage pulls it to the moment its result comes out.
    """
    import numpy as np

    w = np.random.default_rng(0).standard_normal((256, 256)) / 16
    window = eng.config.max_pending
    started: deque[float] = deque()

    def source() -> Iterator[int]:
        for i in range(items):
            started.append(time.perf_counter())
            yield i

    loaded = eng.map(_load, source(), max_inflight=window)
    computed = eng.map(functools.partial(_branch, w=w), loaded, max_inflight=window, reads=w)
    async for _ in eng.map(_postprocess, computed, max_inflight=window):
        yield started.popleft()


WORKLOADS: dict[str, Workload] = {"chain": chain, "fanout": fanout, "mlp": mlp, "pipeline": pipeline}
#: Timed items per run by default: each run takes a fraction of a second on 2 cores.
DEFAULT_ITEMS: dict[str, int] = {"chain": 2000, "fanout": 200, "mlp": 2000, "pipeline": 1000}
USER_DEFAULT_ITEMS = 1000


# -- a user's module:function ------------------------------------------------------------------


def load_workload(spec: str) -> Workload:
    """A built-in workload by name, or ``module:function`` imported from ``sys.path``."""
    if spec in WORKLOADS:
        return WORKLOADS[spec]
    if ":" not in spec:
        raise TuneError(
            f"unknown workload {spec!r}: use one of {', '.join(WORKLOADS)} or 'module:function' "
            "for your own (an async generator taking (eng, items))"
        )
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise TuneError(f"workload spec {spec!r} must be 'module:function', e.g. 'mypkg.loads:resize'")
    fn = _import_attr(spec, module_name, attr)
    _check_workload(spec, fn)
    return fn  # type: ignore[no-any-return]


def _import_attr(spec: str, module_name: str, attr: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TuneError(
            f"workload {spec!r}: cannot import module {module_name!r} ({exc}); "
            "run from its directory or add it to PYTHONPATH"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise TuneError(f"workload {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    return obj


def _check_workload(spec: str, fn: Any) -> None:
    if not (inspect.isasyncgenfunction(fn) or inspect.iscoroutinefunction(fn)):
        raise TuneError(
            f"workload {spec!r} must be an async function, got {type(fn).__name__}; write "
            "'async def workload(eng, items)' that yields each item's last Future"
        )
    try:
        inspect.signature(fn).bind(None, 1)
    except TypeError as exc:
        raise TuneError(f"workload {spec!r} must take (eng, items): {exc}") from exc


# -- one run ------------------------------------------------------------------------------------


class _Recorder:
    """Item latencies of one run, and a wait until every yielded Future is final."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures: list[Any] = []
        self._open = 0
        self._settled: asyncio.Event | None = None

    def add(self, item: Any, t0: float) -> None:
        from .._future import Future

        if type(item) is float:  # an item that just finished, and the perf_counter() it started at
            self.latencies.append(time.perf_counter() - item)
            return
        if not isinstance(item, Future):
            raise TuneError(
                "a workload must yield, per item, the Future (or Tensor) of its last task, or the "
                f"time.perf_counter() at which a finished item started; got {type(item).__name__}"
            )
        self._open += 1
        item.add_done_callback(functools.partial(self._finished, t0))

    def _finished(self, t0: float, fut: Any) -> None:
        self.latencies.append(time.perf_counter() - t0)
        if fut.state != "done":
            self.failures.append(fut)
        self._open -= 1
        if self._open == 0 and self._settled is not None:
            self._settled.set()

    async def settled(self) -> None:
        if self._open:
            self._settled = asyncio.Event()
            await self._settled.wait()


async def _drive(fn: Workload, eng: ss.Engine, items: int, rec: _Recorder) -> int:
    """Run the workload once; return how many items it produced."""
    if inspect.iscoroutinefunction(fn):
        await fn(eng, items)  # no per-item futures: throughput only
        return items
    gen = fn(eng, items)
    count = 0
    try:
        while True:
            t0 = time.perf_counter()
            try:
                item = await gen.__anext__()
            except StopAsyncIteration:
                return count
            rec.add(item, t0)
            count += 1
    finally:
        await gen.aclose()


@dataclass
class _Run:
    seconds: float
    items: int
    tasks: int
    latencies: list[float]
    peak_pending_bytes: int
    peak_traced_bytes: int | None


async def _one_run(fn: Workload, items: int, workers: int, depth: int, traced: bool) -> _Run:
    import schedsvc as ss

    _setting_state.set({})  # this coroutine's own context: gone with asyncio.run
    async with ss.Engine(cpu_workers=workers, max_pending=depth) as eng:
        await _checked(fn, eng, WARM_ITEMS, _Recorder())
        gc.collect()
        before = eng.stats().completed
        rec = _Recorder()
        with _traced_memory(traced) as peak:
            t0 = time.perf_counter()
            count = await _checked(fn, eng, items, rec)
            seconds = time.perf_counter() - t0
        stats = eng.stats()
    return _Run(seconds, count, stats.completed - before, rec.latencies, stats.peak_pending_bytes, peak())


async def _checked(fn: Workload, eng: ss.Engine, items: int, rec: _Recorder) -> int:
    """Drive the workload, wait for everything it submitted; raise if any of it failed."""
    failed_before = eng.stats().failed
    count = await _drive(fn, eng, items, rec)
    await eng.waitall()
    await rec.settled()
    failed = eng.stats().failed - failed_before
    if rec.failures or failed:
        first = rec.failures[0].exception() if rec.failures else None
        detail = f": {type(first).__name__}: {first}" if first is not None else ""
        raise TuneError(f"the workload had {max(failed, len(rec.failures))} failed tasks{detail}")
    return count


class _traced_memory:
    """``with _traced_memory(on) as peak``: ``peak()`` is the peak bytes traced inside (None: off)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.value: int | None = None

    def __enter__(self) -> Callable[[], int | None]:
        if self.on:
            import tracemalloc

            tracemalloc.start()
        return lambda: self.value

    def __exit__(self, *exc: object) -> None:
        if self.on:
            import tracemalloc

            self.value = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()


# -- the sweep ------------------------------------------------------------------------------------


@dataclass
class _Setting:
    workers: int
    depth: int
    runs: list[_Run] = field(default_factory=list)
    memory: _Run | None = None


def sweep(
    workload: Workload,
    *,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    workers: Sequence[int] = (2,),
    items: int = 1000,
    reps: int = 3,
    name: str = "workload",
    step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every (workers, depth) setting; return the report (rows, knees, recommendation)."""
    settings = [_Setting(w, d) for w in workers for d in depths]
    load_before = _load_average()
    with one_blas_thread():
        for rep in range(reps):
            for s in settings:
                s.runs.append(_run_setting(workload, items, s, traced=False))
                if step is not None:
                    step(f"rep {rep + 1}/{reps}: workers={s.workers} max_pending={s.depth}")
        for s in settings:
            s.memory = _run_setting(workload, items, s, traced=True)
            if step is not None:
                step(f"memory: workers={s.workers} max_pending={s.depth}")
    report = _report(name, items, reps, [_row(s) for s in settings])
    report["machine"]["load_average"] = [load_before, _load_average()]
    return report


def _run_setting(workload: Workload, items: int, s: _Setting, traced: bool) -> _Run:
    try:
        return asyncio.run(_one_run(workload, items, s.workers, s.depth, traced))
    except TuneError as exc:
        raise TuneError(f"at cpu_workers={s.workers}, max_pending={s.depth}: {exc}") from exc
    except Exception as exc:  # the workload's own error: say where, keep the traceback as the cause
        raise TuneError(
            f"at cpu_workers={s.workers}, max_pending={s.depth}: the workload raised {type(exc).__name__}: {exc}"
        ) from exc


def _load_average() -> float | None:
    """The 1-minute load average: a sweep on a busy machine is noisy, and the report should say so."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # not available on this platform
        return None


def _row(s: _Setting) -> dict[str, Any]:
    from .._telemetry import percentile

    def median(f: Callable[[_Run], float]) -> float:
        return statistics.median(f(r) for r in s.runs)

    timed = bool(s.runs[0].latencies)
    assert s.memory is not None and s.memory.peak_traced_bytes is not None
    return {
        "workers": s.workers,
        "max_pending": s.depth,
        "items_per_s": median(lambda r: r.items / r.seconds),
        "tasks_per_s": median(lambda r: r.tasks / r.seconds),
        "p50_ms": median(lambda r: percentile(r.latencies, 0.5) * 1e3) if timed else None,
        "p99_ms": median(lambda r: percentile(r.latencies, 0.99) * 1e3) if timed else None,
        "peak_mib": s.memory.peak_traced_bytes / MiB,
        "peak_pending_mib": median(lambda r: r.peak_pending_bytes) / MiB,
        "items_per_s_reps": [r.items / r.seconds for r in s.runs],
    }


def _report(name: str, items: int, reps: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    knees = {
        w: knee({r["max_pending"]: r["items_per_s"] for r in rows if r["workers"] == w})
        for w in dict.fromkeys(r["workers"] for r in rows)
    }
    best = recommend({w: _best(rows, w) for w in knees})
    for r in rows:
        r["knee"] = knees[r["workers"]] == r["max_pending"]
    return {
        "workload": name,
        "items": items,
        "reps": reps,
        "knee_tolerance": KNEE_TOLERANCE,
        "machine": _machine(),
        "rows": rows,
        "knees": {str(w): d for w, d in knees.items()},
        "recommended": {"cpu_workers": best, "max_pending": knees[best]},
    }


def _best(rows: list[dict[str, Any]], workers: int) -> float:
    return max(float(r["items_per_s"]) for r in rows if r["workers"] == workers)


def _machine() -> dict[str, Any]:
    import numpy as np

    import schedsvc

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "schedsvc": schedsvc.__version__,
        "blas_threads": 1,
    }


# -- knee and recommendation (pure) ------------------------------------------------------------------


def knee(throughput: Mapping[int, float], tolerance: float = KNEE_TOLERANCE) -> int:
    """The smallest depth whose throughput is within ``tolerance`` (a fraction) of the best."""
    _check_points(throughput, tolerance, "knee")
    floor = (1 - tolerance) * max(throughput.values())
    return min(d for d, t in throughput.items() if t >= floor)


def recommend(best: Mapping[int, float], tolerance: float = KNEE_TOLERANCE) -> int:
    """The fewest workers whose best throughput is within ``tolerance`` of the best of all."""
    _check_points(best, tolerance, "recommend")
    floor = (1 - tolerance) * max(best.values())
    return min(w for w, t in best.items() if t >= floor)


def _check_points(points: Mapping[int, float], tolerance: float, what: str) -> None:
    if not points:
        raise ValueError(f"{what}() needs at least one measured setting")
    if not 0 <= tolerance < 1:
        raise ValueError(f"{what}(): tolerance is a fraction in [0, 1), got {tolerance!r}")
    bad = {k: v for k, v in points.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"{what}(): throughputs must be finite and non-negative, got {bad}")


# -- output --------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(report: dict[str, Any]) -> Any:
    """The report as a rich Table; the knee of each worker count marked, the recommended one in bold."""
    from rich import box
    from rich.table import Table

    rec, rows = report["recommended"], report["rows"]
    t = Table(
        title=f"schedsvc tune {report['workload']}: {report['items']} items, {runs_phrase(report['reps'])}",
        caption=(
            f"knee: the smallest max_pending within {report['knee_tolerance']:.0%} of the best items/s; "
            f"recommended: cpu_workers={rec['cpu_workers']}, max_pending={rec['max_pending']}"
        ),
        box=box.SIMPLE_HEAD,
    )
    tasks = any(r["tasks_per_s"] != r["items_per_s"] for r in rows)  # else one column says it all
    headers = [
        "cpu\nworkers",
        "max\npending",
        "items/s",
        *(["tasks/s"] if tasks else []),
        "p50\nms",
        "p99\nms",
    ]
    for col in [*headers, "peak\nMiB", "pending\nMiB", ""]:
        t.add_column(col, justify="left" if col == "" else "right", no_wrap=True)
    for r in rows:
        chosen = r["knee"] and r["workers"] == rec["cpu_workers"]
        cells = [
            str(r["workers"]),
            str(r["max_pending"]),
            f"{r['items_per_s']:,.0f}",
            *([f"{r['tasks_per_s']:,.0f}"] if tasks else []),
            _fmt(r["p50_ms"], ".3g"),
            _fmt(r["p99_ms"], ".3g"),
            f"{r['peak_mib']:.2f}",
            f"{r['peak_pending_mib']:.2f}",
            "<- knee" if r["knee"] else "",
        ]
        t.add_row(*cells, style="bold" if chosen else None)
    return t


def _loads(machine: dict[str, Any]) -> str:
    return " -> ".join(_fmt(v, ".2f") for v in machine.get("load_average", [None]))


def toml_text(report: dict[str, Any], path: str = "<this file>") -> str:
    """The recommended settings as TOML for ``Config.from_file``, with the figures in comments."""
    rec, m = report["recommended"], report["machine"]
    row = next(
        r
        for r in report["rows"]
        if r["workers"] == rec["cpu_workers"] and r["max_pending"] == rec["max_pending"]
    )
    best = max(r["items_per_s"] for r in report["rows"] if r["workers"] == rec["cpu_workers"])
    lines = [
        f"# schedsvc tune {report['workload']}: recommended settings "
        f"({report['items']} items, {runs_phrase(report['reps'])}).",
        f"# machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, NumPy {m['numpy']}, "
        f"schedsvc {m['schedsvc']}, BLAS at 1 thread; load average {_loads(m)} during the sweep",
        f"# knee: max_pending={rec['max_pending']} gives {row['items_per_s']:,.0f} items/s, within "
        f"{report['knee_tolerance']:.0%} of the best ({best:,.0f} items/s) with cpu_workers={rec['cpu_workers']};",
        f"# there p50/p99 latency {_fmt(row['p50_ms'], '.3g')}/{_fmt(row['p99_ms'], '.3g')} ms, "
        f"peak memory {row['peak_mib']:.2f} MiB.",
        f"# Load with ss.Config.from_file({path!r}); SCHEDSVC_* variables and keywords still win.",
        "#",
        "# workers  max_pending   items/s    p50 ms    p99 ms  peak MiB",
    ]
    for r in report["rows"]:
        lines.append(
            f"# {r['workers']:7d}  {r['max_pending']:11d}  {r['items_per_s']:8,.0f}  "
            f"{_fmt(r['p50_ms'], '8.3g')}  {_fmt(r['p99_ms'], '8.3g')}  {r['peak_mib']:8.2f}"
            + ("  <- knee" if r["knee"] else "")
        )
    lines += ["", f"cpu_workers = {rec['cpu_workers']}", f"max_pending = {rec['max_pending']}", ""]
    return "\n".join(lines)


_PANELS = (
    ("items_per_s", "items / s (band: min-max of runs)"),
    ("p99_ms", "latency, ms (p99 solid, p50 dashed)"),
    ("peak_mib", "peak MiB (tracemalloc)"),
)


def plot(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Throughput, latency and peak memory against depth (log2 axis), knees marked, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(7.5, 9), constrained_layout=True)
    for workers in dict.fromkeys(r["workers"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["workers"] == workers]
        _plot_curves(axes, rows, f"cpu_workers={workers}")
    _style(axes, report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_curves(axes: Any, rows: list[dict[str, Any]], label: str) -> None:
    """One worker count: a line per panel, the knee starred and a dotted line through it."""
    depths = [r["max_pending"] for r in rows]
    at = next(i for i, r in enumerate(rows) if r["knee"])
    for ax, (key, _) in zip(axes, _PANELS, strict=True):
        if rows[0][key] is None:  # a workload without per-item futures has no latency
            continue
        (line,) = ax.plot(depths, [r[key] for r in rows], "o-", label=label)
        color = line.get_color()
        ax.plot(depths[at], rows[at][key], "*", ms=16, color=color, mec="black", zorder=3)
        ax.axvline(depths[at], color=color, ls=":", lw=1)
        if key == "items_per_s":
            reps = [r["items_per_s_reps"] for r in rows]
            ax.fill_between(depths, [min(v) for v in reps], [max(v) for v in reps], color=color, alpha=0.15)
        if key == "p99_ms":
            ax.plot(depths, [r["p50_ms"] for r in rows], "o--", color=color, alpha=0.6)


def _style(axes: Any, report: dict[str, Any]) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for ax, (key, label) in zip(axes, _PANELS, strict=True):
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        if key == "p99_ms":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room above the top point and its star
    rec = report["recommended"]
    axes[0].legend(title="star: knee", loc="lower right")
    axes[0].set_title(
        f"recommended: cpu_workers={rec['cpu_workers']}, max_pending={rec['max_pending']}", fontsize=10
    )
    depths = sorted({r["max_pending"] for r in report["rows"]})
    axes[-1].set_xticks(depths, [str(d) for d in depths])
    axes[-1].set_xlabel("max_pending (queue depth)")
    m = report["machine"]
    axes[0].figure.suptitle(
        f"schedsvc tune {report['workload']}: {report['items']} items, {runs_phrase(report['reps'])}; "
        f"{m['cpus']} CPUs, load average {_loads(m)}\n{m['platform']}, BLAS at 1 thread",
        fontsize=10,
    )


# -- the command ------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    tune = sub.add_parser(
        "tune",
        help="sweep max_pending (and cpu_workers) on a workload and recommend settings",
        description="Sweep max_pending (and cpu_workers) on a workload; report throughput, latency and "
        "peak memory per setting, mark the knee and write the recommended settings as TOML.",
    )
    tune.add_argument("workload", help=f"{', '.join(WORKLOADS)}, or module:function (an async generator)")
    tune.add_argument("--depths", help="comma-separated max_pending values (default 1,2,4,...,1024)")
    tune.add_argument("--workers", help="comma-separated cpu_workers values (default: the configured one)")
    tune.add_argument("--items", type=int, help="items per run (default: the workload's own)")
    tune.add_argument(
        "--reps",
        type=int,
        default=3,
        help="timed runs per setting, interleaved; the median is reported (default 3)",
    )
    tune.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout only)")
    tune.add_argument(
        "--out",
        default="schedsvc-tune.toml",
        help="write the recommended settings here as TOML (default schedsvc-tune.toml; '' to skip)",
    )
    tune.add_argument("--plot", metavar="PNG", help="draw throughput, latency and memory against depth")
    tune.set_defaults(run=run)


def _ints(text: str | None, default: Sequence[int], what: str) -> list[int]:
    if text is None:
        return list(default)
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TuneError(f"{what} must be comma-separated integers, e.g. 1,4,16; got {text!r}") from None
    if not values or min(values) < 1:
        raise TuneError(f"{what} must be positive integers, got {text!r}")
    return sorted(set(values))


@dataclass
class _Plan:
    name: str
    workload: Workload
    depths: list[int]
    workers: list[int]
    items: int


def _plan(args: argparse.Namespace) -> _Plan:
    import schedsvc as ss

    if args.reps < 1:
        raise TuneError("--reps must be at least 1")
    if args.items is not None and args.items < 1:
        raise TuneError("--items must be at least 1")
    for flag, path in (("--out", args.out), ("--json", args.json), ("--plot", args.plot)):
        if problem := output_problem(flag, path):
            raise TuneError(problem)
    if ":" in args.workload and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # 'module:function' from where the command runs, as uvicorn does
    workload = load_workload(args.workload)
    items = args.items or DEFAULT_ITEMS.get(args.workload, USER_DEFAULT_ITEMS)
    depths = _ints(args.depths, DEFAULT_DEPTHS, "--depths")
    workers = _ints(args.workers, [ss.Config().cpu_workers], "--workers")
    return _Plan(args.workload, workload, depths, workers, items)


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except TuneError as exc:
        return fail("tune", str(exc))
    can_plot = args.plot is None or _has_matplotlib()
    try:
        report = _sweep_with_progress(plan, args.reps, quiet=args.json == "-")
    except TuneError as exc:
        return fail(f"tune {plan.name}", str(exc), status=1)
    report["out"] = args.out or None
    report["plot"] = args.plot if args.plot and can_plot else None
    _write_outputs(report, args)
    return 0


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"schedsvc tune: --plot needs matplotlib: {PLOT_HINT}; the rest goes on", file=sys.stderr)
        return False
    return True


def _sweep_with_progress(plan: _Plan, reps: int, quiet: bool) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    def go(step: Callable[[str], None] | None) -> dict[str, Any]:
        return sweep(
            plan.workload,
            depths=plan.depths,
            workers=plan.workers,
            items=plan.items,
            reps=reps,
            name=plan.name,
            step=step,
        )

    if quiet:
        return go(None)
    total = len(plan.depths) * len(plan.workers) * (reps + 1)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"tune {plan.name}", total=total)
        return go(lambda line: bar.update(task, advance=1, description=f"tune {plan.name} {line}"))


def _write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.console import Console

    quiet = args.json == "-"
    notes = Console(stderr=quiet, highlight=False)
    if args.out:
        Path(args.out).write_text(toml_text(report, args.out))
    if report["plot"]:
        plot(report, report["plot"])
    if quiet:
        print_json(report)
    else:
        Console(width=None if sys.stdout.isatty() else 120).print(table(report))
    if args.json and not quiet:
        write_json(report, args.json)
    for path in (args.out, report["plot"], None if quiet else args.json):
        if path:
            notes.print(f"wrote {path}")
