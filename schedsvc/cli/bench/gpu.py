"""GPU benchmark: the engine's cuda device against raw CuPy, measured in the same run.

Each repetition runs every case; within a case the engine's variant and raw
CuPy's run back to back, in alternating order from one repetition to the next;
figures are medians over repetitions and each ratio is taken within a
repetition.  BLAS is held at one thread (the CPU side of G3).

G1  a chain of 1,000 small elementwise kernels (y = y + 1 on 1,000 floats): the engine's Tensor ops vs
    raw CuPy on one stream, then one wait
G2  the sources' experiment: 10 x (1000x1000 randn, matmul): time to queue vs time to finish
G3  a NumPy workload and a CuPy workload of similar length submitted together to one engine, vs the longer
    of the two run alone (and their sum, one after the other)
G4  20 batches through H2D copy -> compute -> D2H copy, pipelined by the engine, vs the serial sum of each
    step run alone with raw CuPy
G5  the sources' MLP compiled (replayed as a CUDA graph) vs eager CuPy, 1,000 calls queued then one wait
G6  completion latency, from the moment a kernel may run to the awakened coroutine, p50/p99: the
    executor's watcher threads vs raw CuPy awaited through ``run_in_executor(event.synchronize)``

"A GPU" here is CuPy importing and seeing a device, with the engine's cuda executor on CuPy; without one
the suite measures nothing and says why.  ``simulate=True`` (tests only, ``--simulate``) runs every case's
code on the CUDA simulator at tiny sizes: its figures are not timings of anything real, and are labelled so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import schedsvc as ss

from .._common import (
    Figures,
    gpu_unavailable,
    make_mlp,
    meets,
    mlp_weights,
    one_blas_thread,
    randn_on,
    target_mark,
)

__all__ = [
    "CASES",
    "FULL",
    "G5_UNAVAILABLE",
    "G6_MISSING",
    "SIMULATED_LABEL",
    "TINY",
    "Sizes",
    "format_report",
    "graphs_of",
    "run",
    "unavailable",
]

DEVICE = "cuda:0"
SIMULATED_LABEL = "simulated: not timed as real"
_WAIT_S = 30.0  # the longest a G6 sample waits for its kernel to be reached (a bound, never a pause)


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """Problem sizes: ``FULL`` follows the issue, ``TINY`` only proves the code runs."""

    chain: int = 1000  # G1 kernels
    chain_len: int = 1000  # G1 elements
    randn: int = 10  # G2 (randn, matmul) pairs
    randn_side: int = 1000
    gpu_side: int = 4096  # G3 CuPy matmuls of side x side float32
    gpu_ops: int = 8
    cpu_side: int = 512  # G3 NumPy matmuls, as many as take about as long as the CuPy workload
    batches: int = 20  # G4
    batch_rows: int = 8192
    features: int = 1024
    mlp_calls: int = 1000  # G5
    samples: int = 200  # G6 completions per repetition


FULL = Sizes()
TINY = Sizes(
    chain=20,
    chain_len=8,
    randn=3,
    randn_side=8,
    gpu_side=16,
    gpu_ops=2,
    cpu_side=8,
    batches=4,
    batch_rows=8,
    features=8,
    mlp_calls=5,
    samples=5,
)


@dataclasses.dataclass(slots=True)
class Bench:
    """What every case needs: the binding (CuPy or the simulator), its array module, the sizes."""

    api: Any
    sizes: Sizes
    simulated: bool
    cpu_ops: int = 0  # G3's NumPy matmuls, set by its first run

    @property
    def xp(self) -> Any:
        return self.api.xp

    def engine(self, **options: Any) -> ss.Engine:
        """An engine with the CPU and this GPU (the simulator's, or CuPy's, never the configured one)."""
        options.setdefault("max_pending", 100_000)
        return ss.Engine(devices=("cpu", DEVICE), cuda_simulator=self.simulated, **options)

    def stream(self) -> Any:
        """A raw non-blocking stream on the device, for the CuPy baselines."""
        self.api.use_device(0)
        return self.api.stream(0)

    def device_array(self, host: np.ndarray[Any, Any]) -> Any:
        """``host`` on the device, complete (for the raw baselines' inputs)."""
        stream = self.stream()
        with stream:
            out = self.xp.asarray(host)
        stream.synchronize()
        return out


Case = Callable[[Bench, bool], Coroutine[Any, Any, Figures]]


async def _both(
    first: Callable[[], Coroutine[Any, Any, Figures]],
    second: Callable[[], Coroutine[Any, Any, Figures]],
    engine_first: bool,
) -> Figures:
    """The engine's variant and raw CuPy's, in the order this repetition takes."""
    order = (first, second) if engine_first else (second, first)
    figures: Figures = {}
    for variant in order:
        figures.update(await variant())
        gc.collect()
    return figures


# -- G1: a chain of small elementwise kernels ----------------------------------------------------------


async def g1(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    host = np.zeros(s.chain_len, dtype=np.float32)

    async def engine() -> Figures:
        async with b.engine() as eng:
            x: Any = eng.asarray(host, device=DEVICE)
            await (x + 1)  # warm
            t0 = time.perf_counter()
            y = x
            for _ in range(s.chain):
                y = y + 1
            await y
            return {"engine_ms": (time.perf_counter() - t0) * 1e3}

    async def raw() -> Figures:
        x = b.device_array(host)
        stream = b.stream()
        with stream:
            (x + 1)
            stream.synchronize()  # warm
            t0 = time.perf_counter()
            y = x
            for _ in range(s.chain):
                y = y + 1
            stream.synchronize()
        return {"raw_ms": (time.perf_counter() - t0) * 1e3}

    f = await _both(engine, raw, engine_first)
    return f | {"ratio": f["engine_ms"] / f["raw_ms"]}


# -- G2: the sources' experiment: randn and matmul, queued then finished ---------------------------------


async def g2(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    randn = functools.partial(randn_on, b.xp)

    async def engine() -> Figures:
        async with b.engine() as eng:
            for _ in range(eng.config.streams_per_device):  # the generator and cuBLAS, on every stream
                warm = eng.submit_nowait(randn, s.randn_side, device=DEVICE)  # (a root takes the next one)
                await eng.run(np.matmul, warm, warm, device=DEVICE)
            t0 = time.perf_counter()
            for _ in range(s.randn):
                x = eng.submit_nowait(randn, s.randn_side, device=DEVICE)
                eng.submit_nowait(np.matmul, x, x, device=DEVICE)
            t1 = time.perf_counter()
            await eng.waitall()
            t2 = time.perf_counter()
        return {"engine_queue_ms": (t1 - t0) * 1e3, "engine_finish_ms": (t2 - t0) * 1e3}

    async def raw() -> Figures:
        stream = b.stream()
        with stream:
            x = randn(s.randn_side)
            x @ x
            stream.synchronize()  # warm: the generator and cuBLAS
            t0 = time.perf_counter()
            for _ in range(s.randn):
                x = randn(s.randn_side)
                x @ x
            t1 = time.perf_counter()
            stream.synchronize()
            t2 = time.perf_counter()
        return {"raw_queue_ms": (t1 - t0) * 1e3, "raw_finish_ms": (t2 - t0) * 1e3}

    f = await _both(engine, raw, engine_first)
    return f | {"ratio": f["engine_finish_ms"] / f["raw_finish_ms"]}


# -- G3: a NumPy and a CuPy workload at once ---------------------------------------------------------------


def _cpu_work(a: np.ndarray[Any, Any], count: int) -> float:
    """Seconds for ``count`` NumPy products a @ a, one after the other."""
    t0 = time.perf_counter()
    for _ in range(count):
        a @ a
    return time.perf_counter() - t0


async def g3(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    rng = np.random.default_rng(3)
    host_gpu = rng.random((s.gpu_side, s.gpu_side), dtype=np.float32)
    host_cpu = rng.random((s.cpu_side, s.cpu_side), dtype=np.float32)
    x = b.device_array(host_gpu)

    def gpu_work(stream: Any) -> float:
        t0 = time.perf_counter()
        with stream:
            for _ in range(s.gpu_ops):
                x @ x
            stream.synchronize()
        return time.perf_counter() - t0

    if not b.cpu_ops:  # the NumPy workload: as many products as take about as long as the CuPy one
        stream = b.stream()
        gpu_work(stream)  # warm cuBLAS
        one = max(_cpu_work(host_cpu, 3) / 3, 1e-9)
        b.cpu_ops = max(1, round(gpu_work(stream) / one))

    async def engine() -> Figures:
        async with b.engine(cpu_workers=1) as eng:  # one CPU worker: the NumPy workload stays serial
            on_gpu: Any = eng.asarray(host_gpu, device=DEVICE)
            await eng.run(np.matmul, host_cpu, host_cpu, device="cpu")
            await (on_gpu @ on_gpu)
            t0 = time.perf_counter()
            for i in range(max(b.cpu_ops, s.gpu_ops)):  # interleaved: both devices start at once
                if i < s.gpu_ops:
                    on_gpu @ on_gpu
                if i < b.cpu_ops:
                    eng.submit_nowait(np.matmul, host_cpu, host_cpu, device="cpu")
            await eng.waitall()
            return {"engine_both_s": time.perf_counter() - t0}

    async def raw() -> Figures:
        return {"numpy_s": _cpu_work(host_cpu, b.cpu_ops), "cupy_s": gpu_work(b.stream())}

    f = await _both(engine, raw, engine_first)
    longer = max(f["numpy_s"], f["cupy_s"])
    return f | {
        "cpu_ops": float(b.cpu_ops),
        "longer_s": longer,
        "serial_s": f["numpy_s"] + f["cupy_s"],
        "ratio": f["engine_both_s"] / longer,
        "serial_over_both": (f["numpy_s"] + f["cupy_s"]) / f["engine_both_s"],
    }


# -- G4: H2D -> compute -> D2H, pipelined -------------------------------------------------------------------


def _compute(x: Any, w: Any) -> Any:
    """The pipeline's kernel: tanh(x @ w) (NumPy's names: CuPy's arrays take them to CuPy)."""
    return np.tanh(x @ w)


def _host(y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The pipeline's CPU end: the batch's result, copied back to the host (the task's D2H copy)."""
    return y


async def g4(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    rng = np.random.default_rng(4)
    batches = [rng.random((s.batch_rows, s.features), dtype=np.float32) for _ in range(s.batches)]
    w_host = rng.random((s.features, s.features), dtype=np.float32) / s.features

    async def engine() -> Figures:
        async with b.engine() as eng:
            w: Any = eng.asarray(w_host, device=DEVICE)
            await eng.run(_host, eng.submit_nowait(_compute, batches[0], w, device=DEVICE), device="cpu")
            t0 = time.perf_counter()
            for batch in batches:
                y = await eng.submit(_compute, batch, w, device=DEVICE)  # its H2D copy is a task of its own
                await eng.submit(_host, y, device="cpu")  # the D2H copy, then the CPU task
            await eng.waitall()
            return {"engine_s": time.perf_counter() - t0}

    async def raw() -> Figures:
        stream = b.stream()
        w = b.device_array(w_host)
        steps = {"h2d_s": 0.0, "compute_s": 0.0, "d2h_s": 0.0}
        with stream:
            _compute(b.xp.asarray(batches[0]), w).get()  # warm
            stream.synchronize()
            for batch in batches:  # each step alone, waited for: the serial sum
                t0 = time.perf_counter()
                x = b.xp.asarray(batch)
                stream.synchronize()
                t1 = time.perf_counter()
                y = _compute(x, w)
                stream.synchronize()
                t2 = time.perf_counter()
                y.get(stream=stream)
                t3 = time.perf_counter()
                steps["h2d_s"] += t1 - t0
                steps["compute_s"] += t2 - t1
                steps["d2h_s"] += t3 - t2
        return steps | {"serial_s": sum(steps.values())}

    f = await _both(engine, raw, engine_first)
    return f | {"ratio": f["engine_s"] / f["serial_s"]}


# -- G5: the sources' MLP compiled (a CUDA graph) vs eager CuPy ---------------------------------------------


def _mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, w3: Any, b3: Any) -> Any:
    """The sources' MLP with its weights as arguments (so that they live on the device with ``x``)."""
    return make_mlp([w1, b1, w2, b2, w3, b3])(x)


def graphs_of(stats: dict[str, Any]) -> int:
    """CUDA graphs a compiled function's ``stats()`` counts (``cuda_graphs``; 0: none, or never on cuda)."""
    return int(stats.get("cuda_graphs", 0))


#: why G5 cannot run: the compiled MLP captured no CUDA graph (``Compiled.capture_off`` follows)
G5_UNAVAILABLE = "the compiled MLP replays on cuda without CUDA graphs (its stats() count none)"


async def g5(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    weights = mlp_weights()
    x_host = np.random.default_rng(1).standard_normal((1, 512))

    async def engine() -> Figures:
        async with b.engine() as eng:
            args: list[Any] = [eng.asarray(a, device=DEVICE) for a in (x_host, *weights)]
            compiled = eng.compile(_mlp)
            for _ in range(2 * eng.config.streams_per_device + 2):  # per stream: a warm-up, then the capture
                await compiled(*args)
            if not graphs_of(compiled.stats()):
                raise Unavailable(f"{G5_UNAVAILABLE}: {compiled.capture_off}")
            t0 = time.perf_counter()
            for _ in range(s.mlp_calls):
                compiled(*args)
            await eng.waitall()
            return {"engine_us": (time.perf_counter() - t0) / s.mlp_calls * 1e6}

    async def raw() -> Figures:
        args = [b.device_array(a) for a in (x_host, *weights)]
        stream = b.stream()
        with stream:
            _mlp(*args)
            stream.synchronize()  # warm cuBLAS
            t0 = time.perf_counter()
            for _ in range(s.mlp_calls):
                _mlp(*args)
            stream.synchronize()
        return {"raw_us": (time.perf_counter() - t0) / s.mlp_calls * 1e6}

    f = await _both(engine, raw, engine_first)
    return f | {"ratio": f["engine_us"] / f["raw_us"]}


class Unavailable(Exception):
    """A case cannot run as specified here; the message says why (reported instead of figures)."""


# -- G6: completion latency ---------------------------------------------------------------------------------


class _Gate:
    """Holds a stream in a host callback (which makes no CUDA call) until the host opens it: the moment
    the host opens it is the moment the kernel behind it may run."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def hold(self, _: object) -> None:
        self.reached.set()
        self.opened.wait(_WAIT_S)


def _gated_add(api: Any, gate: _Gate, x: Any) -> Any:
    """On the launching thread, its stream current: the gate, then the kernel (x + 1)."""
    api.current_stream().launch_host_func(gate.hold, None)
    return x + 1


async def _latency(gate: _Gate, done: Awaitable[Any]) -> float:
    """Seconds from opening ``gate`` (once the stream reached it) to this coroutine awakened by ``done``
    (whose waiter is asleep already, as the executor's watcher is)."""
    if not await asyncio.to_thread(gate.reached.wait, _WAIT_S):
        raise TimeoutError(f"G6: the stream did not reach its gate in {_WAIT_S:.0f} s")
    t0 = time.perf_counter()
    gate.opened.set()
    await done
    return time.perf_counter() - t0


def _percentiles(prefix: str, seconds: list[float]) -> Figures:
    us = np.asarray(seconds) * 1e6
    return {
        f"{prefix}_p50_us": float(np.percentile(us, 50)),
        f"{prefix}_p99_us": float(np.percentile(us, 99)),
    }


async def g6(b: Bench, engine_first: bool) -> Figures:
    s = b.sizes
    host = np.zeros(8, dtype=np.float32)

    async def engine() -> Figures:
        async with b.engine() as eng:
            x: Any = eng.asarray(host, device=DEVICE)
            await (x + 1)
            seconds = []
            for _ in range(s.samples + 1):
                gate = _Gate()
                fut = eng.submit_nowait(_gated_add, b.api, gate, x, device=DEVICE)
                seconds.append(await _latency(gate, fut))
            return _percentiles("watcher", seconds[1:])

    async def raw() -> Figures:
        loop = asyncio.get_running_loop()
        x = b.device_array(host)
        stream = b.stream()
        seconds = []
        with ThreadPoolExecutor(1) as pool:
            for _ in range(s.samples + 1):
                gate = _Gate()
                with stream:
                    y = _gated_add(b.api, gate, x)
                    event = b.api.event()
                    event.record(stream)
                seconds.append(await _latency(gate, loop.run_in_executor(pool, event.synchronize)))
                del y
        return _percentiles("raw", seconds[1:])

    f = await _both(engine, raw, engine_first)
    return f | {"ratio": f["watcher_p50_us"] / f["raw_p50_us"]}


#: the executor has one completion mechanism; G6 says so beside its figures
G6_MISSING = (
    "host callbacks: not available: the CUDA executor completes tasks only through watcher threads (one "
    "per stream); it has no launch_host_func mode to switch to (docs/cuda-facts.md measured both designs "
    "with a probe before the executor was built)"
)

# -- the run ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
    """A case: what it measures, its engine and baseline figures, its target (None: reported only)."""

    label: str
    run: Case
    engine: str
    baseline: str
    unit: str
    target: tuple[str, float] | None


CASES: dict[str, Spec] = {
    "G1": Spec(
        "1,000 small kernels in a chain / raw CuPy, one stream", g1, "engine_ms", "raw_ms", "ms", ("<=", 1.2)
    ),
    "G2": Spec(
        "10 x (randn, matmul): finish / raw CuPy", g2, "engine_finish_ms", "raw_finish_ms", "ms", None
    ),
    "G3": Spec(
        "NumPy + CuPy together / the longer alone", g3, "engine_both_s", "longer_s", "s", ("<=", 1.15)
    ),
    "G4": Spec("20 batches H2D->compute->D2H / serial sum", g4, "engine_s", "serial_s", "s", ("<=", 0.7)),
    "G5": Spec("MLP compiled (CUDA graph) / eager CuPy", g5, "engine_us", "raw_us", "us/call", ("<=", 0.5)),
    "G6": Spec("completion p50: watcher threads / raw CuPy", g6, "watcher_p50_us", "raw_p50_us", "us", None),
}


def unavailable() -> str | None:
    """Why there is no GPU to measure here (no CuPy, no device, a first task failing); None if there is."""
    return gpu_unavailable(DEVICE, cuda_simulator=False)


def run(
    reps: int = 5,
    progress: Callable[[str], None] | None = None,
    *,
    simulate: bool = False,
    sizes: Sizes | None = None,
) -> dict[str, Any]:
    """Every case ``reps`` times, interleaved; medians and target checks.  Without a GPU (and not
    ``simulate``): ``{"gpu": None, "reason": ...}`` and nothing measured."""
    if not simulate and (reason := unavailable()) is not None:
        return {"gpu": None, "reason": reason}
    from ...devices.cuda import api_for, check

    if simulate:
        check(0, simulated=True)  # (the simulator has the devices it is asked for)
    api = api_for(simulate)
    b = Bench(api, sizes or (TINY if simulate else FULL), simulate)
    samples: dict[str, list[Figures]] = {name: [] for name in CASES}
    reasons: dict[str, str] = {}
    with one_blas_thread():
        for rep in range(reps):
            for name, spec in CASES.items():
                if name in reasons:
                    continue
                try:
                    samples[name].append(asyncio.run(spec.run(b, rep % 2 == 0)))
                except Unavailable as exc:
                    reasons[name] = str(exc)
                if progress is not None:
                    progress(f"rep {rep + 1}/{reps} {name}")
    return {
        "gpu": api.device_name(0),
        "backend": api.version(),
        "simulated": SIMULATED_LABEL if simulate else False,
        "reps": reps,
        "sizes": dataclasses.asdict(b.sizes),
        "cases": {
            name: _case_report(spec, samples[name], reasons.get(name), simulate)
            for name, spec in CASES.items()
        },
    }


def _case_report(spec: Spec, runs: list[Figures], reason: str | None, simulate: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"label": spec.label, "unit": spec.unit}
    if reason is not None:
        return report | {"available": False, "reason": f"not available: {reason}"}
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    ratio = medians["ratio"]
    report |= {
        "available": True,
        "engine": medians[spec.engine],
        "baseline": medians[spec.baseline],
        "ratio": ratio,
        "ratio_range": [min(r["ratio"] for r in runs), max(r["ratio"] for r in runs)],
        "target": None if spec.target is None else f"{spec.target[0]} {spec.target[1]:.3g}",
        "met": None if spec.target is None or simulate else meets(ratio, *spec.target),
        "figures": medians,
    }
    if spec.run is g6:
        report["missing"] = G6_MISSING
    return report


def format_report(report: dict[str, Any]) -> str:
    if report["gpu"] is None:
        return f"schedsvc bench gpu: no GPU here, nothing measured: {report['reason']}"
    sim = report["simulated"]
    lines = [
        f"schedsvc bench gpu on {report['gpu']} ({report['backend']}): median of {report['reps']} interleaved "
        "runs, ratios within each run, against raw CuPy" + (f" -- {sim}" if sim else ""),
        f"  {'':4s} {'':52s} {'engine':>10s} {'baseline':>10s} {'ratio':>7s}  target",
    ]
    for name, c in report["cases"].items():
        if not c["available"]:
            lines.append(f"  {name:4s} {c['label']:52s} {c['reason']}")
            continue
        mark = "sim " if sim else ("    " if c["met"] is None else target_mark(c["met"]))
        lines.append(
            f"  {name:4s} {c['label']:52s} {c['engine']:10.4g} {c['baseline']:10.4g} {c['ratio']:6.3g}x  "
            f"{c['target'] or '(reported)':10s} [{mark}] {c['unit']}"
        )
        if name == "G2":
            f = c["figures"]
            lines.append(
                f"  {'':4s} queue / finish: engine {f['engine_queue_ms']:.3g} / {f['engine_finish_ms']:.3g} ms, "
                f"raw CuPy {f['raw_queue_ms']:.3g} / {f['raw_finish_ms']:.3g} ms"
            )
        if name == "G6":
            f = c["figures"]
            lines.append(
                f"  {'':4s} p50 / p99: watcher {f['watcher_p50_us']:.3g} / {f['watcher_p99_us']:.3g} us, "
                f"raw CuPy {f['raw_p50_us']:.3g} / {f['raw_p99_us']:.3g} us; {c['missing']}"
            )
    return "\n".join(lines)
