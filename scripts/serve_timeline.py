"""When the event loop of a served model waits, and what runs meanwhile: the timeline of a server under wrk.

    .venv/bin/python scripts/serve_timeline.py run wide batched handmade        # wrk, then the figures
    .venv/bin/python scripts/serve_timeline.py run wide batched --max-batch 32  # smaller batches
    .venv/bin/python scripts/serve_timeline.py serve batched wide               # one recording server

``serve`` runs the server of ``schedsvc bench serve`` (``schedsvc.cli.bench._serve_app``) with three things
recorded, each as a (start, end) interval of ``time.perf_counter``: the event loop's waits in its selector
(the loop has nothing to do; with the loop thread's CPU time at both ends), each batch's run (the engine's ``Group._replay``, or the hand-written
batcher's ``forward``) with its number of calls, and each request's time in the app.  ``GET /timeline``
answers what was recorded since the last one (and forgets it).  Recording costs two clock reads and an
append per wait, batch and request: little beside the loop's 100 µs or more per request.

``run`` starts a recording server per variant (as ``schedsvc bench serve`` starts its own), then for each
round and variant: wrk for 1 s (warm-up, forgotten), wrk for ``--seconds`` s, and the record of that run.
It prints the req/s of answers that carry the model's output (wrk with the bench's checking script) and,
over the middle 60% of the run (no ramp at either end): the requests answered, the share of the time the
loop waited, the share of the time a batch ran (one batch or more), and the share of the time the loop
waited *while* a batch ran -- with 64 connections and batches of 64 calls every client waits for the
batch, so the loop does too; the batches' calls and duration; and the loop's work per request (its time out
of the selector), as wall time and as its thread's CPU time: where they differ, the loop waited for the GIL
or for a core.  ``--max-batch N`` caps a batch at N
calls (the engine's and the hand-written batcher's alike), so that a burst is split and the loop has work
while a batch runs.
Needs wrk on PATH; binds 127.0.0.1 only; the servers stop when this script ends.
"""

from __future__ import annotations

import argparse
import selectors
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from _serve_script import add_route, commands, get, load_of, servers  # (beside this script)

#: the share of a run looked at: its middle (wrk's connections open at its start and close at its end)
MIDDLE = (0.2, 0.8)
Interval = list[float]  # [start, end, ...]: perf_counter seconds, then what the kind records


# -- the recording server ---------------------------------------------------------------------------------


class Record:
    """Intervals by kind: ``wait`` (the loop in its selector, then the loop thread's CPU time at its start
    and end), ``batch`` (a batch's run, then its calls),
    ``request`` (a request in the app).  Appended to from the loop and the batch's thread."""

    def __init__(self) -> None:
        self.kinds: dict[str, list[Interval]] = {"wait": [], "batch": [], "request": []}

    def take(self) -> dict[str, list[Interval]]:
        taken, self.kinds = self.kinds, {"wait": [], "batch": [], "request": []}
        return taken


def _instrument(record: Record, max_batch: int | None) -> None:
    """Record the loop's waits, the batches and the requests of the bench's app (patched in place)."""
    from schedsvc.cli.bench import _serve_app as app
    from schedsvc.compile import _fused

    clock, cpu = time.perf_counter, time.thread_time
    loop_thread = threading.get_ident()
    select = selectors.DefaultSelector.select

    def waits(self: Any, timeout: float | None = None) -> Any:
        if threading.get_ident() != loop_thread:
            return select(self, timeout)
        start, cpu_start = clock(), cpu()
        ready = select(self, timeout)
        record.kinds["wait"].append([start, clock(), cpu_start, cpu()])
        return ready

    selectors.DefaultSelector.select = waits  # type: ignore[method-assign]

    replay = _fused.Group._replay

    def engine_batch(self: Any, args: list[Any], rows: list[int], staging: Any = None) -> Any:
        start = clock()
        out = replay(self, args, rows, staging)
        record.kinds["batch"].append([start, clock(), len(rows)])
        return out

    _fused.Group._replay = engine_batch  # type: ignore[method-assign]

    hand_init = app.HandBatcher.__init__

    def hand(self: Any, forward: Any, max_batch_: int = 256) -> None:
        def timed(x: Any) -> Any:
            start = clock()
            out = forward(x)
            record.kinds["batch"].append([start, clock(), len(x)])
            return out

        hand_init(self, timed, max_batch if max_batch is not None else max_batch_)

    app.HandBatcher.__init__ = hand  # type: ignore[method-assign, assignment]
    if max_batch is not None:
        for options in app.ENGINE_VARIANTS.values():
            if options is not None:
                options["max_batch"] = max_batch

    predictor = app._predictor

    def timed_predictor(variant: str, forward: Any, n_out: int) -> Any:
        run = predictor(variant, forward, n_out)

        async def timed(request: Any, x: Any) -> Any:
            start = clock()
            out = await run(request, x)
            record.kinds["request"].append([start, clock()])
            return out

        return timed

    app._predictor = timed_predictor
    add_route("/timeline", record.take)


def serve(variant: str, model: str, max_batch: int | None) -> int:
    """Run the bench's server of ``variant`` and ``model``, recording (``_instrument``)."""
    from schedsvc.cli.bench import _serve_app as app

    _instrument(Record(), max_batch)
    return app.main([variant, model])


# -- reading a record -------------------------------------------------------------------------------------


def _clip(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    return [[max(i[0], start), min(i[1], end), *i[2:]] for i in intervals if i[1] > start and i[0] < end]


def _total(intervals: list[Interval]) -> float:
    return sum(i[1] - i[0] for i in intervals)


def _union(intervals: list[Interval]) -> list[Interval]:
    """The time covered by at least one of ``intervals`` (batches of two workers may run at once)."""
    merged: list[Interval] = []
    for start, end, *_ in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _overlap(a: list[Interval], b: list[Interval]) -> float:
    """The time covered by an interval of ``a`` and one of ``b`` at once; neither list's intervals
    overlap one another."""
    a, b = sorted(a), sorted(b)
    total, j = 0.0, 0
    for start, end, *_ in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += max(0.0, min(end, b[k][1]) - max(start, b[k][0]))
            k += 1
    return total


def analyse(kinds: dict[str, list[Interval]]) -> dict[str, float]:
    """The figures of one run's record, over the middle of the time its requests span (``MIDDLE``)."""
    requests = kinds["request"]
    if not requests:
        raise ValueError("no request was answered in this run")
    if not kinds["wait"]:
        raise ValueError("the event loop's waits were not recorded: is the server on asyncio's own loop?")
    first, last = min(r[0] for r in requests), max(r[1] for r in requests)
    start, end = first + (last - first) * MIDDLE[0], first + (last - first) * MIDDLE[1]
    span = end - start
    waits, batches = _clip(kinds["wait"], start, end), _union(_clip(kinds["batch"], start, end))
    whole = [b for b in kinds["batch"] if start <= b[0] and b[1] <= end]
    return {
        "seconds": span,
        "answered_per_s": sum(1 for r in requests if start <= r[1] < end) / span,
        "loop_waits": _total(waits) / span,
        "batch_runs": _total(batches) / span,
        "loop_waits_while_batch": _overlap(waits, batches) / span,
        "batches": len(whole),
        "calls_per_batch": statistics.median(b[2] for b in whole) if whole else 0.0,
        "batch_ms": statistics.median((b[1] - b[0]) * 1e3 for b in whole) if whole else 0.0,
        **_loop_busy(kinds["wait"], requests, start, end),
    }


def _loop_busy(waits: list[Interval], requests: list[Interval], start: float, end: float) -> dict[str, float]:
    """The loop's time out of its selector per request answered, as wall time and as the loop thread's
    CPU time, between the first and the last wait that lie whole in ``start``..``end``.  Where the two
    differ, the loop was ready to run but did not: it waited for the GIL, or for a core."""
    inside = sorted(w for w in waits if start <= w[0] and w[1] <= end)
    if len(inside) < 2:
        return {"loop_wall_us": 0.0, "loop_cpu_us": 0.0}
    first, last = inside[0], inside[-1]
    answered = sum(1 for r in requests if first[1] <= r[1] < last[0])
    if not answered:
        return {"loop_wall_us": 0.0, "loop_cpu_us": 0.0}
    between = inside[1:-1]
    wall = last[0] - first[1] - sum(w[1] - w[0] for w in between)
    cpu = last[2] - first[3] - sum(w[3] - w[2] for w in between)
    return {"loop_wall_us": wall / answered * 1e6, "loop_cpu_us": cpu / answered * 1e6}


def describe(figures: dict[str, float]) -> str:
    return (
        f"answered {figures['answered_per_s']:,.0f}/s; loop waits {figures['loop_waits']:.1%} of the time, "
        f"{figures['loop_waits_while_batch']:.1%} while a batch runs; batches run {figures['batch_runs']:.1%} "
        f"of the time: {figures['batches']} batches, median {figures['calls_per_batch']:g} calls, "
        f"{figures['batch_ms']:.2f} ms; the loop's work per request: {figures['loop_wall_us']:.0f} µs wall, "
        f"{figures['loop_cpu_us']:.0f} µs CPU"
    )


# -- driving servers under wrk ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from schedsvc.cli.bench._serve_load import wrk_load
    from schedsvc.cli.bench.serve import running

    load_setup = load_of(args.model)
    if load_setup is None:
        return 2
    wrk, body, n_out = load_setup
    extra = [] if args.max_batch is None else ["--max-batch", str(args.max_batch)]
    with running(servers(__file__, args.model, args.variants, extra)) as started:
        for round_ in range(1, args.rounds + 1):
            for server in started:
                wrk_load(wrk, server.port, body, n_out, 1, args.connections)  # warm-up
                get(server.port, "/timeline")  # (the warm-up's record, forgotten)
                load = wrk_load(wrk, server.port, body, n_out, args.seconds, args.connections)
                figures = analyse(get(server.port, "/timeline"))
                rps = load.figures()["rps"]
                print(
                    f"{args.model} {server.variant} round {round_}: wrk {rps:,.0f} req/s; {describe(figures)}"
                )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, one, many = commands(
        __doc__, "recording server", "recording servers under wrk, and their figures", 3
    )
    many.add_argument("--rounds", type=int, default=2, help="rounds, the variants interleaved (default 2)")
    for command in (one, many):
        command.add_argument("--max-batch", type=int, default=None, help="the most calls a batch takes")
    args = parser.parse_args(argv)
    if args.max_batch is not None and args.max_batch < 1:
        parser.error("--max-batch must be at least 1")
    if args.command == "serve":
        return serve(args.variant, args.model, args.max_batch)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
