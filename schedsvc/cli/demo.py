"""``schedsvc demo``: schedsvc's experiments, measured on this machine, beside the claims of the book they test.

The "Computational Performance" chapter of *Dive into Deep Learning* (d2l.ai)
makes a handful of claims about an asynchronous engine: asynchronous
computation, automatic parallelism, memory under a flooded queue, hybridize,
profiling, and CPU/GPU overlap; it also advises running a model a minibatch at
a time, which dynamic batching does for concurrent one-row calls.  Each row of
the table is an experiment of schedsvc's that measures one of them with
schedsvc as the engine.  It comes in four parts, all here but the verdicts:

- the experiments: each a coroutine ``fn(sizes) -> (figures, checks)``;
  ``figures`` are measured quantities (times, ratios, sizes, counts; all
  positive), and ``checks`` are facts the run established (a result equal to
  NumPy's, how many ops the compiler folded).  ``measure`` repeats them,
  interleaved, and keeps the median of every figure (a ratio of two figures
  is computed from their medians: ``DERIVED``).  The GPU experiments run
  only where the engine can run ``cuda`` tasks; elsewhere they are reported as
  skipped, with the reason the engine gives.  Nothing there prints.
- the verdicts (in ``_verdict``): a ``Target`` per claim, the figure that
  bears it out and the value it must reach (a claim that one way is faster
  needs ``FASTER``, 1.1x); ``judge`` says met or missed, and ``verdict_text``
  says so with what may have swayed it: runs on both sides of the target, or,
  for a missed timing, a loaded machine.
- the table: a ``Row`` per claim, saying how to show its experiment's figures
  and the ``Target`` that judges them.
- the command: ``register`` and ``run``, and ``main``, which measures, prints
  the table (or the JSON) and writes the JSON report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import gc
import json
import operator
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

import schedsvc as ss

from ._common import (
    Figures,
    MiB,
    bench_workers,
    cores_phrase,
    digits_rows,
    digits_weights,
    duration,
    fail,
    fancy_func,
    figure,
    gpu_unavailable,
    has_rich,
    load_average,
    make_mlp,
    median_figures,
    mlp_weights,
    one_blas_thread,
    output_problem,
    print_json,
    progress,
    randn_on,
    runs_phrase,
    usable_cores,
    write_json,
)
from ._verdict import AT_ONCE, FASTER, LOADED_SHARE, Checks, Target, judge, loaded, verdict_text

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "AT_ONCE",
    "EXPERIMENTS",
    "FASTER",
    "FULL",
    "GPU_EXPERIMENTS",
    "LOADED_SHARE",
    "QUICK",
    "SECTIONS",
    "Sizes",
    "Target",
    "gpu_unavailable",
    "judge",
    "loaded",
    "main",
    "measure",
    "register",
    "run",
    "verdict_text",
]

Result = tuple[Figures, Checks]


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """Problem sizes; ``FULL`` follows the book, ``QUICK`` takes a second or two in all."""

    queued_side: int = 2000  # c = a * b + 2 on side x side arrays
    loop_ops: int = 1000  # y = x + 1, N times
    dots: int = 8  # independent np.dot (and the length of the dependent chain)
    dot_side: int = 1000
    batches: int = 100  # the book's data_iter: 100 batches of 1024 x 512
    batch_rows: int = 1024
    features: int = 512
    bound_batches: int = 8  # max_pending_bytes, in batches (16 MiB at full size)
    calls: int = 1000  # MLP and fancy_func calls
    row_calls: int = 1797  # concurrent one-row calls of the digits MLP (the digits set's rows)
    fancy_len: int = 100
    trace_dots: int = 8
    trace_side: int = 200
    trace_chain: int = 16
    gpu_side: int = 4096
    gpu_ops: int = 16
    gpu_randn: int = 10  # the book's GPU experiment: (randn, matmul) pairs
    gpu_randn_side: int = 1000


FULL = Sizes()
QUICK = Sizes(
    queued_side=300,
    loop_ops=100,
    dots=4,
    dot_side=200,
    batches=12,
    batch_rows=128,
    features=256,
    bound_batches=4,
    calls=50,
    row_calls=300,
    fancy_len=10,
    trace_dots=4,
    trace_side=50,
    trace_chain=4,
    gpu_side=256,
    gpu_ops=4,
    gpu_randn=3,
    gpu_randn_side=256,
)


# -- figures computed from other figures --------------------------------------------------

#: a figure computed from others -> (the figures it needs, how).  Recomputed from the medians of those
#: figures, so that a ratio printed beside two times is the ratio of those times.  The median of the runs'
#: own ratios is not: runs of 485, 600 and 300 ms on 1 worker against 533, 354 and 340 ms on 2 have
#: medians of 485 and 354 ms, a ratio of 1.37x, but their own ratios' median is 0.91x.
DERIVED: dict[str, tuple[tuple[str, ...], Callable[..., float]]] = {
    "result_over_submit": (("result_ms", "submit_us"), lambda ms, us: ms * 1e3 / us),
    "awaited_over_queued": (("awaited_us", "queued_us"), operator.truediv),
    "independent_speedup": (("independent_1worker_s", "independent_nworkers_s"), operator.truediv),
    "chain_speedup": (("chain_1worker_s", "chain_nworkers_s"), operator.truediv),
    "bounded_time_ratio": (("bounded_s", "unbounded_s"), operator.truediv),
    "synced_time_ratio": (("synced_s", "unbounded_s"), operator.truediv),
    "unbounded_over_bounded_peak": (("unbounded_peak_mib", "bounded_peak_mib"), operator.truediv),
    "eager_over_compiled": (("eager_us", "compiled_us"), operator.truediv),
    "compiled_over_numpy": (("compiled_us", "numpy_us"), operator.truediv),
    "rows_per_batch": (("rows", "batches"), operator.truediv),
    "loop_over_batched": (("loop_us", "batched_us"), operator.truediv),
    "finish_over_queue": (("finish_s", "queue_s"), operator.truediv),
    "sum_over_both": (("cpu_s", "gpu_s", "both_s"), lambda cpu, gpu, both: (cpu + gpu) / both),
    "serial_over_overlapped": (("serial_s", "overlapped_s"), operator.truediv),
    "speedup": (("one_s", "all_s"), operator.truediv),
}


def derived(figures: Figures) -> Figures:
    """``figures`` and every ``DERIVED`` figure that can be computed from them."""
    out = dict(figures)
    for name, (needs, fn) in DERIVED.items():
        if all(need in figures for need in needs):
            out[name] = fn(*(figures[need] for need in needs))
    return out


#: says what a long experiment is doing now (``measure`` sets it; nothing is said outside a run)
_STEP: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "demo_step", default=None
)


def step(what: str) -> None:
    """Progress within an experiment: the part of it that starts now."""
    report = _STEP.get()
    if report is not None:
        report(what)


# -- asynchronous computation -------------------------------------------------------------


async def queued(s: Sizes) -> Result:
    """c = a * b + 2: submitting returns at once; the result comes when the work is done."""
    rng = np.random.default_rng(0)
    a, b = rng.random((s.queued_side, s.queued_side)), rng.random((s.queued_side, s.queued_side))
    async with ss.Engine() as eng:
        t0 = time.perf_counter()
        prod = eng.submit_nowait(np.multiply, a, b)
        c = eng.submit_nowait(np.add, prod, 2)
        t1 = time.perf_counter()
        value = await c
        t2 = time.perf_counter()
    figures = derived({"submit_us": (t1 - t0) * 1e6, "result_ms": (t2 - t0) * 1e3})
    return figures, {"equals_numpy": bool(np.array_equal(value, a * b + 2))}


def _add_one_stamped(x: np.ndarray) -> tuple[np.ndarray, float]:
    """y = x + 1, and when it finished (so the awaiting side can split the round trip)."""
    return x + 1, time.perf_counter()


async def loop(s: Sizes) -> Result:
    """The book's ``for _ in range(1000): y = x + 1``: awaited op by op, and queued then waited once.

    Both loops are split into the book's three phases: t1 the frontend
    queues the op, t2 the backend takes and runs it, t3 the result reaches
    the frontend.  Tiny ops are run by an awaiting coroutine itself unless
    ``inline_threshold_us=0``; the phases use the worker path.
    """
    n, x = s.loop_ops, np.ones(1)
    figures: Figures = {}
    async with ss.Engine(inline_threshold_us=0, max_pending=4 * n) as eng:
        await eng.run(_add_one_stamped, x)  # warm
        figures.update(await _awaited_phases(eng, x, n))
        figures.update(await _queued_loop(eng, x, n))
    async with ss.Engine(max_pending=4 * n) as eng:
        await eng.run(np.add, x, 1)
        t0 = time.perf_counter()
        for _ in range(n):
            await eng.run(np.add, x, 1)
        figures["awaited_inline_us"] = (time.perf_counter() - t0) / n * 1e6
    return derived(figures), {"ops": n}


async def _awaited_phases(eng: ss.Engine, x: np.ndarray, n: int) -> Figures:
    t1 = t2 = t3 = 0.0
    start = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        fut = eng.submit_nowait(_add_one_stamped, x)
        b = time.perf_counter()
        _, end = await fut
        c = time.perf_counter()
        t1, t2, t3 = t1 + b - a, t2 + end - b, t3 + c - end
    total = time.perf_counter() - start
    return {
        "awaited_us": total / n * 1e6,
        "awaited_ms": total * 1e3,
        "t1_us": t1 / n * 1e6,
        "t2_us": t2 / n * 1e6,
        "t3_us": t3 / n * 1e6,
    }


async def _queued_loop(eng: ss.Engine, x: np.ndarray, n: int) -> Figures:
    """Queued then waited once, split the book's way: t1 + N*t2 + t3.

    t1: one submission; N*t2: from the first submission's return to the last
    op's end (the backend's work, overlapping later submissions); t3: from the
    last op's end until ``waitall`` returns.
    """
    t0 = time.perf_counter()
    futs = [eng.submit_nowait(_add_one_stamped, x) for _ in range(n)]
    t1 = time.perf_counter()
    await eng.waitall()
    t2 = time.perf_counter()
    last_end = max([(await f)[1] for f in futs])
    submit = (t1 - t0) / n
    return {
        "queued_us": (t2 - t0) / n * 1e6,
        "queued_ms": (t2 - t0) * 1e3,
        "queued_frontend_ms": (t1 - t0) * 1e3,
        "queued_t1_us": submit * 1e6,
        "queued_t2_us": (last_end - t0 - submit) / n * 1e6,
        "queued_t3_us": (t2 - last_end) * 1e6,
    }


# -- automatic parallelism ----------------------------------------------------------------


async def _dots(workers: int, mats: list[np.ndarray], chain: bool) -> float:
    """Seconds for the dots on ``workers`` threads: each on its own matrix, or each on the previous result."""
    async with ss.Engine(cpu_workers=workers) as eng:
        await eng.run(np.dot, mats[0], mats[0])  # warm
        t0 = time.perf_counter()
        if chain:
            prev: Any = mats[0]
            for m in mats:
                prev = eng.submit_nowait(np.dot, prev, m)
        else:
            for m in mats:
                eng.submit_nowait(np.dot, m, m)
        await eng.waitall()
        return time.perf_counter() - t0


async def parallel(s: Sizes) -> Result:
    """Independent dots on 1 worker and on all of them; then a dependent chain of as many dots."""
    rng = np.random.default_rng(0)
    # scaled so that a chain of products stays near 1 instead of overflowing
    mats = [rng.random((s.dot_side, s.dot_side)) * (2 / s.dot_side) for _ in range(s.dots)]
    n = bench_workers()
    figures: Figures = {}
    for kind, chain in (("independent", False), ("chain", True)):
        step(f"{kind} dots on 1 worker")
        figures[f"{kind}_1worker_s"] = await _dots(1, mats, chain)
        step(f"{kind} dots on {n} workers")
        figures[f"{kind}_nworkers_s"] = await _dots(n, mats, chain)
    return derived(figures), {"workers": n, "dots": s.dots}


# -- memory and backpressure --------------------------------------------------------------


_MODES = {"unbounded": "no limit", "bounded": "max_pending_bytes", "synced": "awaited once per batch"}


async def _flood(s: Sizes, mode: str) -> tuple[float, float]:
    """Peak traced bytes and seconds for a producer of batches: 'unbounded', 'bounded' or 'synced'."""
    rng = np.random.default_rng(0)
    w = rng.random((s.features, s.features), dtype=np.float32)
    batch_bytes = s.batch_rows * s.features * 4

    def step(batch: np.ndarray) -> float:
        return float((batch @ w).sum())

    limits: dict[str, Any] = {"max_pending_bytes": s.bound_batches * batch_bytes} if mode == "bounded" else {}
    async with ss.Engine(max_pending=4 * s.batches, **limits) as eng:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        for _ in range(s.batches):
            batch = rng.random((s.batch_rows, s.features), dtype=np.float32)
            fut = await eng.submit(step, batch, reads=w, nbytes=batch_bytes)
            del batch
            if mode == "synced":  # the book's advice: one sync point per minibatch
                await fut
        await eng.waitall()
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    return peak, elapsed


async def memory(s: Sizes) -> Result:
    """A fast producer of batches, without a limit, with ``max_pending_bytes``, and synced per batch."""
    figures: Figures = {}
    for mode in ("unbounded", "bounded", "synced"):
        step(f"{s.batches} batches, {_MODES[mode]}")
        peak, seconds = await _flood(s, mode)
        figures |= {f"{mode}_peak_mib": peak / MiB, f"{mode}_s": seconds}
    figures["bound_mib"] = s.bound_batches * s.batch_rows * s.features * 4 / MiB
    figures["batch_mib"] = s.batch_rows * s.features * 4 / MiB
    return derived(figures), {"batches": s.batches}


# -- hybridize --------------------------------------------------------------------------------


async def _per_call_us(eng: ss.Engine, fn: Callable[..., Any], args: list[Any], calls: int) -> float:
    """Microseconds per call, ``calls`` calls queued and then waited for once."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    await eng.waitall()
    return (time.perf_counter() - t0) / calls * 1e6


async def mlp(s: Sizes) -> Result:
    """The book's MLP (Dense 512-256-128-2, batch 1): NumPy, engine Tensors, compiled."""
    net = make_mlp(mlp_weights())
    x = np.random.default_rng(1).standard_normal((1, 512))
    t0 = time.perf_counter()
    for _ in range(s.calls):
        net(x)
    figures = {"numpy_us": (time.perf_counter() - t0) / s.calls * 1e6}
    async with ss.Engine(cpu_workers=2, max_pending=16 * s.calls) as eng:
        xt = eng.asarray(x)
        compiled = eng.compile(net)
        expected = await net(xt)  # warms the eager path
        same = np.array_equal(await compiled(xt), expected)  # the first call traces; not timed
        figures["eager_us"] = await _per_call_us(eng, net, [xt], s.calls)
        figures["compiled_us"] = await _per_call_us(eng, compiled, [xt], s.calls)
        traces = compiled.stats()["traces"]
    return derived(figures), {"compiled_equals_eager": bool(same), "traces": traces}


async def fancy(s: Sizes) -> Result:
    """fancy_func: tasks and time per call eager vs compiled; on constants the compiler folds it to 10."""
    arrays = [np.full(s.fancy_len, float(v)) for v in (1, 2, 3, 4)]
    async with ss.Engine(cpu_workers=2, max_pending=16 * s.calls) as eng:
        tensors = [eng.asarray(a) for a in arrays]
        compiled = eng.compile(fancy_func)
        await compiled(*tensors)
        figures: Figures = {}
        for kind, fn in (("eager", fancy_func), ("compiled", compiled)):
            before = eng.stats().submitted
            figures[f"{kind}_us"] = await _per_call_us(eng, fn, tensors, s.calls)
            figures[f"{kind}_tasks_per_call"] = (eng.stats().submitted - before) / s.calls
        folded = eng.compile(lambda: fancy_func(*(eng.full((), float(v)) for v in (1, 2, 3, 4))))
        value = await folded()
        figures["folded_us"] = await _per_call_us(eng, folded, [], s.calls)
    report = folded.graph.report
    figures = derived(figures)
    checks = {"folded_value": float(value), "folded_traced_ops": report["traced"]}
    checks |= {"folded_ops": report["folded"], "folded_kept_ops": report["kept"]}
    return figures, checks


async def serialise(s: Sizes) -> Result:
    """Save the compiled MLP's graph to JSON, load it without the Python source, and run it."""
    x = np.random.default_rng(1).standard_normal((1, 512))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.json")
        async with ss.Engine(cpu_workers=2) as eng:
            xt = eng.asarray(x)
            compiled = eng.compile(make_mlp(mlp_weights()))
            expected = await compiled(xt)
            t0 = time.perf_counter()
            compiled.save(path)
            t1 = time.perf_counter()
            loaded = ss.load(path, eng)
            t2 = time.perf_counter()
            got = await loaded(xt)
            t3 = time.perf_counter()
            size = os.path.getsize(path)
    figures = {"file_kib": size / 1024, "save_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3}
    figures["loaded_call_ms"] = (t3 - t2) * 1e3
    checks = {"loaded_equals_compiled": bool(np.array_equal(got, expected))}
    return figures, checks | {"loaded_traces": loaded.stats()["traces"]}


async def _row_calls(mlp: Any, x: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """A call per row, all made at once by this coroutine, then each awaited: seconds, and the rows."""
    t0 = time.perf_counter()
    calls = [mlp(x[i : i + 1]) for i in range(len(x))]
    out = [await call for call in calls]
    return time.perf_counter() - t0, out


async def batching(s: Sizes) -> Result:
    """Concurrent one-row calls of a digits-sized MLP batched by the engine, against a plain loop over the rows."""
    fn, x = make_mlp(digits_weights()), digits_rows(s.row_calls)
    fn(x[:1])  # warm
    t0 = time.perf_counter()
    expected = [fn(x[i : i + 1]) for i in range(len(x))]
    figures = {"loop_us": (time.perf_counter() - t0) / len(x) * 1e6}
    async with ss.Engine(cpu_workers=bench_workers(), max_pending=2 * len(x)) as eng:
        mlp = eng.compile(fn, batch_axis=0)
        await _row_calls(mlp, x)  # the batch sizes' first calls trace (and prove the rows apart): not timed
        before = mlp.stats()
        seconds, out = await _row_calls(mlp, x)
        after = mlp.stats()
    figures["batched_us"] = seconds / len(x) * 1e6
    figures["batches"] = after["batches"] - before["batches"]
    figures["rows"] = len(x)
    # the default mode runs one product per layer for the batch: rows equal the loop's within rounding
    close = all(np.allclose(o, e, rtol=1e-12, atol=1e-12) for o, e in zip(out, expected, strict=True))
    return derived(figures), {"batched_close_to_loop": close, "rows": after["rows"] - before["rows"]}


# -- profiling ----------------------------------------------------------------------------------


async def profile(s: Sizes) -> Result:
    """A small DAG inside ``eng.trace(path)``: independent dots, a join, a chain; count what the file holds."""
    rng = np.random.default_rng(0)
    mats = [rng.random((s.trace_side, s.trace_side)) for _ in range(s.trace_dots)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        async with ss.Engine() as eng:
            with eng.trace(path) as timeline:
                dots = [eng.submit_nowait(np.dot, m, m, name="dot") for m in mats]
                link: Any = eng.submit_nowait(sum, dots, name="join")
                for _ in range(s.trace_chain):
                    link = eng.submit_nowait(np.add, link, 1, name="chain")
                await eng.waitall()
            recorded = timeline.recorded
        size = os.path.getsize(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    figures = _trace_counts(events) | {"file_kib": size / 1024}
    return figures, {"tasks": s.trace_dots + 1 + s.trace_chain, "spans_recorded": recorded}


def _trace_counts(events: list[dict[str, Any]]) -> Figures:
    def count(ph: str, name: str | None = None) -> float:
        return float(sum(1 for e in events if e["ph"] == ph and (name is None or e["name"] == name)))

    return {
        "spans": count("X"),
        "tracks": count("M", "thread_name"),
        "flow_arrows": count("s"),
        "counter_samples": count("C", "pending tasks"),
    }


# -- GPU ------------------------------------------------------------------------------------------


def _devices(*names: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(("cpu", *names)))


async def _matmuls_s(eng: ss.Engine, xs: list[Any], count: int) -> float:
    """Seconds for ``count`` products x @ x, spread round robin over ``xs``, queued then waited for."""
    t0 = time.perf_counter()
    for i in range(count):
        x = xs[i % len(xs)]
        x @ x  # queued: waitall waits for it
    await eng.waitall()
    return time.perf_counter() - t0


async def gpu_queued(s: Sizes, gpu: str = "cuda:0") -> Result:
    """The book's GPU experiment: (randn, matmul) pairs queued on the GPU, then waited for."""
    from ..devices.cuda import api_for

    config = ss.Config()
    randn = functools.partial(randn_on, api_for(config.cuda_simulator).xp)
    async with ss.Engine(config, devices=_devices(gpu)) as eng:
        warm = eng.submit_nowait(randn, s.gpu_randn_side, device=gpu)
        await eng.run(np.matmul, warm, warm, device=gpu)  # the generator and cuBLAS
        t0 = time.perf_counter()
        for _ in range(s.gpu_randn):
            x = eng.submit_nowait(randn, s.gpu_randn_side, device=gpu)
            eng.submit_nowait(np.matmul, x, x, device=gpu)
        queued = time.perf_counter() - t0
        await eng.waitall()
        finished = time.perf_counter() - t0
    return derived({"queue_s": queued, "finish_s": finished}), {"device": gpu}


async def cpu_gpu(s: Sizes, gpu: str = "cuda:0") -> Result:
    """Products on the CPU alone, on the GPU alone, and both queued together."""
    a = np.random.default_rng(0).random((s.gpu_side, s.gpu_side), dtype=np.float32)
    host_side = max(64, s.gpu_side // 4)  # the CPU is far slower: give it a smaller share
    async with ss.Engine(devices=_devices(gpu)) as eng:
        on_cpu: Any
        on_gpu: Any
        on_cpu, on_gpu = eng.asarray(a[:host_side, :host_side]), eng.asarray(a, device=gpu)
        await (on_cpu @ on_cpu)
        await (on_gpu @ on_gpu)
        cpu_s = await _matmuls_s(eng, [on_cpu], s.gpu_ops)
        gpu_s = await _matmuls_s(eng, [on_gpu], s.gpu_ops)
        both_s = await _matmuls_s(eng, [on_cpu, on_gpu], 2 * s.gpu_ops)
    return derived({"cpu_s": cpu_s, "gpu_s": gpu_s, "both_s": both_s}), {"device": gpu}


async def copy_overlap(s: Sizes, gpu: str = "cuda:0") -> Result:
    """Products on the GPU, each copied to the host: one at a time, then all queued (copies overlap compute)."""
    a = np.random.default_rng(0).random((s.gpu_side, s.gpu_side), dtype=np.float32)
    async with ss.Engine(devices=_devices(gpu)) as eng:
        x: Any = eng.asarray(a, device=gpu)
        await eng.run(np.asarray, x @ x, device="cpu")  # warm both directions
        t0 = time.perf_counter()
        for _ in range(s.gpu_ops):
            await eng.run(np.asarray, x @ x, device="cpu")  # the task's device pulls its input to the host
        t1 = time.perf_counter()
        for _ in range(s.gpu_ops):
            eng.submit_nowait(np.asarray, x @ x, device="cpu")
        await eng.waitall()
        t2 = time.perf_counter()
    return derived({"serial_s": t1 - t0, "overlapped_s": t2 - t1}), {"device": gpu}


async def multi_gpu(s: Sizes, gpus: tuple[str, ...] = ("cuda:0", "cuda:1")) -> Result:
    """The same products on the first GPU alone and spread over all of them."""
    a = np.random.default_rng(0).random((s.gpu_side, s.gpu_side), dtype=np.float32)
    async with ss.Engine(devices=_devices(*gpus)) as eng:
        xs: list[Any] = [eng.asarray(a, device=g) for g in gpus]
        for x in xs:
            await (x @ x)
        one_s = await _matmuls_s(eng, xs[:1], s.gpu_ops)
        all_s = await _matmuls_s(eng, xs, s.gpu_ops)
    return derived({"one_s": one_s, "all_s": all_s}), {"devices": list(gpus)}


# -- the runs --------------------------------------------------------------------------------------

Experiment = Callable[[Sizes], Coroutine[Any, Any, Result]]

EXPERIMENTS: dict[str, Experiment] = {
    "queued": queued,
    "loop": loop,
    "parallel": parallel,
    "memory": memory,
    "mlp": mlp,
    "fancy": fancy,
    "serialise": serialise,
    "batching": batching,
    "profile": profile,
}

#: GPU experiments and the devices each needs.
GPU_EXPERIMENTS: dict[str, tuple[Experiment, tuple[str, ...]]] = {
    "gpu_queued": (gpu_queued, ("cuda:0",)),
    "cpu_gpu": (cpu_gpu, ("cuda:0",)),
    "copy_overlap": (copy_overlap, ("cuda:0",)),
    "multi_gpu": (multi_gpu, ("cuda:0", "cuda:1")),
}


#: why the GPU experiments do not run on the CUDA simulator
SIMULATED_SKIP = (
    "the configuration runs cuda devices on the CUDA simulator (SCHEDSVC_CUDA_SIMULATOR): simulated "
    "devices are not timed as if they were real (schedsvc bench gpu --simulate runs them, labelled)"
)


def _skips() -> dict[str, str]:
    """GPU experiment -> why it cannot run here (absent when it can)."""
    if ss.Config().cuda_simulator:
        return dict.fromkeys(GPU_EXPERIMENTS, SIMULATED_SKIP)
    reasons: dict[str, str | None] = {}
    skips = {}
    for key, (_, devices) in GPU_EXPERIMENTS.items():
        for device in devices:
            if device not in reasons:
                reasons[device] = gpu_unavailable(device)
            reason = reasons[device]
            if reason is not None:
                skips[key] = reason
                break
    return skips


def measure(
    reps: int = 3, sizes: Sizes = FULL, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Every experiment ``reps`` times, interleaved; medians of the figures, checks of the last run."""
    t0 = time.perf_counter()
    load_before = load_average()  # before the runs add their own load
    skips = _skips()
    todo = dict(EXPERIMENTS) | {k: fn for k, (fn, _) in GPU_EXPERIMENTS.items() if k not in skips}
    samples: dict[str, list[Result]] = {key: [] for key in todo}
    with one_blas_thread():  # parallel speed-up must come from the engine, not from BLAS
        for rep in range(reps):
            for key, fn in todo.items():
                samples[key].append(_run(fn, sizes, f"run {rep + 1}/{reps}: {key}", progress))
                gc.collect()
    experiments: dict[str, Any] = {key: _summary(results) for key, results in samples.items()}
    experiments |= {key: {"status": "skipped", "reason": reason} for key, reason in skips.items()}
    return {
        "reps": reps,
        "sizes": dataclasses.asdict(sizes),
        "cpu_workers": bench_workers(),
        "blas_threads": 1,
        "experiments": experiments,
        "wall_s": time.perf_counter() - t0,
        "load": {"before": load_before, "after": load_average(), "cores": usable_cores()},
    }


def _run(fn: Experiment, sizes: Sizes, what: str, progress: Callable[[str], None] | None) -> Result:
    """One run of an experiment, saying ``what`` it is (and, for a long one, each part) to ``progress``."""
    if progress is None:
        return asyncio.run(fn(sizes))
    progress(what)
    token = _STEP.set(lambda part: progress(f"{what}: {part}"))
    try:
        return asyncio.run(fn(sizes))
    finally:
        _STEP.reset(token)


def _summary(results: list[Result]) -> dict[str, Any]:
    """The median of each measured figure; the ``DERIVED`` ones computed from those medians; the range of
    each over the runs; the checks of the last run."""
    runs = [f for f, _ in results]
    medians = derived(median_figures([{k: v for k, v in f.items() if k not in DERIVED} for f in runs]))
    figures = {k: medians[k] for k in runs[0]}
    spread = {k: [min(f[k] for f, _ in results), max(f[k] for f, _ in results)] for k in figures}
    return {"status": "measured", "figures": figures, "range": spread, "checks": results[-1][1]}


# -- the table: a row per claim of the book ---------------------------------------------------------------


_MAX_WIDTH = 120

Fmt = Callable[[dict[str, float], dict[str, Any], Sizes], str]


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: what ran, how to show its figures, and what the book says."""

    experiment: str
    label: str  # formatted with s=Sizes
    claim: str
    measured: Fmt
    target: Target | None = None  # when the measurement bears the claim out (None: no verdict)


def _show_queued(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    same = "equal to NumPy's" if c["equals_numpy"] else "DIFFERENT from NumPy's"
    return f"submit returned in {figure(f['submit_us'])} µs; the result ({same}) came at {figure(f['result_ms'])} ms"


def _show_loop(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"awaited op by op: {figure(f['awaited_ms'])} ms ({figure(f['awaited_us'])} µs/op through a worker; "
        f"{figure(f['awaited_inline_us'])} µs/op when tiny ops run in the awaiting coroutine); "
        f"queued, then one wait: {figure(f['queued_ms'])} ms, {figure(f['awaited_over_queued'])}x faster"
    )


def _show_cost(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    per_op = f["t1_us"] + f["t2_us"] + f["t3_us"]
    return (
        f"awaited: t1 {figure(f['t1_us'])} + t2 {figure(f['t2_us'])} + t3 {figure(f['t3_us'])} = {figure(per_op)} µs, "
        f"N times = {figure(s.loop_ops * per_op / 1e3)} ms. Queued: t1 {figure(f['queued_t1_us'])} µs + "
        f"N·t2 {figure(s.loop_ops * f['queued_t2_us'] / 1e3)} ms (t2 {figure(f['queued_t2_us'])} µs) + "
        f"t3 {figure(f['queued_t3_us'])} µs; the frontend was done queueing at {figure(f['queued_frontend_ms'])} ms"
    )


def _show_speedup(kind: str) -> Fmt:
    def fmt(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
        return (
            f"1 worker {duration(f[f'{kind}_1worker_s'])}, {c['workers']} workers "
            f"{duration(f[f'{kind}_nworkers_s'])}: {figure(f[f'{kind}_speedup'])}x"
        )

    return fmt


def _show_memory(mode: str) -> Fmt:
    def fmt(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
        text = f"peak {figure(f[f'{mode}_peak_mib'])} MiB, {duration(f[f'{mode}_s'])}"
        if mode != "unbounded":
            text += f" ({figure(f[f'{mode}_time_ratio'])}x the time without a limit)"
        return text

    return fmt


def _show_mlp(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"NumPy {figure(f['numpy_us'])} µs/call; engine Tensors, eager {figure(f['eager_us'])} µs; "
        f"compiled {figure(f['compiled_us'])} µs: {figure(f['eager_over_compiled'])}x faster than eager, "
        f"{figure(f['compiled_over_numpy'])}x NumPy's time"
    )


def _show_fancy(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"eager: {f['eager_tasks_per_call']:.0f} tasks, {figure(f['eager_us'])} µs per call; compiled: "
        f"{f['compiled_tasks_per_call']:.0f} task, {figure(f['compiled_us'])} µs ({figure(f['eager_over_compiled'])}x)"
    )


def _show_folded(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"{c['folded_traced_ops']} traced ops, {c['folded_ops']} folded, {c['folded_kept_ops']} left: "
        f"the graph returns the constant {c['folded_value']:g}; a call costs {figure(f['folded_us'])} µs"
    )


def _show_serialise(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    same = "the same result bit for bit" if c["loaded_equals_compiled"] else "a DIFFERENT result"
    return (
        f"{figure(f['file_kib'])} KiB of JSON, saved in {figure(f['save_ms'])} ms; ss.load took {figure(f['load_ms'])} ms "
        f"(no source, {c['loaded_traces']} traces); its first call {figure(f['loaded_call_ms'])} ms gave {same}"
    )


def _show_batching(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    same = (
        "every row equal to the loop's within rounding"
        if c["batched_close_to_loop"]
        else "rows DIFFERENT from the loop's"
    )
    return (
        f"plain loop, a row at a time: {figure(f['loop_us'])} µs/row; batched by the engine: {figure(f['batched_us'])} "
        f"µs/row, {figure(f['loop_over_batched'])}x the loop's throughput, in {f['batches']:.0f} batches "
        f"({figure(f['rows_per_batch'])} rows each on average); {same}"
    )


def _show_profile(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"{f['spans']:.0f} spans on {f['tracks']:.0f} thread tracks, {f['flow_arrows']:.0f} dependency "
        f"arrows, {f['counter_samples']:.0f} counter samples: {figure(f['file_kib'])} KiB of Chrome trace JSON "
        "(open it in ui.perfetto.dev)"
    )


def _show_gpu_queued(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"queued in {duration(f['queue_s'])}, finished after {duration(f['finish_s'])} "
        f"({figure(f['finish_over_queue'])}x the time to queue)"
    )


def _show_cpu_gpu(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"CPU alone {duration(f['cpu_s'])}, GPU alone {duration(f['gpu_s'])}, both queued together "
        f"{duration(f['both_s'])} ({figure(f['sum_over_both'])}x less than one after the other)"
    )


def _show_copy_overlap(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"each product awaited on the host in turn {duration(f['serial_s'])}; all queued "
        f"{duration(f['overlapped_s'])} ({figure(f['serial_over_overlapped'])}x)"
    )


def _show_multi_gpu(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return f"1 GPU {duration(f['one_s'])}, {len(c['devices'])} GPUs {duration(f['all_s'])}: {figure(f['speedup'])}x"


#: (section title, rows), in the order of the book.
SECTIONS: list[tuple[str, list[Row]]] = [
    (
        "Asynchronous computation",
        [
            Row(
                "queued",
                "c = a * b + 2, {s.queued_side}x{s.queued_side}",
                "The frontend only puts the work in the backend's queue and returns; it waits "
                "when it needs the result (print c).",
                _show_queued,
                Target(
                    "result time / submit time",
                    "result_over_submit",
                    ">=",
                    AT_ONCE,
                    holds=(("equals_numpy", "the result differs from NumPy's"),),
                ),
            ),
            Row(
                "loop",
                "{s.loop_ops:,} x (y = x + 1)",
                "Synchronous 3.56 s, asynchronous 1.05 s for 1,000 ops (TensorFlow): not waiting "
                "for each op is faster.",
                _show_loop,
                Target("speed-up", "awaited_over_queued", ">=", FASTER),
            ),
            Row(
                "loop",
                "the cost model, same loops",
                "Per op, t1 to queue, t2 to compute, t3 to return: N(t1+t2+t3) synchronously, "
                "t1 + N·t2 + t3 asynchronously (if N·t2 > (N-1)·t1).",
                _show_cost,
                Target(
                    "N·t2",
                    lambda f, c: c["ops"] * f["queued_t2_us"] / 1e3,
                    ">=",
                    lambda f, c: (c["ops"] - 1) * f["queued_t1_us"] / 1e3,
                    unit="ms",
                    target_words="N-1 times t1",
                ),
            ),
        ],
    ),
    (
        "Automatic parallelism",
        [
            Row(
                "parallel",
                "{s.dots} independent np.dot, {s.dot_side}x{s.dot_side}",
                "The backend sees no dependency between them and runs them in parallel "
                "(BLAS held at 1 thread here, so the speed-up is the engine's).",
                _show_speedup("independent"),
                Target("speed-up", "independent_speedup", ">=", FASTER),
            ),
            Row(
                "parallel",
                "a chain of {s.dots} np.dot",
                "Operations that depend on each other cannot be parallelised.",
                _show_speedup("chain"),
                Target("speed-up", "chain_speedup", "<=", FASTER),
            ),
        ],
    ),
    (
        "Memory and backpressure",
        [
            Row(
                "memory",
                "{s.batches} batches {s.batch_rows}x{s.features} float32, no limit",
                "With no sync point, the frontend hands the backend many batches at once, "
                "which can take much more memory.",
                _show_memory("unbounded"),
                Target("peak / the bounded run's", "unbounded_over_bounded_peak", ">=", 2, timed=False),
            ),
            Row(
                "memory",
                "the same, max_pending_bytes = {s.bound_batches} batches",
                "Do not hand the backend too many tasks at once. (Here await submit waits for room, "
                "with no sync point in the loop.)",
                _show_memory("bounded"),
                Target(
                    "peak",
                    "bounded_peak_mib",
                    "<=",
                    lambda f, c: f["bound_mib"] + f["batch_mib"],
                    unit="MiB",
                    target_words="the bound plus a batch",
                    timed=False,
                ),
            ),
            Row(
                "memory",
                "the same, awaited once per batch",
                "Sync once per minibatch to keep the frontend and the backend in step.",
                _show_memory("synced"),
                Target(
                    "peak",
                    "synced_peak_mib",
                    "<=",
                    lambda f, c: 3 * f["batch_mib"],
                    unit="MiB",
                    target_words="three batches",
                    timed=False,
                ),
            ),
        ],
    ),
    (
        "Hybridize: imperative and symbolic",
        [
            Row(
                "mlp",
                "MLP 512-256-128-2, {s.calls:,} calls",
                "Eager 1.28 s, graph mode (tf.function) 0.58 s for 1,000 calls: hybridized, "
                "the network runs faster.",
                _show_mlp,
                Target(
                    "speed-up of compiled over eager",
                    "eager_over_compiled",
                    ">=",
                    FASTER,
                    holds=(("compiled_equals_eager", "the compiled results differ from the eager ones"),),
                ),
            ),
            Row(
                "fancy",
                "fancy_func, {s.fancy_len} elements",
                "Python runs add three times, one call after another; a compiled program runs as one.",
                _show_fancy,
                Target("tasks per compiled call", "compiled_tasks_per_call", "<=", 1, unit="", timed=False),
            ),
            Row(
                "fancy",
                "fancy_func(1, 2, 3, 4), compiled",
                "A compiler sees the whole program: it can rewrite it as print((1 + 2) + (3 + 4)), "
                "or even print(10).",
                _show_folded,
                Target("ops left after folding", "folded_kept_ops", "<=", 0, unit="", timed=False),
            ),
            Row(
                "serialise",
                "save and load the compiled MLP",
                "A compiled model can be serialised (tf.saved_model) and run without the Python program.",
                _show_serialise,
                Target(
                    "traces of the loaded graph",
                    "loaded_traces",
                    "<=",
                    0,
                    unit="",
                    timed=False,
                    holds=(("loaded_equals_compiled", "the loaded graph's result differs"),),
                ),
            ),
        ],
    ),
    (
        "Dynamic batching",
        [
            Row(
                "batching",
                "{s.row_calls:,} concurrent one-row calls, MLP 64-128-64-10",
                "Run the model a minibatch at a time (the book: one graph per minibatch), not a row "
                "at a time.",
                _show_batching,
                Target(
                    "speed-up over the loop",
                    "loop_over_batched",
                    ">=",
                    FASTER,
                    holds=(("batched_close_to_loop", "the batched rows differ from the loop's"),),
                ),
            ),
        ],
    ),
    (
        "Profiling",
        [
            Row(
                "profile",
                "eng.trace(): {s.trace_dots} dots, a join, a chain of {s.trace_chain}",
                "Vendors' profilers show precisely where the time goes.",
                _show_profile,
                Target(
                    "spans",
                    "spans",
                    ">=",
                    lambda f, c: c["tasks"],
                    unit="",
                    target_words="one per task",
                    timed=False,
                ),
            ),
        ],
    ),
    (
        "GPU",
        [
            Row(
                "gpu_queued",
                "{s.gpu_randn} x ({s.gpu_randn_side}x{s.gpu_randn_side} randn, matmul) on the GPU",
                "Queuing GPU work returns at once; the GPU finishes it later.",
                _show_gpu_queued,
                Target("finish time / queue time", "finish_over_queue", ">=", AT_ONCE),
            ),
            Row(
                "cpu_gpu",
                "CPU and GPU in parallel",
                "The CPU and the GPU compute at the same time.",
                _show_cpu_gpu,
                Target("speed-up", "sum_over_both", ">=", FASTER),
            ),
            Row(
                "copy_overlap",
                "copies overlap compute",
                "Copying results to the host while the GPU computes the next ones hides the copies.",
                _show_copy_overlap,
                Target("speed-up", "serial_over_overlapped", ">=", FASTER),
            ),
            Row(
                "multi_gpu",
                "{s.gpu_ops} products on 1 and 2 GPUs",
                "Work spread over several GPUs runs in parallel.",
                _show_multi_gpu,
                Target("speed-up", "speedup", ">=", FASTER),
            ),
        ],
    ),
]


# -- the command ---------------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="run schedsvc's experiments on the claims of the 'Computational Performance' chapter of "
        "Dive into Deep Learning, and print what they measured on this machine",
        description="Run schedsvc's experiments on the claims of the 'Computational Performance' chapter of "
        "Dive into Deep Learning (asynchronous computation, automatic parallelism, memory under a flooded "
        "queue, hybridize, profiling, CPU/GPU overlap, and minibatches through dynamic batching), and print "
        "what each measured on this machine beside the claim it tests, with a verdict: met or missed, and a note "
        "when the machine was loaded or the runs were noisy.",
    )
    demo.add_argument("--reps", type=int, default=3, help="repetitions per experiment; medians shown (3)")
    demo.add_argument("--quick", action="store_true", help="small sizes: a quick look, in a few seconds")
    demo.add_argument(
        "--json", metavar="PATH", help="also write every figure as JSON to PATH ('-': stdout only)"
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The ``demo`` subcommand."""
    if args.reps < 1:
        return fail("demo", "--reps must be at least 1")
    if problem := output_problem("--json", args.json):
        return fail("demo", problem)
    return main(reps=args.reps, quick=args.quick, json_path=args.json)


def main(reps: int = 3, quick: bool = False, json_path: str | None = None) -> int:
    """Run the experiments, print the table (or JSON), and write the JSON report if asked."""
    sizes = QUICK if quick else FULL
    with _progress() as step:
        report = measure(reps=reps, sizes=sizes, progress=step)
        step(f"all runs done in {report['wall_s']:.1f} s")
    report = _with_rows(report, sizes, quick)
    if json_path == "-":
        print_json(report)
        return 0
    _render(report)
    if json_path:
        write_json(report, json_path)
        print(f"wrote {json_path}")
    return 0


def _with_rows(report: dict[str, Any], sizes: Sizes, quick: bool) -> dict[str, Any]:
    """The report, plus each row as shown: section, label, status, the figures in words, the verdict on the
    claim, the claim."""
    rows = []
    for title, section in SECTIONS:
        for row in section:
            result = report["experiments"][row.experiment]
            entry: dict[str, Any] = {"section": title, "experiment": row.experiment}
            entry["label"] = row.label.format(s=sizes)
            entry["status"] = result["status"]
            if result["status"] == "measured":
                entry["measured"] = _shown(row, result, sizes)
                if row.target is not None:
                    entry["verdict"] = _verdict(row.target, result, report["load"])
            else:
                entry["reason"] = result["reason"]
            rows.append(entry | {"claim": row.claim})
    return {"schedsvc": ss.__version__, "quick": quick} | report | {"rows": rows}


def _shown(row: Row, result: dict[str, Any], sizes: Sizes) -> str:
    """What a row's experiment measured, in words; a figure the row shows that the runs did not give is
    named rather than ending the demo after every run."""
    try:
        return row.measured(result["figures"], result["checks"], sizes)
    except KeyError as exc:
        return f"not shown: {exc.args[0]} not measured"


def _verdict(target: Target, result: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    judged = judge(target, result["figures"], result["checks"], result["range"])
    return {"met": judged["met"], "text": verdict_text(target, judged, load)}


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], None]]:
    """Progress on stderr while the experiments run: a status line on a terminal (with rich), else a line
    per run and per part of a long one (stdout, which may be the JSON report, stays the report)."""
    if not has_rich():
        yield progress
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield progress
        return
    with console.status("starting") as status:
        yield lambda line: status.update(line)


def _console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:  # piped: 100 columns, not rich's 80
        return Console(highlight=False, width=100)
    if console.width > _MAX_WIDTH:  # wider tables only stretch the text apart
        return Console(highlight=False, width=_MAX_WIDTH)
    return console


def _heading(report: dict[str, Any]) -> str:
    sizes = ", quick sizes" if report["quick"] else ""
    return (
        'schedsvc demo: schedsvc\'s experiments on the claims of the "Computational Performance" chapter of '
        f"Dive into Deep Learning (d2l.ai), measured on this machine ({runs_phrase(report['reps'])}, "
        f"{report['cpu_workers']} CPU workers, BLAS at 1 thread{sizes})"
    )


def _footer(report: dict[str, Any]) -> str:
    verdicts = [r["verdict"]["met"] for r in report["rows"] if "verdict" in r]
    judged = [met for met in verdicts if met is not None]  # None: a figure it needed was not measured
    unjudged = f", {len(verdicts) - len(judged)} without a verdict" if len(judged) < len(verdicts) else ""
    load = report["load"]
    loads = ", ".join(
        f"{load[when]:.1f} {words}"
        for when, words in (("before", "as the runs began"), ("after", "as they ended"))
        if load[when] is not None
    )
    machine = (
        f"load average {loads}, on {cores_phrase(load['cores'])}" if loads else cores_phrase(load["cores"])
    )
    return (
        f"claims met: {sum(judged)} of {len(judged)} measured{unjudged}; {machine}"
        f"{' (loaded)' if loaded(load) else ''}; took {report['wall_s']:.1f} s; "
        "schedsvc demo --json PATH writes every figure"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Cell:
    """A row as shown: its label, what was measured (or why not), the verdict, and the claim."""

    label: str
    measured: str
    claim: str
    skipped: bool
    verdict: str | None = None
    met: bool | None = None


def _cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[_Cell]]:
    """A section's rows as cells, and the notes said above them: a reason that several rows are skipped
    for is said once, there."""
    reasons = [r["reason"] for r in rows if r["status"] != "measured"]
    shared = [reason for reason in dict.fromkeys(reasons) if reasons.count(reason) > 1]
    cells = []
    for row in rows:
        verdict = row.get("verdict", {})
        if row["status"] == "measured":
            measured = row["measured"]
        elif row["reason"] in shared:
            measured = "skipped: see above"
        else:
            measured = f"skipped: {row['reason']}"
        skipped = row["status"] != "measured"
        cells.append(
            _Cell(row["label"], measured, row["claim"], skipped, verdict.get("text"), verdict.get("met"))
        )
    return [f"skipped on this machine: {reason}" for reason in shared], cells


def _sections(report: dict[str, Any]) -> Iterator[tuple[str, list[str], list[_Cell]]]:
    """Each section's title, notes and cells."""
    for title, _ in SECTIONS:
        yield title, *_cells([r for r in report["rows"] if r["section"] == title])


def _render(report: dict[str, Any]) -> None:
    if not has_rich():
        print(_plain(report))
        return
    from rich.text import Text

    console = _console()
    console.print(Text(_heading(report)))
    for i, (title, notes, cells) in enumerate(_sections(report)):
        console.print()
        console.print(Text(title.upper(), style="bold cyan"))
        for note in notes:
            console.print(Text(note, style="yellow"))
        console.print(_table(cells, header=i == 0))
    console.print(Text(_footer(report)))


def _plain(report: dict[str, Any]) -> str:
    """The report as plain text (without rich): each row's label, then what was measured, the verdict and
    what the book says, indented, wrapped at 100 columns."""
    import textwrap

    def para(head: str, text: str) -> str:
        return textwrap.fill(text, 100, initial_indent=head, subsequent_indent=" " * len(head))

    lines = [textwrap.fill(_heading(report), 100)]
    for title, notes, cells in _sections(report):
        lines += ["", title.upper(), *(textwrap.fill(note, 100) for note in notes)]
        for cell in cells:
            lines += [cell.label, para("    measured here: ", cell.measured)]
            if cell.verdict is not None:
                lines.append(para("    verdict:       ", cell.verdict))
            lines.append(para("    the book says: ", cell.claim))
    return "\n".join([*lines, "", textwrap.fill(_footer(report), 100)])


_VERDICT_STYLES = {True: "green", False: "bold red", None: "yellow"}


def _table(cells: list[_Cell], header: bool) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD,
        expand=True,
        show_edge=False,
        pad_edge=False,
        show_header=header,
        show_lines=True,  # SIMPLE_HEAD draws them blank: a gap between rows of wrapped text
    )
    table.add_column("experiment", ratio=22, style="bold")
    table.add_column("measured here", ratio=45)
    table.add_column("the book says", ratio=33, style="dim")
    for cell in cells:
        measured = Text(cell.measured, style="yellow" if cell.skipped else "")
        if cell.verdict is not None:  # below the figures, coloured by the verdict
            measured.append("\n" + cell.verdict, style=_VERDICT_STYLES[cell.met])
        table.add_row(Text(cell.label), measured, Text(cell.claim))
    return table
