"""Where a batched call's time on the event loop goes: its parts timed apart, in nanoseconds of the loop
thread's CPU per call (the 10th percentile over bursts, as the least disturbed figure).

    .venv/bin/python scripts/batch_call_parts.py [--model digits] [--bursts 3000] [--calls 64]

Each burst makes ``--calls`` one-row calls of the serve bench's model (``eng.compile(forward, batch_axis=0)``,
BLAS at one thread) on the loop, in the parts the call is made of, then awaits them all:

- ``build``: the call's record (``BatchCall`` and its fields), made as ``fn(x)`` makes it;
- ``rows call``: ``Batched._rows_call``, the call made ready to hold (``build`` and the key's group);
- ``door``: ``Port.hold`` of calls so made: the checks, the engine's lock, the core's registration;
- ``core``: ``Scheduler.hold`` alone, under one hold of the lock for the burst;
- ``lock``: taking and releasing the engine's lock once;
- ``fn(x)``: the whole call, as a server makes it;
- ``await``: awaiting the calls of ``fn(x)`` one by one, the batch's hand-over and wake-up included.

A development tool: it reaches into the engine's private parts, which it names as they are at this commit.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

import schedsvc as ss
from schedsvc.cli.bench._serve_app import MODELS, make_forward
from schedsvc.compile._batchcall import BatchCall

PARTS = ("build", "rows call", "door", "core", "lock", "fn(x)", "await")


async def measure(args: argparse.Namespace) -> dict[str, float]:
    clock = time.thread_time_ns
    n = args.calls
    async with ss.Engine(max_pending=1 << 20) as eng:
        fn = eng.compile(make_forward(args.model), batch_axis=0)
        rows = [np.ones((1, MODELS[args.model][0]), np.float32) for _ in range(n)]
        await fn(rows[0])
        port = fn._port
        rt = port._rt
        assert rt is not None and fn._last is not None
        core, lock, group = rt.core, rt.lock, fn._last[2]
        tid = threading.get_ident()
        figures: dict[str, list[float]] = {part: [] for part in PARTS}
        for _ in range(args.bursts):
            t0 = clock()
            for x in rows:
                BatchCall.__new__(BatchCall).rows_call(port, group, x, 1, group.device or port.host_device)
            t1 = clock()
            held = [fn._rows_call(x, x.shape, tid, False) for x in rows]
            t2 = clock()
            for call in held:
                port.hold(call, tid)
            t3 = clock()
            alone = [fn._rows_call(x, x.shape, tid, False) for x in rows]
            t4 = clock()
            with lock:
                for call in alone:
                    core.hold(call)
            t5 = clock()
            for _ in rows:
                with lock:
                    pass
            t6 = clock()
            calls = [fn(x) for x in rows]
            t7 = clock()
            for call in calls:
                await call
            t8 = clock()
            for call in (*held, *alone):  # (the worker woken for the burst took them with the others)
                await call
            spans = (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t7 - t6, t8 - t7)
            for part, span in zip(PARTS, spans, strict=True):
                figures[part].append(span / n)
    return {part: sorted(values)[len(values) // 10] for part, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="digits")
    parser.add_argument("--bursts", type=int, default=3000)
    parser.add_argument("--calls", type=int, default=64)
    args = parser.parse_args()
    with threadpool_limits(limits=1):
        figures = asyncio.run(measure(args))
    print(
        f"{args.model}, bursts of {args.calls} one-row calls: ns of loop CPU per call (p10 over {args.bursts})"
    )
    for part, ns in figures.items():
        print(f"  {part:10} {ns:7.0f}")


if __name__ == "__main__":
    main()
