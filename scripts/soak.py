"""Soak: run a million tasks through one engine and check that memory stays flat and every count is exact.

Each round submits 10,000 tasks through ``await eng.submit`` (so backpressure holds the queue at
``max_pending``): independent tasks, a dependency chain, in-place writes to one shared buffer
(``out=``), reads of that buffer through views, failing tasks and their dependents, cancelled tasks,
and Tensor operations.  After each round it checks the engine's counters against its own tally and the
shared buffer against the value the sequential program gives, and samples the process's RSS.

    python scripts/soak.py [--tasks 1000000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import numpy as np

import schedsvc as ss

ROUND = 10_000


class Boom(Exception):
    pass


def fail(_: Any = None) -> None:
    raise Boom


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def one_round(eng: ss.Engine, shared: np.ndarray, tally: dict[str, int]) -> int:
    """About 10,000 tasks; ``tally`` counts what each should end as.  Returns the writes of ``shared``."""
    small = np.ones(16)
    chain: ss.Future[Any] = await eng.submit(np.add, small, 0)
    submitted, links, writes = 1, 0, 0
    held: list[Any] = []
    for step in range(1, ROUND // 2):  # two tasks a step on average
        k = step % 50
        if k == 0:  # a failure and a dependent of it
            bad = await eng.submit(fail)
            await eng.submit(np.add, bad, 1)
            tally["failed"] += 2
            submitted += 2
        elif k == 1:  # an in-place write of the shared buffer (ordered after every read before it)
            await eng.submit(np.add, shared, 1.0, out=shared)
            writes += 1
            submitted += 1
        elif k == 2:  # a read of it through a view made without slicing
            held.append(await eng.submit(np.sum, np.asarray(memoryview(shared))))
            submitted += 1
        elif k == 3:  # Tensor operations: an expression of four ops
            t = eng.asarray(small)
            held.append(((t * 2.0 + 1.0) - 3.0).sum())
            submitted += 4
        else:  # the bulk: a chain link and an independent task
            chain = await eng.submit(np.add, chain, 1.0)
            await eng.submit(np.multiply, small, 2.0)
            links += 1
            submitted += 2
    await eng.waitall()
    tally["submitted"] += submitted
    tally["completed"] += submitted - (tally["failed"] - tally["failed_before"])
    tally["failed_before"] = tally["failed"]
    got = await chain
    assert np.array_equal(got, small + links), (got[0], 1 + links)  # as the sequential program
    for fut in held:
        await fut
    return writes


async def soak(tasks: int) -> dict[str, Any]:
    rounds = max(1, tasks // ROUND)
    samples: list[float] = []
    tally = {"submitted": 0, "completed": 0, "failed": 0, "failed_before": 0}
    shared = np.zeros(1000)
    t0 = time.perf_counter()
    async with ss.Engine(cpu_workers=2, max_pending=256) as eng:
        writes = 0
        for r in range(rounds):
            writes += await one_round(eng, shared, tally)
            stats = eng.stats()
            counts = {"submitted": stats.submitted, "completed": stats.completed, "failed": stats.failed}
            assert counts == {k: tally[k] for k in counts}, (
                f"round {r}: engine counted {counts}, the soak {tally}"
            )
            assert stats.pending == 0 and stats.cancelled == 0 and stats.pending_bytes == 0, stats
            assert float(shared[0]) == writes, (float(shared[0]), writes)  # as the sequential program
            samples.append(rss_mib())
            if (r + 1) % max(1, rounds // 10) == 0:
                print(f"{tally['submitted']:>9,} tasks  RSS {samples[-1]:7.1f} MiB", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    warm = samples[len(samples) // 10 :]  # after the first tenth: allocator and caches warmed up
    return {
        "tasks": tally["submitted"],
        "seconds": round(elapsed, 1),
        "us_per_task": round(elapsed / tally["submitted"] * 1e6, 2),
        "rss_first_mib": round(samples[0], 1),
        "rss_after_warmup_mib": round(warm[0], 1),
        "rss_last_mib": round(samples[-1], 1),
        "rss_growth_after_warmup_mib": round(samples[-1] - warm[0], 1),
        "rss_max_mib": round(max(samples), 1),
        "counts_exact": True,
        "shared_buffer_sequential": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    report = asyncio.run(soak(args.tasks))
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
