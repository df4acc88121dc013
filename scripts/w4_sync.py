"""The W4 sync loop of ``schedsvc bench core``, for counting instructions per ``eng.run`` with callgrind.

    valgrind --tool=callgrind --callgrind-out-file=/tmp/w4.%p python scripts/w4_sync.py 2000 1e6
    valgrind --tool=callgrind --callgrind-out-file=/tmp/w4_0.%p python scripts/w4_sync.py 0 1e6

``N`` x ``await eng.run(np.add, x, 1)`` with ``x = np.ones(1)``, awaited one by
one, on an engine set up as the benchmark sets it up (``cpu_workers`` one per
core and at least 2), with ``inline_threshold_us`` the second argument
(default 20, the benchmark's).  Natively np.add takes about a microsecond, so
each task runs inline in the awaiting coroutine; under callgrind everything runs
some fifty times slower, the learned cost passes 20 us and every task would make
the round trip through a worker thread instead: count with a threshold of 1e6
(``scripts/hot_path.sh N w4`` does), which keeps the native decision.

The run with ``N=0`` does everything else (imports, start, the warm-up task, a
check, close): subtract its total and divide by ``N`` for instructions per
``eng.run``.  The check, after the loop, runs ``CHECKS`` more tasks of
``threading.get_ident`` (a builtin that, as np.add, may run in the awaiting
coroutine: a user's function never does) and prints how many ran inline: a
count is only the inline path's if they all did.
"""

import asyncio
import os
import sys
import threading

import numpy as np

import schedsvc as ss

CHECKS = 20


async def main(n: int, threshold_us: float) -> None:
    workers = max(2, os.cpu_count() or 1)  # as the benchmark's bench_workers()
    engine = ss.Engine(cpu_workers=workers, max_pending=40_000, inline_threshold_us=threshold_us)
    async with engine as eng:
        x = np.ones(1)
        await eng.run(np.add, x, 1)  # warm, as the benchmark does: the first run learns the cost
        for _ in range(n):
            await eng.run(np.add, x, 1)
        here = threading.get_ident()
        await eng.run(threading.get_ident)  # (learns its cost)
        inline = 0
        for _ in range(CHECKS):
            inline += await eng.run(threading.get_ident) == here
    print(f"N={n}; check: {inline} of {CHECKS} tasks ran inline", file=sys.stderr)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000
    asyncio.run(main(n, float(sys.argv[2]) if len(sys.argv) > 2 else 20.0))
