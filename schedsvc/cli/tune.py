"""``schedsvc tune``: sweep queue depth (and worker count) on a workload; choose the setting for a goal.

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
            item's submission to the moment the loop learns the last is final;
            the median of the runs, and their middle half (lower to upper
            quartile)
latency     per item: from the moment tune asks the generator for the item
            (so waiting for admission counts) to the moment the event loop
            learns its yielded Future is final (a done callback, which is
            what an ``await`` would see); p50 and p99 by nearest rank, the
            median over the runs
memory      peak bytes allocated during the run and live at once
            (``tracemalloc``; NumPy reports its buffers there), from the
            separate traced pass; and the engine's ``peak_pending_bytes``

The choice (``choose``, a pure function of those figures, in ``_choose``): of
the settings whose p99 latency and peak memory meet the goal's budgets, the
smallest (fewest workers, then smallest depth) whose throughput is within
noise of the fastest such setting (highest median): the upper quartile of its
runs reaches the fastest's lower quartile.  With no setting within budget,
nothing is chosen and the closest setting is named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import gc
import importlib
import inspect
import os
import platform
import statistics
import sys
import textwrap
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._choose import (
    Goal,
    Judged,
    Measured,
    TuneError,
    choose,
    parse_latency,
    parse_memory,
)
from ._common import (
    MiB,
    aligned,
    fail,
    has_rich,
    load_average,
    make_mlp,
    mlp_weights,
    one_blas_thread,
    or_dash,
    output_problem,
    print_json,
    progress,
    runs_phrase,
    text_table,
    usable_cores,
    write_json,
)

if TYPE_CHECKING:
    import numpy as np

    import schedsvc as ss

__all__ = [
    "DEFAULT_DEPTHS",
    "DEFAULT_REPS",
    "NO_SETTING_FITS",
    "WORKLOADS",
    "load_workload",
    "register",
    "run",
    "sweep",
]

#: max_pending values swept by default: 1, 2, 4, ..., 1024.
DEFAULT_DEPTHS: tuple[int, ...] = tuple(2**k for k in range(11))
#: Timed runs per setting by default: quartiles of five runs set one stray run aside.
DEFAULT_REPS = 5
#: The exit status when no setting meets the budgets (1: the workload failed; 2: a bad argument).
NO_SETTING_FITS = 3
WARM_ITEMS = 8
PLOT_HINT = "pip install 'schedsvc[plot]'"

Workload = Callable[..., Any]


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


_NO_BUDGET = Goal()


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
    reps: int = DEFAULT_REPS,
    name: str = "workload",
    goal: Goal = _NO_BUDGET,
    step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every (workers, depth) setting; return the report (rows, the setting chosen for ``goal``
    and why)."""
    settings = [_Setting(w, d) for w in sorted(set(workers)) for d in sorted(set(depths))]
    timed = not inspect.iscoroutinefunction(workload)  # a generator's items have latencies
    load_before = load_average()
    with one_blas_thread():
        for rep in range(reps):
            for s in settings:
                s.runs.append(_items_run(workload, items, s, name, timed, traced=False))
                if step is not None:
                    step(f"rep {rep + 1}/{reps}: workers={s.workers} max_pending={s.depth}")
        for s in settings:
            s.memory = _items_run(workload, items, s, name, timed, traced=True)
            if step is not None:
                step(f"memory: workers={s.workers} max_pending={s.depth}")
    report = _report(name, items, reps, [_row(s, timed) for s in settings], goal)
    report["machine"]["load_average"] = [load_before, load_average()]
    return report


def _items_run(workload: Workload, items: int, s: _Setting, name: str, timed: bool, traced: bool) -> _Run:
    """One run of a setting; a generator that yielded no items fails it (nothing to time, no latency)."""
    run = _run_setting(workload, items, s, traced)
    if timed and not run.latencies:
        raise TuneError(
            f"at cpu_workers={s.workers}, max_pending={s.depth}: workload {name!r} yielded no items "
            f"(asked for {items}), so it has no throughput or latency to measure; make it yield, per item, "
            "the Future (or Tensor) of the item's last task"
        )
    return run


def _run_setting(workload: Workload, items: int, s: _Setting, traced: bool) -> _Run:
    try:
        return asyncio.run(_one_run(workload, items, s.workers, s.depth, traced))
    except TuneError as exc:
        raise TuneError(f"at cpu_workers={s.workers}, max_pending={s.depth}: {exc}") from exc
    except Exception as exc:  # the workload's own error: say where, keep the traceback as the cause
        raise TuneError(
            f"at cpu_workers={s.workers}, max_pending={s.depth}: the workload raised {type(exc).__name__}: {exc}"
        ) from exc


def _row(s: _Setting, timed: bool) -> dict[str, Any]:
    """A setting's figures: medians over its runs (``timed``: with latencies, which every run then has)."""
    from .._telemetry import percentiles

    def median(f: Callable[[_Run], float]) -> float:
        return statistics.median(f(r) for r in s.runs)

    assert s.memory is not None and s.memory.peak_traced_bytes is not None
    p50_ms: float | None = None
    p99_ms: float | None = None
    if timed:  # each run's p50 and p99 from one sort, then the median of each over the runs
        each = [percentiles(r.latencies, (0.5, 0.99)) for r in s.runs]
        p50_ms = statistics.median(p50 for p50, _ in each) * 1e3
        p99_ms = statistics.median(p99 for _, p99 in each) * 1e3
    return {
        "workers": s.workers,
        "max_pending": s.depth,
        "items_per_s": median(lambda r: r.items / r.seconds),
        "tasks_per_s": median(lambda r: r.tasks / r.seconds),
        "p50_ms": p50_ms,
        "p99_ms": p99_ms,
        "peak_mib": s.memory.peak_traced_bytes / MiB,
        "peak_pending_mib": median(lambda r: r.peak_pending_bytes) / MiB,
        "items_per_s_reps": [r.items / r.seconds for r in s.runs],
    }


def _report(name: str, items: int, reps: int, rows: list[dict[str, Any]], goal: Goal) -> dict[str, Any]:
    choice = choose([_measured(r) for r in rows], goal)
    judged = {(j.setting.workers, j.setting.depth): j for j in choice.judged}
    for r in rows:
        j = judged[r["workers"], r["max_pending"]]
        r["items_per_s_quartiles"] = [j.low, j.high]
        r["of_best"] = j.of_best
        r["over_budget"] = list(j.over)
        r["within_noise"] = j.within_noise
        r["chosen"] = choice.chosen is not None and j.setting == choice.chosen.setting
    return {
        "workload": name,
        "items": items,
        "reps": reps,
        "goal": {"max_latency_ms": goal.max_latency_ms, "max_memory_bytes": goal.max_memory_bytes},
        "machine": _machine(),
        "rows": rows,
        "per_workers": _per_workers(rows, goal),
        "recommended": _settings(choice.chosen),
        "closest": _settings(choice.closest),
        "why": choice.why,
    }


def _measured(row: dict[str, Any]) -> Measured:
    reps = tuple(row["items_per_s_reps"])
    return Measured(row["workers"], row["max_pending"], reps, row["p99_ms"], row["peak_mib"] * MiB)


def _per_workers(rows: list[dict[str, Any]], goal: Goal) -> dict[str, int | None]:
    """Worker count -> the max_pending the same rule chooses among that count's settings (None: none fits)."""
    out: dict[str, int | None] = {}
    for w in dict.fromkeys(r["workers"] for r in rows):
        chosen = choose([_measured(r) for r in rows if r["workers"] == w], goal).chosen
        out[str(w)] = None if chosen is None else chosen.setting.depth
    return out


def _settings(j: Judged | None) -> dict[str, int] | None:
    return None if j is None else {"cpu_workers": j.setting.workers, "max_pending": j.setting.depth}


def _machine() -> dict[str, Any]:
    import numpy as np

    import schedsvc

    return {
        "platform": platform.platform(),
        "cpus": usable_cores(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "schedsvc": schedsvc.__version__,
        "blas_threads": 1,
    }


# -- output --------------------------------------------------------------------------------------------


def _goal(report: dict[str, Any]) -> Goal:
    g = report["goal"]
    return Goal(g["max_latency_ms"], g["max_memory_bytes"])


def table(report: dict[str, Any]) -> Any:
    """The report as a rich Table, the chosen setting in bold."""
    from rich import box
    from rich.table import Table

    title, headers, rows, chosen = _table_cells(report)
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for col in headers:
        if col:
            t.add_column(col, justify="right", no_wrap=True)
        else:  # the verdict: wraps rather than being cut off
            t.add_column(col, justify="left", overflow="fold", min_width=12)
    for i, cells in enumerate(rows):
        t.add_row(*cells, style="bold" if i == chosen else None)
    return t


def plain_table(report: dict[str, Any]) -> str:
    """The report as plain text (without rich), the chosen row marked ``<- chosen``."""
    title, headers, rows, _ = _table_cells(report)
    headers = [h.replace("\n", " ") for h in headers]
    return text_table(headers, rows, title, right=len(headers) - 1)


def _verdict(row: dict[str, Any], goal: Goal) -> str:
    """The last cell of a row: over which budget, or chosen, or within noise of the fastest, or fits."""
    if row["over_budget"]:
        return "over: " + ", ".join(row["over_budget"])
    if row["chosen"]:
        return "<- chosen"
    if row["within_noise"]:
        return "within noise"
    return "" if goal == Goal() else "fits"


def _table_cells(report: dict[str, Any]) -> tuple[str, list[str], list[list[str]], int | None]:
    """Title, column headers, rows of cells, and which row is the chosen setting."""
    rows, goal = report["rows"], _goal(report)
    title = f"schedsvc tune {report['workload']}: {report['items']} items, {runs_phrase(report['reps'])}"
    tasks = any(r["tasks_per_s"] != r["items_per_s"] for r in rows)  # else one column says it all
    headers = [
        "cpu\nworkers",
        "max\npending",
        "items/s",
        "middle\nhalf",
        "of\nbest",
        *(["tasks/s"] if tasks else []),
        "p50\nms",
        "p99\nms",
        "peak\nMiB",
        "pending\nMiB",
        "",
    ]
    cells = [
        [
            str(r["workers"]),
            str(r["max_pending"]),
            f"{r['items_per_s']:,.0f}",
            _middle_half(r),
            or_dash(r["of_best"], ".0%"),
            *([f"{r['tasks_per_s']:,.0f}"] if tasks else []),
            or_dash(r["p50_ms"], ".3g"),
            or_dash(r["p99_ms"], ".3g"),
            f"{r['peak_mib']:.2f}",
            f"{r['peak_pending_mib']:.2f}",
            _verdict(r, goal),
        ]
        for r in rows
    ]
    chosen = next((i for i, r in enumerate(rows) if r["chosen"]), None)
    return title, headers, cells, chosen


def _middle_half(row: dict[str, Any]) -> str:
    """A row's items/s from the lower to the upper quartile of its runs: '2,900-3,300'."""
    return "{:,.0f}-{:,.0f}".format(*row["items_per_s_quartiles"])


def summary(report: dict[str, Any]) -> list[str]:
    """What the table means: the goal and the rule, what was chosen and why (or that nothing fits)."""
    goal, m = _goal(report), report["machine"]
    lines = [
        f"goal: {goal.words()}. Rule: of the settings that meet the budgets, the smallest (fewest workers, "
        "then smallest max_pending) whose items/s are within noise of the fastest's: the upper end of its "
        "runs' middle half reaches the lower end of the fastest's.",
    ]
    if note := _runs_note(report["reps"]):
        lines.append(note)
    lines.append(f"machine: {m['cpus']} CPUs, load average {_loads(m)} during the sweep.")
    if report["recommended"] is None:
        lines.append(f"nothing chosen: {report['why']}.")
    else:
        lines.append(f"chosen: {report['why']}.")
    return lines


def _runs_note(reps: int) -> str | None:
    """What a sweep of too few runs per setting can tell of noise (None from 3 runs)."""
    if reps == 1:
        return (
            f"note: 1 run per setting shows no spread to judge noise by, so the fastest setting wins; "
            f"--reps {DEFAULT_REPS} judges it."
        )
    if reps == 2:
        return (
            "note: the noise judgement rests on 2 runs per setting (their middle half lies a quarter of the "
            f"way in from each); --reps {DEFAULT_REPS} judges it on more."
        )
    return None


def _loads(machine: dict[str, Any]) -> str:
    return " -> ".join(or_dash(v, ".2f") for v in machine.get("load_average", [None]))


def settings_toml(report: dict[str, Any]) -> str:
    """The chosen settings as TOML lines (no comments)."""
    rec = report["recommended"]
    return f"cpu_workers = {rec['cpu_workers']}\nmax_pending = {rec['max_pending']}\n"


#: the columns of the table the TOML file keeps in its comments
_TOML_COLUMNS = ("cpu\nworkers", "max\npending", "items/s", "middle\nhalf", "p99\nms", "peak\nMiB", "")


def toml_text(report: dict[str, Any], path: str = "<this file>") -> str:
    """The chosen settings as TOML for ``Config.from_file``, with the goal, the reason and the figures in
    comments."""
    m = report["machine"]
    lines = [
        f"# schedsvc tune {report['workload']}: chosen settings ({report['items']} items, "
        f"{runs_phrase(report['reps'])}).",
        f"# machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, NumPy {m['numpy']}, "
        f"schedsvc {m['schedsvc']}, BLAS at 1 thread; load average {_loads(m)} during the sweep",
        f"# goal: {_goal(report).words()}",
        f"# chosen: {report['why']}.",
        f"# Load with ss.Config.from_file({path!r}); SCHEDSVC_* variables and keywords still win.",
        "#",
    ]
    _, headers, cells, _ = _table_cells(report)  # the printed table's columns, those that matter here
    keep = [i for i, header in enumerate(headers) if header in _TOML_COLUMNS]
    table = [[headers[i].replace("\n", " ") for i in keep], *([row[i] for i in keep] for row in cells)]
    lines += [f"# {line}".rstrip() for line in aligned(table, right=len(keep) - 1)]
    return "\n".join([*lines, "", settings_toml(report)])


_PANELS = (
    ("items_per_s", "items / s (band: middle half of the runs)"),
    ("p99_ms", "latency, ms (p99 solid, p50 dashed)"),
    ("peak_mib", "peak MiB (tracemalloc)"),
)


def plot(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Throughput, latency and peak memory against depth (log2 axis), each worker count's choice starred and
    the budgets drawn, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(7.5, 9), constrained_layout=True)
    for workers in dict.fromkeys(r["workers"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["workers"] == workers]
        _plot_curves(axes, rows, report["per_workers"][str(workers)], f"cpu_workers={workers}")
    _style(axes, report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_curves(axes: Any, rows: list[dict[str, Any]], pick: int | None, label: str) -> None:
    """One worker count: a line per panel, its chosen depth starred with a dotted line through it."""
    depths = [r["max_pending"] for r in rows]
    at = depths.index(pick) if pick is not None else None
    for ax, (key, _) in zip(axes, _PANELS, strict=True):
        if rows[0][key] is None:  # a workload without per-item futures has no latency
            continue
        (line,) = ax.plot(depths, [r[key] for r in rows], "o-", label=label)
        color = line.get_color()
        if at is not None:
            ax.plot(depths[at], rows[at][key], "*", ms=16, color=color, mec="black", zorder=3)
            ax.axvline(depths[at], color=color, ls=":", lw=1)
        if key == "items_per_s":
            middle = [r["items_per_s_quartiles"] for r in rows]
            ax.fill_between(depths, [q[0] for q in middle], [q[1] for q in middle], color=color, alpha=0.15)
        if key == "p99_ms":
            ax.plot(depths, [r["p50_ms"] for r in rows], "o--", color=color, alpha=0.6)


def _style(axes: Any, report: dict[str, Any]) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    goal = _goal(report)
    budgets = {"p99_ms": goal.max_latency_ms, "peak_mib": None}
    if goal.max_memory_bytes is not None:
        budgets["peak_mib"] = goal.max_memory_bytes / MiB
    for ax, (key, label) in zip(axes, _PANELS, strict=True):
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        if budgets.get(key) is not None:
            ax.axhline(budgets[key], color="red", ls="--", lw=1, label="budget")
        if key == "p99_ms":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room above the top point and its star
    rec = report["recommended"]
    axes[0].legend(title="star: chosen", loc="lower right")
    chosen = "no setting meets the budgets" if rec is None else _setting_words(rec)
    axes[0].set_title(f"goal: {goal.words()}; chosen: {chosen}", fontsize=10)
    depths = sorted({r["max_pending"] for r in report["rows"]})
    axes[-1].set_xticks(depths, [str(d) for d in depths])
    axes[-1].set_xlabel("max_pending (queue depth)")
    m = report["machine"]
    axes[0].figure.suptitle(
        f"schedsvc tune {report['workload']}: {report['items']} items, {runs_phrase(report['reps'])}; "
        f"{m['cpus']} CPUs, load average {_loads(m)}\n{m['platform']}, BLAS at 1 thread",
        fontsize=10,
    )


def _setting_words(rec: dict[str, int]) -> str:
    return f"cpu_workers={rec['cpu_workers']}, max_pending={rec['max_pending']}"


# -- the command ------------------------------------------------------------------------------------

_DESCRIPTION = """\
Sweep max_pending (and cpu_workers) on a workload, measure throughput, p50/p99
latency and peak memory at each setting over repeated, interleaved runs, and
choose the setting that suits a goal.

The goal is a budget on latency (--max-latency, on the p99 latency per item:
what a service's latency budget bounds) and/or on memory (--max-memory, on the
peak memory of a run); with neither, the choice is for throughput alone. Of
the settings that meet the budgets, tune chooses the smallest (fewest workers,
then smallest max_pending) whose throughput is within noise of the fastest
such setting: the upper quartile of its runs reaches the fastest's lower
quartile. It prints every setting's figures, which settings meet the budgets
and why the chosen one was chosen, and the settings as TOML; --write saves
them to a file for ss.Config.from_file."""

_EPILOG = f"""\
exit status: 0 a setting was chosen; 1 the workload failed; 2 a bad argument;
{NO_SETTING_FITS} no setting meets the budgets (the closest is named; --write writes nothing).

examples:
  schedsvc tune pipeline --max-latency 50ms
  schedsvc tune mlp --max-latency 5ms --max-memory 64MiB --write tune.toml
  schedsvc tune mypkg.loads:resize --depths 4,16,64 --json report.json --plot tune.png"""


def register(sub: Any) -> None:
    tune = sub.add_parser(
        "tune",
        help="sweep max_pending (and cpu_workers) on a workload; choose the setting for a latency or memory "
        "budget",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_argument("workload", help=f"{', '.join(WORKLOADS)}, or module:function (an async generator)")
    goal = tune.add_argument_group("the goal")
    goal.add_argument(
        "--max-latency",
        metavar="TIME",
        help="p99 latency per item must be at most this, e.g. 50ms, 0.2s, 500us",
    )
    goal.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="peak memory of a run (tracemalloc) must be at most this, e.g. 64MiB, 1GB",
    )
    tune.add_argument("--depths", help="comma-separated max_pending values (default 1,2,4,...,1024)")
    tune.add_argument("--workers", help="comma-separated cpu_workers values (default: the configured one)")
    tune.add_argument("--items", type=int, help="items per run (default: the workload's own)")
    tune.add_argument(
        "--reps",
        type=int,
        default=DEFAULT_REPS,
        help=f"timed runs per setting, interleaved; median and quartiles reported, and with 1 run the fastest "
        f"setting wins (default {DEFAULT_REPS})",
    )
    tune.add_argument(
        "--write",
        metavar="PATH",
        help="write the chosen settings to PATH as TOML, the figures in comments (default: print them)",
    )
    tune.add_argument("--out", dest="write", help=argparse.SUPPRESS)  # the old name of --write
    tune.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout only)")
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
    goal: Goal


def _plan(args: argparse.Namespace) -> _Plan:
    import schedsvc as ss

    if args.reps < 1:
        raise TuneError("--reps must be at least 1")
    if args.items is not None and args.items < 1:
        raise TuneError("--items must be at least 1")
    for flag, path in (("--write", args.write), ("--json", args.json), ("--plot", args.plot)):
        if problem := output_problem(flag, path):
            raise TuneError(problem)
    goal = Goal(
        None if args.max_latency is None else parse_latency(args.max_latency),
        None if args.max_memory is None else parse_memory(args.max_memory),
    )
    if ":" in args.workload and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # 'module:function' from where the command runs, as uvicorn does
    workload = load_workload(args.workload)
    if goal.max_latency_ms is not None and inspect.iscoroutinefunction(workload):
        raise TuneError(
            f"--max-latency: workload {args.workload!r} yields no items, so it has no latency to budget; "
            "make it an async generator that yields each item's last Future"
        )
    items = args.items or DEFAULT_ITEMS.get(args.workload, USER_DEFAULT_ITEMS)
    depths = _ints(args.depths, DEFAULT_DEPTHS, "--depths")
    workers = _ints(args.workers, [ss.Config().cpu_workers], "--workers")
    return _Plan(args.workload, workload, depths, workers, items, goal)


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
    report["write"] = args.write if args.write and report["recommended"] else None
    report["plot"] = args.plot if args.plot and can_plot else None
    _write_outputs(report, args)
    return 0 if report["recommended"] else NO_SETTING_FITS


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"schedsvc tune: --plot needs matplotlib: {PLOT_HINT}; the rest goes on", file=sys.stderr)
        return False
    return True


def _sweep_with_progress(plan: _Plan, reps: int, quiet: bool) -> dict[str, Any]:
    def go(step: Callable[[str], None] | None) -> dict[str, Any]:
        return sweep(
            plan.workload,
            depths=plan.depths,
            workers=plan.workers,
            items=plan.items,
            reps=reps,
            name=plan.name,
            goal=plan.goal,
            step=step,
        )

    if quiet:
        return go(None)
    total = len(plan.depths) * len(plan.workers) * (reps + 1)
    if not has_rich():  # a line per step on stderr
        done = iter(range(1, total + 1))
        return go(lambda line: progress(f"tune {plan.name} {line} ({next(done, total)}/{total})"))
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"tune {plan.name}", total=total)
        return go(lambda line: bar.update(task, advance=1, description=f"tune {plan.name} {line}"))


def _write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    quiet = args.json == "-"
    if report["write"]:
        Path(report["write"]).write_text(toml_text(report, report["write"]))
    if report["plot"]:
        plot(report, report["plot"])
    if quiet:
        print_json(report)
    else:
        _print_report(report, args.write)
    if args.json and not quiet:
        write_json(report, args.json)
    if args.write and not report["write"]:
        print(f"nothing written to {args.write}: no setting meets the budgets", file=sys.stderr)
    for path in (report["write"], report["plot"], None if quiet else args.json):
        if path:
            print(f"wrote {path}", file=sys.stderr if quiet else sys.stdout)


def _print_report(report: dict[str, Any], write: str | None) -> None:
    """The table, what it means, and (when no --write was given) the chosen settings and how to save them."""
    if has_rich():
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 120).print(table(report))
    else:
        print(plain_table(report))
    print()
    print("\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in summary(report)))
    if report["recommended"] and not write:
        print()
        print("the chosen settings, as TOML for ss.Config.from_file:")
        print(settings_toml(report))
        print(
            "to save them, put these lines in a file, or run again with --write PATH "
            "(e.g. --write schedsvc-tune.toml), which adds the figures as comments."
        )
