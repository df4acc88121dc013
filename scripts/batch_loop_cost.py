"""What a batched call costs the event loop: coroutines that each await one-row calls of the serve bench's
model, in a closed loop, with no HTTP; per variant, the loop thread's CPU time per call, the whole process's,
calls per second and rows per batch (medians over rounds, the variants interleaved).

    python scripts/batch_loop_cost.py [--model digits] [--seconds 2] [--rounds 3] [--callers 64]
        [--parse-us 0] [--variants inline,handmade,batched,batched_w1]

Variants: ``inline`` (the model called on the loop), ``handmade`` (the serve bench's hand-written batcher:
a list, one thread, one loop wake per batch), ``batched`` (``eng.compile(forward, batch_axis=0)``, the
engine's defaults), ``batched_wN`` (the same with ``cpu_workers=N``).  ``--parse-us`` spins that long on the
loop before each call, as a server parses a request.  BLAS is held at one thread throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import schedsvc as ss
from schedsvc.cli.bench._serve_app import MODELS, HandBatcher, make_forward


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def closed_loop(
    call: Callable[[np.ndarray], Awaitable[Any]], row: np.ndarray, args: argparse.Namespace
) -> dict[str, float]:
    """``args.callers`` coroutines awaiting ``call(row)`` one after another for ``args.seconds``."""
    calls = 0
    stop = time.perf_counter() + args.seconds
    parse = args.parse_us / 1e6

    async def caller() -> None:
        nonlocal calls
        while time.perf_counter() < stop:
            if parse:
                spin(parse)
            await call(row)
            calls += 1

    loop0, cpu0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(args.callers)))
    wall, loop_cpu, cpu = time.perf_counter() - wall0, time.thread_time() - loop0, time.process_time() - cpu0
    return {"calls_s": calls / wall, "loop_us": loop_cpu / calls * 1e6, "cpu_us": cpu / calls * 1e6}


async def measure(variant: str, args: argparse.Namespace) -> dict[str, float]:
    forward = make_forward(args.model)
    row = np.ones((1, MODELS[args.model][0]), np.float32)
    if variant == "inline":

        async def inline(x: np.ndarray) -> Any:
            return forward(x)

        return await closed_loop(inline, row, args)
    if variant == "handmade":
        batcher = HandBatcher(forward)
        batcher.start()
        try:
            return await closed_loop(batcher, row, args)
        finally:
            batcher.stop()
    options: dict[str, Any] = {"blas_threads": 1}
    if variant != "batched":
        options["cpu_workers"] = int(variant.removeprefix("batched_w"))
    async with ss.Engine(**options) as eng:
        model = eng.compile(forward, batch_axis=0)
        await model(row)  # traced and timed before the clock starts
        figures = await closed_loop(model, row, args)
        stats = model.stats()
        figures["rows_per_batch"] = stats["rows"] / max(1, stats["batches"])
        figures["inline_calls"] = stats.get("inline_calls", 0)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=list(MODELS), default="digits")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--parse-us", type=float, default=0.0)
    parser.add_argument("--variants", default="inline,handmade,batched")
    args = parser.parse_args()
    variants = args.variants.split(",")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with threadpool_limits(limits=1):
        for _ in range(args.rounds):
            for variant in variants:
                runs[variant].append(asyncio.run(measure(variant, args)))
    print(f"{args.model}, {args.callers} callers, parse {args.parse_us:g} µs, median of {args.rounds} rounds")
    for variant, figures in runs.items():
        med = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
        extra = ""
        if "rows_per_batch" in med:
            extra = f"  rows/batch {med['rows_per_batch']:.1f}  inline calls {med['inline_calls']:.0f}"
        print(
            f"  {variant:12s} calls/s {med['calls_s']:9,.0f}  loop CPU µs/call {med['loop_us']:5.2f}"
            f"  process CPU µs/call {med['cpu_us']:5.2f}{extra}"
        )


if __name__ == "__main__":
    main()
