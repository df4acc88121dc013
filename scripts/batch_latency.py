"""Closed-loop latency of a batched MLP: 64 coroutines each awaiting one-row calls, fast mode and exact.

    .venv/bin/python scripts/batch_latency.py --seconds 3 --rounds 3

A ``Batched`` of a 64-1024-1024-10 float32 MLP (weights from a fixed seed), BLAS held at one thread (as a
server would), ``--callers`` asyncio tasks each calling ``await model(x_row)`` in a loop for ``--seconds``;
per round and mode it prints calls/s, p50 and p99 latency, and the batch sizes seen.  ``--request-us``
holds the loop that long before each call, as a web server's request parsing does, so that calls arrive
spread out rather than all at once.  The modes are
interleaved round by round, as the machine may be shared and noisy: compare ranges, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import schedsvc as ss

rng = np.random.default_rng(0)
W1 = (rng.standard_normal((64, 1024)) / 8).astype(np.float32)
W2 = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
W3 = (rng.standard_normal((1024, 10)) / 32).astype(np.float32)


def forward(x: Any) -> Any:
    return np.maximum(np.maximum(x @ W1, 0) @ W2, 0) @ W3


def busy(seconds: float) -> None:
    """Hold the event loop's thread (and the GIL) for ``seconds``, as a web server parsing a request does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def closed_loop(
    model: Any, callers: int, seconds: float, request_s: float = 0.0
) -> tuple[float, list[float]]:
    """(calls/s, latencies in seconds) of ``callers`` coroutines calling ``model`` on one row each; with
    ``request_s``, each call first holds the loop that long (its request's parsing), spreading the calls."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    rows = rng.standard_normal((callers, 1, 64)).astype(np.float32)

    async def caller(x: Any) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            if request_s:
                busy(request_s)
            await model(x)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for i in range(callers):
            tg.create_task(caller(rows[i]))
    return len(latencies) / (time.perf_counter() - t0), latencies


def sizes(before: dict[int, int], after: dict[int, int]) -> str:
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    batches = sum(diff.values())
    rows = sum(k * v for k, v in diff.items())
    top = sorted(diff.items(), key=lambda kv: -kv[1])[:4]
    return f"mean batch {rows / max(batches, 1):5.1f} rows; most {top}"


async def main(args: argparse.Namespace) -> None:
    async with ss.Engine(cpu_workers=args.workers, max_pending=4096) as eng:
        models = {
            "fast": eng.compile(forward, batch_axis=0, exact=False, name="fast"),
            "exact": eng.compile(forward, batch_axis=0, exact=True, name="exact"),
        }
        x = np.zeros((1, 64), np.float32)
        for model in models.values():  # traced, and every padded size of one-row calls too
            n = 1
            while n <= model.max_batch:
                await asyncio.gather(*(model(x) for _ in range(n)))
                n *= 2
        for r in range(args.rounds):
            for mode, model in models.items():
                before = dict(model.stats()["batch_sizes"])
                rate, lat = await closed_loop(model, args.callers, args.seconds, args.request_us * 1e-6)
                p50, p99 = np.percentile(np.array(lat) * 1e3, [50, 99])
                print(
                    f"round {r} {mode:5s}: {rate:7.0f} calls/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                    f"{sizes(before, model.stats()['batch_sizes'])}",
                    flush=True,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--request-us",
        type=float,
        default=0.0,
        help="loop time each call takes first, as an HTTP server's parsing",
    )
    args = parser.parse_args()
    with threadpool_limits(1):
        asyncio.run(main(args))
