"""The hot path's fixed workload, for counting instructions per task with callgrind.

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python scripts/hot_path.py 10000
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg0.%p python scripts/hot_path.py 0

``N`` tiny independent ``np.add`` tasks, each admitted with ``await eng.submit``
and then awaited, then an ``N``-link chain (each task takes the previous one's
value), on 2 CPU workers.  The run with ``N=0`` does everything else (imports,
start, close): subtract its total and divide by ``2 N`` for instructions per
task.  ``scripts/hot_path.sh`` does both runs and the arithmetic.
"""

import asyncio
import sys

import numpy as np

import schedsvc as ss


async def main(n: int) -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2 * n + 16) as eng:
        x = np.ones(2)
        await eng.run(np.add, x, 1)  # warm: the first task starts the workers' loops
        futures = [await eng.submit(np.add, x, 1) for _ in range(n)]
        for future in futures:
            await future
        f = eng.submit_nowait(np.add, x, 1)
        for _ in range(n):
            f = eng.submit_nowait(np.add, f, 1)
        await f


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000))
