"""Where a GPU op's time goes, and G3 repeated: two probes for a GPU machine, beside ``schedsvc bench gpu``.

    python3 scripts/gpu_probe.py chain 2000                 # µs per Tensor op queued and finished, cpu and cuda:0
    python3 scripts/gpu_probe.py chain 2000 --profile cpu   # ... then that chain on cuda:0 profiled by thread
    python3 scripts/gpu_probe.py ops 500 --simulate           # the engine's bytecodes per op, by thread
    python3 scripts/gpu_probe.py g3 3                        # G3 of the GPU bench run 3 times, a JSON line each

``chain N`` is G1's workload (``y = y + 1`` on 1,000 float32, N times, then one wait) on an engine with the
CPU and the GPU: three chains on each device, each printed as the µs per op it took to queue (the loop's
time) and to finish (the last result awaited).  With ``--profile cpu|wall`` a fourth chain on the GPU runs
under yappi (``pip install yappi``; it profiles every thread), and each thread's functions are listed by
their own time per op.  yappi's hooks inflate every Python call: read the shares, not the sums.

``ops N`` runs that chain on the GPU with an opcode tracer and prints the bytecodes each thread runs per op
(the event loop's, the device's own thread's, the streams' watchers'), with the engine's share and the functions
that run the most.  The count hardly moves from run to run, and it is the same on the simulator as on a GPU
for the engine's own modules (the simulator's, standing for CuPy and the GPU, are not the engine's): so a
change on the path of a GPU op can be measured here, before it is timed on a GPU.

``g3 N`` runs the bench's G3 case (a NumPy workload and a CuPy workload submitted together, against the
longer alone) N times in this process and prints each run's figures.  Run it from two checkouts in turn
(``PYTHONPATH=OTHER-CHECKOUT``) to tell a change in the code from one of the machine.

``--simulate`` runs either probe on the CUDA simulator at the bench's tiny sizes (tests only: its figures
time the simulator, not a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any

import numpy as np
from _opcount import OpCounter  # (beside this script)

from schedsvc.cli._common import one_blas_thread
from schedsvc.cli.bench import gpu as bench
from schedsvc.devices.cuda import api_for, check


async def _chain(x: Any, n: int) -> tuple[float, float]:
    """µs per op to queue ``n`` chained ``y + 1`` on ``x``, and to finish them."""
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        y = y + 1
    t1 = time.perf_counter()
    await y
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / n, (t2 - t0) * 1e6 / n


async def chain(b: bench.Bench, n: int, profile: str | None) -> None:
    for device in ("cpu", bench.DEVICE):
        async with b.engine() as eng:
            x = eng.asarray(np.zeros(1000, np.float32), device=device)
            await (x + 1)  # warm
            for _ in range(3):
                queued, finished = await _chain(x, n)
                print(f"{device}: queue {queued:.1f} µs/op, finish {finished:.1f} µs/op", flush=True)
    if profile is not None:
        await _profiled(b, n, profile)


async def _profiled(b: bench.Bench, n: int, clock: str) -> None:
    try:
        import yappi
    except ImportError:
        sys.exit("--profile needs yappi: pip install yappi")
    yappi.set_clock_type(clock)
    yappi.start(builtins=False, profile_threads=True)  # before the engine: its threads are profiled too
    async with b.engine() as eng:
        x = eng.asarray(np.zeros(1000, np.float32), device=bench.DEVICE)
        await (x + 1)
        yappi.clear_stats()
        queued, finished = await _chain(x, n)
        yappi.stop()
    print(f"{bench.DEVICE}, profiled ({clock} clock): queue {queued:.1f} µs/op, finish {finished:.1f} µs/op")
    for thread in sorted(yappi.get_thread_stats(), key=lambda t: -t.ttot):
        print(f"\n{thread.name} (id {thread.id}): {thread.ttot * 1e6 / n:.1f} µs/op")
        stats = yappi.get_func_stats(filter={"ctx_id": thread.id})
        stats.sort("tsub")
        for s in list(stats)[:18]:
            where = s.module.split("site-packages/")[-1].split("schedsvc/")[-1]
            print(
                f"  {s.tsub * 1e6 / n:7.2f} own {s.ttot * 1e6 / n:7.2f} total µs/op"
                f"  {s.ncall / n:5.2f} calls/op  {where}:{s.lineno} {s.name}"
            )


async def ops(b: bench.Bench, n: int, top: int) -> None:
    main_thread = threading.main_thread()
    device = f"schedsvc-{bench.DEVICE}"

    def label() -> str:
        thread = threading.current_thread()
        if thread is main_thread:
            return "loop"
        if thread.name == device:
            return "device"
        return "watchers" if thread.name.startswith(device + "/") else "others"

    counter = OpCounter(label)
    threading.settrace(counter.tracer)  # the engine's threads start inside: traced while ``on``
    # the tracer makes every launch far slower than 1 ms: a bound of 1,000 s keeps the untraced decision of
    # where a launch is made (the thread that made it ready, once its kind has been launched)
    async with b.engine(cuda_launch_inline_us=1e9) as eng:
        x = eng.asarray(np.zeros(1000, np.float32), device=bench.DEVICE)
        await _chain(x, 10)  # warm
        counter.on = True
        sys.settrace(counter.tracer)
        try:
            await _chain(x, n)
        finally:
            sys.settrace(None)
            counter.on = False
    threading.settrace(None)  # type: ignore[arg-type]  # (None stops it, as sys.settrace's does)
    counter.report(n, "op", ("loop", "device", "watchers", "others"), top)


def g3(b: bench.Bench, runs: int) -> None:
    with one_blas_thread():  # as the bench holds it
        for run in range(runs):
            figures = asyncio.run(bench.g3(b, run % 2 == 0))
            print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=("chain", "ops", "g3"))
    parser.add_argument("n", type=int, help="chain, ops: ops in the chain; g3: runs")
    parser.add_argument("--top", type=int, default=15, help="ops: functions listed per thread (default 15)")
    parser.add_argument("--profile", choices=("cpu", "wall"), help="chain: also profile it by thread (yappi)")
    parser.add_argument("--simulate", action="store_true", help="on the CUDA simulator (tests only)")
    args = parser.parse_args()
    if not args.simulate and (reason := bench.unavailable()) is not None:
        sys.exit(f"no GPU to probe: {reason}")
    if args.simulate:
        check(0, simulated=True)
    b = bench.Bench(api_for(args.simulate), bench.TINY if args.simulate else bench.FULL, args.simulate)
    if args.probe == "chain":
        asyncio.run(chain(b, args.n, args.profile))
    elif args.probe == "ops":
        asyncio.run(ops(b, args.n, args.top))
    else:
        g3(b, args.n)


if __name__ == "__main__":
    main()
