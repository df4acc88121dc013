"""The experiments of ``schedsvc demo``: the sources' experiments, measured here with schedsvc.

Each experiment is a coroutine ``fn(sizes) -> (figures, checks)``: ``figures``
are measured quantities (times, ratios, sizes, counts; all positive), and
``checks`` are facts the run established (a result equal to NumPy's, how many
ops the compiler folded).  ``run`` repeats them, interleaved, and keeps the
median of every figure.  The GPU experiments run only where the engine can run
``cuda`` tasks; elsewhere they are reported as skipped, with the reason the
engine gives.  Nothing here prints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

import schedsvc as ss

from ...devices import check_device
from .._common import bench_workers, fancy_func, make_mlp, mlp_weights

__all__ = ["EXPERIMENTS", "FULL", "GPU_EXPERIMENTS", "QUICK", "Sizes", "gpu_unavailable", "run"]

MiB = 2**20
Figures = dict[str, float]
Checks = dict[str, Any]
Result = tuple[Figures, Checks]


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """Problem sizes; ``FULL`` follows the sources, ``QUICK`` takes a second or two in all."""

    queued_side: int = 2000  # c = a * b + 2 on side x side arrays
    loop_ops: int = 1000  # y = x + 1, N times
    dots: int = 8  # independent np.dot (and the length of the dependent chain)
    dot_side: int = 1000
    batches: int = 100  # the sources' data_iter: 100 batches of 1024 x 512
    batch_rows: int = 1024
    features: int = 512
    bound_batches: int = 8  # max_pending_bytes, in batches (16 MiB at full size)
    calls: int = 1000  # MLP and fancy_func calls
    fancy_len: int = 100
    trace_dots: int = 8
    trace_side: int = 200
    trace_chain: int = 16
    gpu_side: int = 4096
    gpu_ops: int = 16


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
    fancy_len=10,
    trace_dots=4,
    trace_side=50,
    trace_chain=4,
    gpu_side=256,
    gpu_ops=4,
)


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
    figures = {"submit_us": (t1 - t0) * 1e6, "result_ms": (t2 - t0) * 1e3}
    figures["result_over_submit"] = figures["result_ms"] * 1e3 / figures["submit_us"]
    return figures, {"equals_numpy": bool(np.array_equal(value, a * b + 2))}


def _add_one_stamped(x: np.ndarray) -> tuple[np.ndarray, float]:
    """y = x + 1, and when it finished (so the awaiting side can split the round trip)."""
    return x + 1, time.perf_counter()


async def loop(s: Sizes) -> Result:
    """The sources' ``for _ in range(1000): y = x + 1``: awaited op by op, and queued then waited once.

    Both loops are split into the sources' three phases: t1 the frontend
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
    figures["awaited_over_queued"] = figures["awaited_us"] / figures["queued_us"]
    return figures, {"ops": n}


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
    """Queued then waited once, split the sources' way: t1 + N*t2 + t3.

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
        one, many = await _dots(1, mats, chain), await _dots(n, mats, chain)
        figures |= {f"{kind}_1worker_s": one, f"{kind}_nworkers_s": many, f"{kind}_speedup": one / many}
    return figures, {"workers": n, "dots": s.dots}


# -- memory and backpressure --------------------------------------------------------------


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
            if mode == "synced":  # the sources' advice: one sync point per minibatch
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
        peak, seconds = await _flood(s, mode)
        figures |= {f"{mode}_peak_mib": peak / MiB, f"{mode}_s": seconds}
    figures["bound_mib"] = s.bound_batches * s.batch_rows * s.features * 4 / MiB
    figures["batch_mib"] = s.batch_rows * s.features * 4 / MiB
    figures["bounded_time_ratio"] = figures["bounded_s"] / figures["unbounded_s"]
    figures["unbounded_over_bounded_peak"] = figures["unbounded_peak_mib"] / figures["bounded_peak_mib"]
    return figures, {"batches": s.batches}


# -- hybridize --------------------------------------------------------------------------------


async def _per_call_us(eng: ss.Engine, fn: Callable[..., Any], args: list[Any], calls: int) -> float:
    """Microseconds per call, ``calls`` calls queued and then waited for once."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    await eng.waitall()
    return (time.perf_counter() - t0) / calls * 1e6


async def mlp(s: Sizes) -> Result:
    """The sources' MLP (Dense 512-256-128-2, batch 1): NumPy, engine Tensors, compiled."""
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
    figures["eager_over_compiled"] = figures["eager_us"] / figures["compiled_us"]
    figures["compiled_over_numpy"] = figures["compiled_us"] / figures["numpy_us"]
    return figures, {"compiled_equals_eager": bool(same), "traces": traces}


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
    figures["eager_over_compiled"] = figures["eager_us"] / figures["compiled_us"]
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


def gpu_unavailable(device: str = "cuda:0") -> str | None:
    """Why the engine cannot run tasks on ``device`` here (None when it can)."""
    try:
        check_device(device)
        asyncio.run(_probe(device))
    except ss.SchedsvcError as exc:  # DeviceError, or an engine that cannot run cuda tasks yet
        return str(exc)
    except Exception as exc:  # the device is there but a first task on it failed: say so, measure nothing
        return f"{device} failed a first task: {type(exc).__name__}: {exc}"
    return None


async def _probe(device: str) -> None:
    async with ss.Engine(devices=_devices(device)) as eng:
        ones: Any = eng.ones(2, device=device)
        await (ones + 1)


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
    figures = {"cpu_s": cpu_s, "gpu_s": gpu_s, "both_s": both_s}
    return figures | {"sum_over_both": (cpu_s + gpu_s) / both_s}, {"device": gpu}


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
    figures = {"serial_s": t1 - t0, "overlapped_s": t2 - t1, "serial_over_overlapped": (t1 - t0) / (t2 - t1)}
    return figures, {"device": gpu}


async def multi_gpu(s: Sizes, gpus: tuple[str, ...] = ("cuda:0", "cuda:1")) -> Result:
    """The same products on the first GPU alone and spread over all of them."""
    a = np.random.default_rng(0).random((s.gpu_side, s.gpu_side), dtype=np.float32)
    async with ss.Engine(devices=_devices(*gpus)) as eng:
        xs: list[Any] = [eng.asarray(a, device=g) for g in gpus]
        for x in xs:
            await (x @ x)
        one_s = await _matmuls_s(eng, xs[:1], s.gpu_ops)
        all_s = await _matmuls_s(eng, xs, s.gpu_ops)
    return {"one_s": one_s, "all_s": all_s, "speedup": one_s / all_s}, {"devices": list(gpus)}


# -- the run --------------------------------------------------------------------------------------

Experiment = Callable[[Sizes], Coroutine[Any, Any, Result]]

EXPERIMENTS: dict[str, Experiment] = {
    "queued": queued,
    "loop": loop,
    "parallel": parallel,
    "memory": memory,
    "mlp": mlp,
    "fancy": fancy,
    "serialise": serialise,
    "profile": profile,
}

#: GPU experiments and the devices each needs.
GPU_EXPERIMENTS: dict[str, tuple[Experiment, tuple[str, ...]]] = {
    "cpu_gpu": (cpu_gpu, ("cuda:0",)),
    "copy_overlap": (copy_overlap, ("cuda:0",)),
    "multi_gpu": (multi_gpu, ("cuda:0", "cuda:1")),
}


def _skips() -> dict[str, str]:
    """GPU experiment -> why it cannot run here (absent when it can)."""
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


def run(reps: int = 3, sizes: Sizes = FULL, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every experiment ``reps`` times, interleaved; medians of the figures, checks of the last run."""
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    skips = _skips()
    todo = dict(EXPERIMENTS) | {k: fn for k, (fn, _) in GPU_EXPERIMENTS.items() if k not in skips}
    samples: dict[str, list[Result]] = {key: [] for key in todo}
    with threadpool_limits(limits=1):  # parallel speed-up must come from the engine, not from BLAS
        for rep in range(reps):
            for key, fn in todo.items():
                if progress is not None:
                    progress(f"run {rep + 1}/{reps}: {key}")
                samples[key].append(asyncio.run(fn(sizes)))
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
    }


def _summary(results: list[Result]) -> dict[str, Any]:
    figures = {k: statistics.median(f[k] for f, _ in results) for k in results[0][0]}
    spread = {k: [min(f[k] for f, _ in results), max(f[k] for f, _ in results)] for k in figures}
    return {"status": "measured", "figures": figures, "range": spread, "checks": results[-1][1]}
