"""One system's side of ``schedsvc bench gpu --peers``: the workloads P1-P5 run in this process.

    python -m schedsvc.cli.bench._peer SYSTEM [--tiny] [--simulate]

prints one JSON object: ``{"system", "available", "reason", "figures", "checks"}``.  SYSTEM is
``schedsvc``, ``cupy`` (raw CuPy), ``torch`` (PyTorch) or ``jax``; each runs on the first GPU, float32,
the sources' workloads:

P1   a chain of ``y = y + 1`` on a vector, one wait at the end: µs per op
P2   (randn, matmul) pairs of square matrices: ms to finish
P3   the sources' MLP (512-256-128-2) on one row, called again and again, one wait: µs per call -- eager,
     and "hybridized" (schedsvc ``eng.compile``, a PyTorch CUDA graph, ``jax.jit``)
P4   coroutines each awaiting calls of that MLP, a host row in and a host result out: calls per second --
     through ``asyncio.to_thread`` (the peers), ``eng.compile`` and ``eng.compile(..., batch_axis=0)``
P4b  the same coroutines through a hand-written asyncio batcher (one ``to_thread`` call per batch)
P5   one coroutine awaiting such calls one after another: p50 µs per call

Each figure comes with a check of what it computed (a value every system must agree on), which the
parent compares across systems.  ``--simulate`` (tests only) runs schedsvc and raw CuPy's code on the
CUDA simulator: not timings of anything real.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

__all__ = ["FULL", "SYSTEMS", "TINY", "PeerSizes", "main", "reference"]

SYSTEMS = ("schedsvc", "cupy", "torch", "jax")
DEVICE = "cuda:0"


@dataclasses.dataclass(frozen=True, slots=True)
class PeerSizes:
    chain: int = 1000  # P1 ops
    chain_len: int = 1000  # P1 elements
    pairs: int = 10  # P2 (randn, matmul) pairs
    side: int = 1000  # P2 matrices
    calls: int = 1000  # P3 calls
    coroutines: int = 64  # P4
    calls_each: int = 32  # P4: calls per coroutine
    serial: int = 300  # P5 calls


FULL = PeerSizes()
TINY = PeerSizes(chain=20, chain_len=8, pairs=2, side=8, calls=5, coroutines=4, calls_each=3, serial=5)

Figures = dict[str, float]


def weights() -> list[np.ndarray[Any, Any]]:
    """The MLP's weights and biases, float32 (the sources' model)."""
    from .._common import mlp_weights

    return [w.astype(np.float32) for w in mlp_weights()]


def row(i: int = 0) -> np.ndarray[Any, Any]:
    """Request ``i``'s input row."""
    return np.random.default_rng(100 + i).standard_normal((1, 512)).astype(np.float32)


def reference(sizes: PeerSizes) -> dict[str, float]:
    """What every system's checks must come to (float64 NumPy)."""
    w = [a.astype(np.float64) for a in weights()]

    def mlp(x: Any) -> Any:
        h = np.maximum(x @ w[0] + w[1], 0)
        h = np.maximum(h @ w[2] + w[3], 0)
        return h @ w[4] + w[5]

    requests = sizes.coroutines * sizes.calls_each
    p4 = float(sum(mlp(row(i % 16).astype(np.float64)).sum() for i in range(requests)))
    return {
        "p1": float(sizes.chain),  # every element of the chain's result
        "p2": float(sizes.side),  # random matrices: their product's rows
        "p3": float(mlp(row(0).astype(np.float64)).sum()),
        "p4": p4,
        "p4b": p4,
        "p5": float(sum(mlp(row(i % 16).astype(np.float64)).sum() for i in range(sizes.serial))),
    }


def _mlp(xp_max: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, w3: Any, b3: Any) -> Any:
        h = xp_max(x @ w1 + b1, 0)
        h = xp_max(h @ w2 + b2, 0)
        return h @ w3 + b3

    return mlp


class Peer:
    """A system's workloads; each returns its figures and its check."""

    #: what a host row goes through for a call: host row in, host result out (P4, P4b, P5)
    def call(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        raise NotImplementedError

    def call_rows(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return self.call(rows)

    async def p4(self, sizes: PeerSizes) -> tuple[Figures, float]:
        return await _coroutines(sizes, lambda x: asyncio.to_thread(self.call, x), "to_thread")

    async def p4b(self, sizes: PeerSizes) -> tuple[Figures, float]:
        batcher = Batcher(self.call_rows)
        try:
            return await _coroutines(sizes, batcher, "batcher")
        finally:
            await batcher.close()

    async def p5(self, sizes: PeerSizes) -> tuple[Figures, float]:
        return await _serial(sizes, lambda x: asyncio.to_thread(self.call, x))


async def _coroutines(
    sizes: PeerSizes, call: Callable[[Any], Awaitable[Any]], name: str
) -> tuple[Figures, float]:
    """P4: ``coroutines`` coroutines each awaiting ``calls_each`` calls; calls per second, and the sum of
    every result."""
    sums: list[float] = []

    async def client(c: int) -> None:
        for k in range(sizes.calls_each):
            out = await call(row((c * sizes.calls_each + k) % 16))
            sums.append(float(np.asarray(out).sum()))

    await call(row(0))  # warm
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(sizes.coroutines)))
    seconds = time.perf_counter() - t0
    return {f"{name}_calls_per_s": sizes.coroutines * sizes.calls_each / seconds}, float(sum(sums))


async def _serial(sizes: PeerSizes, call: Callable[[Any], Awaitable[Any]]) -> tuple[Figures, float]:
    """P5: one coroutine, calls one after another: p50 and p99 µs, and the sum of every result."""
    await call(row(0))  # warm
    took, total = [], 0.0
    for i in range(sizes.serial):
        t0 = time.perf_counter()
        out = await call(row(i % 16))
        took.append((time.perf_counter() - t0) * 1e6)
        total += float(np.asarray(out).sum())
    return {"p50_us": statistics.median(took), "p99_us": float(np.percentile(took, 99))}, total


#: waits until a value is computed (and, in order on one stream, what was queued before it)
Sync = Callable[[Any], Any]


def _chain(x: Any, n: int, sync: Sync) -> tuple[float, Any]:
    """P1: ``n`` times ``y = y + 1`` from ``x``, then ``sync(y)``: µs per op, and the last ``y``."""
    sync(x + 1)
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        y = y + 1
    sync(y)
    return (time.perf_counter() - t0) / n * 1e6, y


def _repeated(call: Callable[[], Any], n: int, sync: Sync) -> tuple[float, Any]:
    """``call()`` once (warm), then ``n`` times and ``sync`` on the last: µs per call, and the last result."""
    sync(call())
    t0 = time.perf_counter()
    for _ in range(n):
        out = call()
    sync(out)
    return (time.perf_counter() - t0) / n * 1e6, out


class Batcher:
    """A hand-written asyncio batcher: calls queued while a batch runs form the next one, run by one
    ``asyncio.to_thread`` call (rows stacked, results split back)."""

    def __init__(self, run_rows: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]) -> None:
        self.run_rows = run_rows
        self.queue: list[tuple[np.ndarray[Any, Any], asyncio.Future[Any]]] = []
        self.wake = asyncio.Event()
        self.task = asyncio.ensure_future(self._loop())

    async def __call__(self, x: np.ndarray[Any, Any]) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((x, fut))
        self.wake.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            try:
                out = await asyncio.to_thread(self.run_rows, np.concatenate([x for x, _ in batch]))
            except Exception as exc:
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            start = 0
            for x, fut in batch:
                fut.set_result(out[start : start + len(x)])
                start += len(x)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class CupyPeer(Peer):
    """Raw CuPy on one non-blocking stream (or the simulator's array module)."""

    def __init__(self, simulate: bool) -> None:
        from ...devices.cuda import api_for, check

        if simulate:
            check(0, simulated=True)
        self.api = api_for(simulate)
        self.api.use_device(0)
        self.xp = self.api.xp
        self.stream = self.api.stream(0)
        with self.stream:
            self.w = [self.xp.asarray(a) for a in weights()]
        self.stream.synchronize()
        self.mlp = _mlp(self.xp.maximum)

    def call(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """On a worker thread, its current stream: the row in, the MLP, the result out (a host sync)."""
        self.api.use_device(0)
        return np.asarray(self.mlp(self.xp.asarray(x), *self.w).get())

    async def p1(self, sizes: PeerSizes) -> tuple[Figures, float]:
        with self.stream:
            x = self.xp.zeros(sizes.chain_len, dtype=np.float32)
            us, y = _chain(x, sizes.chain, lambda _: self.stream.synchronize())
            return {"us_per_op": us}, float(y.get()[0])

    async def p2(self, sizes: PeerSizes) -> tuple[Figures, float]:
        from .._common import randn_on

        def pair() -> Any:
            x = randn_on(self.xp, sizes.side)
            return x @ x

        with self.stream:
            us, y = _repeated(pair, sizes.pairs, lambda _: self.stream.synchronize())
            return {"finish_ms": us * sizes.pairs / 1e3}, float(y.shape[0])

    async def p3(self, sizes: PeerSizes) -> tuple[Figures, float]:
        with self.stream:
            x = self.xp.asarray(row(0))
            us, out = _repeated(
                lambda: self.mlp(x, *self.w), sizes.calls, lambda _: self.stream.synchronize()
            )
            return {"eager_us_per_call": us}, float(out.get().sum())


class TorchPeer(Peer):
    """PyTorch on the GPU: eager ops, a CUDA graph of the MLP, ``to_thread`` around the model."""

    def __init__(self, simulate: bool) -> None:
        import torch

        if simulate or not torch.cuda.is_available():
            raise _Unavailable("PyTorch sees no CUDA device" if not simulate else "not run on the simulator")
        self.torch = torch
        self.device = torch.device("cuda:0")
        self.w = [torch.from_numpy(a).to(self.device) for a in weights()]
        self.mlp = _mlp(lambda a, b: torch.clamp(a, min=b))

    def call(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        with self.torch.inference_mode():
            out = self.mlp(self.torch.from_numpy(x).to(self.device), *self.w)
            return np.asarray(out.cpu().numpy())

    async def p1(self, sizes: PeerSizes) -> tuple[Figures, float]:
        torch = self.torch
        x = torch.zeros(sizes.chain_len, dtype=torch.float32, device=self.device)
        us, y = _chain(x, sizes.chain, lambda _: torch.cuda.synchronize())
        return {"us_per_op": us}, float(y[0].item())

    async def p2(self, sizes: PeerSizes) -> tuple[Figures, float]:
        torch = self.torch

        def pair() -> Any:
            x = torch.randn((sizes.side, sizes.side), device=self.device)
            return x @ x

        us, y = _repeated(pair, sizes.pairs, lambda _: torch.cuda.synchronize())
        return {"finish_ms": us * sizes.pairs / 1e3}, float(y.shape[0])

    async def p3(self, sizes: PeerSizes) -> tuple[Figures, float]:
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(row(0)).to(self.device)
            eager, out = _repeated(
                lambda: self.mlp(x, *self.w), sizes.calls, lambda _: torch.cuda.synchronize()
            )
            graph, static_out = self._graph(x)
            graphed, _ = _repeated(graph.replay, sizes.calls, lambda _: torch.cuda.synchronize())
        check = float(out.sum().item())
        assert abs(float(static_out.sum().item()) - check) <= 1e-3 * max(1.0, abs(check))
        return {"eager_us_per_call": eager, "compiled_us_per_call": graphed}, check

    def _graph(self, x: Any) -> tuple[Any, Any]:
        """The MLP captured as one CUDA graph (warmed on a side stream first, as PyTorch's docs do)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.mlp(x, *self.w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.mlp(x, *self.w)
        torch.cuda.synchronize()
        return graph, out


class JaxPeer(Peer):
    """JAX on the GPU: eager dispatch and ``jax.jit``."""

    def __init__(self, simulate: bool) -> None:
        if simulate:
            raise _Unavailable("not run on the simulator")
        import jax
        import jax.numpy as jnp

        if not any(d.platform == "gpu" for d in jax.devices()):
            raise _Unavailable("JAX sees no GPU")
        self.jax, self.jnp = jax, jnp
        self.w = [jnp.asarray(a) for a in weights()]
        self.mlp = _mlp(jnp.maximum)
        self.jitted = jax.jit(self.mlp)

    def call(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.asarray(self.jitted(self.jnp.asarray(x), *self.w))

    async def p1(self, sizes: PeerSizes) -> tuple[Figures, float]:
        x = self.jnp.zeros(sizes.chain_len, dtype=self.jnp.float32)
        us, y = _chain(x, sizes.chain, _ready)
        return {"us_per_op": us}, float(y[0])

    async def p3(self, sizes: PeerSizes) -> tuple[Figures, float]:
        x = self.jnp.asarray(row(0))
        figures: Figures = {}
        check = 0.0
        for name, fn in (("eager_us_per_call", self.mlp), ("compiled_us_per_call", self.jitted)):
            figures[name], out = _repeated(functools.partial(fn, x, *self.w), sizes.calls, _ready)
            check = float(out.sum())
        return figures, check


def _ready(value: Any) -> Any:
    """JAX's wait: until ``value`` is computed."""
    return value.block_until_ready()


class SchedsvcPeer(Peer):
    """schedsvc on cuda:0: Tensor ops, ``eng.compile``, batched calls; host rows in, host results out."""

    def __init__(self, simulate: bool) -> None:
        import schedsvc as ss

        self.ss = ss
        self.simulate = simulate
        self.eng: Any = None

    async def __aenter__(self) -> SchedsvcPeer:
        self.eng = await self.ss.Engine(
            devices=("cpu", DEVICE), cuda_simulator=self.simulate, max_pending=100_000
        ).start()
        self.w = [self.eng.asarray(a, device=DEVICE) for a in weights()]
        self.mlp = _mlp(np.maximum)
        self.compiled = self.eng.compile(self.mlp)
        self.batched = self.eng.compile(self.mlp, batch_axis=0, batched=[0])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.eng.aclose()

    async def p1(self, sizes: PeerSizes) -> tuple[Figures, float]:
        x = self.eng.asarray(np.zeros(sizes.chain_len, dtype=np.float32), device=DEVICE)
        await (x + 1)
        t0 = time.perf_counter()
        y = x
        for _ in range(sizes.chain):
            y = y + 1
        value = await y
        return {"us_per_op": (time.perf_counter() - t0) / sizes.chain * 1e6}, float(_host(value)[0])

    async def p2(self, sizes: PeerSizes) -> tuple[Figures, float]:
        from .._common import randn_on

        eng = self.eng
        randn = functools.partial(randn_on, self._xp())
        for _ in range(eng.config.streams_per_device):  # the generator and cuBLAS, on every stream
            warm = eng.submit_nowait(randn, sizes.side, device=DEVICE)
            await eng.run(np.matmul, warm, warm, device=DEVICE)
        t0 = time.perf_counter()
        for _ in range(sizes.pairs):
            x = eng.submit_nowait(randn, sizes.side, device=DEVICE)
            y = eng.submit_nowait(np.matmul, x, x, device=DEVICE)
        await eng.waitall()
        return {"finish_ms": (time.perf_counter() - t0) * 1e3}, float(y.result().shape[0])

    def _xp(self) -> Any:
        from ...devices.cuda import api_for

        return api_for(self.simulate).xp

    async def p3(self, sizes: PeerSizes) -> tuple[Figures, float]:
        eng = self.eng
        x = eng.asarray(row(0), device=DEVICE)
        await self.mlp(x, *self.w)
        t0 = time.perf_counter()
        for _ in range(sizes.calls):
            out = self.mlp(x, *self.w)
        await eng.waitall()
        eager = (time.perf_counter() - t0) / sizes.calls * 1e6
        for _ in range(2 * eng.config.streams_per_device + 2):  # per stream: a warm-up, then the capture
            await self.compiled(x, *self.w)
        t0 = time.perf_counter()
        for _ in range(sizes.calls):
            compiled = self.compiled(x, *self.w)
        await eng.waitall()
        graphed = (time.perf_counter() - t0) / sizes.calls * 1e6
        check = float(_host(await out).sum())
        assert abs(float(_host(await compiled).sum()) - check) <= 1e-3 * max(1.0, abs(check))
        return {"eager_us_per_call": eager, "compiled_us_per_call": graphed}, check

    async def compiled_call(self, x: np.ndarray[Any, Any]) -> Any:
        """A host row through the compiled MLP (its copy in a task), the result copied back by a task."""
        return await self.compiled(self.eng.asarray(x, device=DEVICE), *self.w).to("cpu")

    async def batched_call(self, x: np.ndarray[Any, Any]) -> Any:
        """A host row through the batched MLP: its batch copies rows in and results out once."""
        return await self.batched(x, *self.w)

    async def p4(self, sizes: PeerSizes) -> tuple[Figures, float]:
        compiled, check = await _coroutines(sizes, self.compiled_call, "compiled")
        batched, again = await _coroutines(sizes, self.batched_call, "batched")
        assert abs(again - check) <= 1e-3 * max(1.0, abs(check))
        return {**compiled, **batched}, check

    async def p5(self, sizes: PeerSizes) -> tuple[Figures, float]:
        return await _serial(sizes, self.batched_call)


def _host(value: Any) -> np.ndarray[Any, Any]:
    return value if isinstance(value, np.ndarray) else np.asarray(value.get())


class _Unavailable(Exception):
    """This system cannot run here; the message says why."""


WORKLOADS = ("p1", "p2", "p3", "p4", "p4b", "p5")


async def measure(system: str, sizes: PeerSizes, simulate: bool) -> dict[str, Any]:
    """Every workload ``system`` has, in this process."""
    try:
        peer = _peer(system, simulate)
    except ImportError as exc:
        return {"system": system, "available": False, "reason": f"not installed ({exc.name or exc})"}
    except _Unavailable as exc:
        return {"system": system, "available": False, "reason": str(exc)}
    figures: dict[str, Figures] = {}
    checks: dict[str, float] = {}
    if isinstance(peer, SchedsvcPeer):
        await peer.__aenter__()
    try:
        for name in WORKLOADS:
            workload = getattr(peer, name, None)
            if workload is None or (name == "p4b" and isinstance(peer, SchedsvcPeer | JaxPeer)):
                continue
            figures[name], checks[name] = await workload(sizes)
    finally:
        if isinstance(peer, SchedsvcPeer):
            await peer.__aexit__()
    return {"system": system, "available": True, "figures": figures, "checks": checks}


def _peer(system: str, simulate: bool) -> Peer:
    kinds: dict[str, type[Peer]] = {
        "schedsvc": SchedsvcPeer,
        "cupy": CupyPeer,
        "torch": TorchPeer,
        "jax": JaxPeer,
    }
    return kinds[system](simulate)  # type: ignore[call-arg]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("--tiny", action="store_true", help="the tiny sizes (tests)")
    parser.add_argument("--simulate", action="store_true", help="on the CUDA simulator (tests only)")
    args = parser.parse_args(argv)
    from .._common import one_blas_thread

    with one_blas_thread():
        result = asyncio.run(measure(args.system, TINY if args.tiny else FULL, args.simulate))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
