"""A three-stage pipeline: load on the CPU -> compute -> postprocess, overlapped with ``eng.map``.

Run: ``python examples/pipeline.py`` (prints the results' checksum and both timings).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import numpy as np
from threadpoolctl import threadpool_limits

import schedsvc as ss

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((512, 512)).astype(np.float32) / 512**0.5
W2 = RNG.standard_normal((512, 64)).astype(np.float32) / 512**0.5


def load(i: int) -> np.ndarray:
    """Stage 1, I/O-like: read and decode a batch (here: generate it)."""
    return np.random.default_rng(i).standard_normal((512, 512)).astype(np.float32)


def compute(batch: np.ndarray) -> np.ndarray:
    """Stage 2: the model."""
    out: np.ndarray = np.maximum(batch @ W1, 0) @ W2
    return out


def postprocess(out: np.ndarray) -> float:
    """Stage 3: reduce to what we keep."""
    return float(np.abs(out).mean())


async def batch_ids(n: int) -> AsyncIterator[int]:
    """An async source, e.g. ids arriving from a queue or a socket."""
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def main(n: int = 48) -> list[float]:
    async with ss.Engine(cpu_workers=2) as eng:
        loaded = eng.map(load, batch_ids(n), max_inflight=4)  # at most 4 batches loaded ahead
        computed = eng.map(compute, loaded, max_inflight=4)
        results = [r async for r in eng.map(postprocess, computed, max_inflight=8)]  # in source order
    return results


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    compute(load(0))  # warm both runs alike
    with threadpool_limits(1):  # BLAS at one thread: the parallelism shown is the engine's
        t0 = time.perf_counter()
        sequential = [postprocess(compute(load(i))) for i in range(n)]
        t1 = time.perf_counter()
        piped = asyncio.run(main(n))
        t2 = time.perf_counter()
    assert piped == sequential, "the pipeline must give what the sequential loop gives"
    print(f"{n} batches, checksum {sum(piped):.4f}")
    print(f"sequential loop: {t1 - t0:.3f} s;  eng.map pipeline, 2 workers: {t2 - t1:.3f} s")
