"""What a served request costs under wrk, in bytecodes by thread: the server of ``schedsvc bench serve`` with
an opcode counter in its process.

    .venv/bin/python scripts/serve_ops.py run digits handmade batched   # wrk, then each variant's counts
    .venv/bin/python scripts/serve_ops.py serve batched digits          # one counting server

``serve_path.py ops`` counts the app's and the engine's bytecodes in process, with no sockets; this counts
them in the real server -- uvicorn's and asyncio's included -- as wrk drives it, so a difference between
two variants over HTTP can be read without the noise of a time.  Unlike a time, a count hardly moves from
run to run.  The counter makes the server about twenty times slower, so its batches fill as under a heavier
load: compare variants counted alike, not with figures of a server without it.

``serve`` counts from its start; ``GET /ops`` answers the counts since the previous one (and forgets them).
``run`` starts a counting server per variant, then for each: wrk for 1 s (warm-up, forgotten) and wrk for
``--seconds`` s, whose answered requests divide the counts.  Needs wrk on PATH; binds 127.0.0.1 only; the
servers stop when this script ends.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from collections.abc import Sequence

from _opcount import OpCounter  # (beside this script)
from _serve_script import add_route, commands, get, load_of, servers


def serve(variant: str, model: str) -> int:
    """Run the bench's server of ``variant`` and ``model`` with every thread's bytecodes counted."""
    from schedsvc.cli.bench import _serve_app as app

    loop_thread = threading.get_ident()  # (the server's event loop runs on this thread)
    counter = OpCounter(lambda: "loop" if threading.get_ident() == loop_thread else "workers")
    counter.on = True
    threading.settrace(counter.tracer)  # the engine's workers start with the app
    sys.settrace(counter.tracer)
    add_route("/ops", lambda: [[*key, count] for key, count in counter.take().items()])
    return app.main([variant, model])


def _ops(port: int) -> OpCounter:
    """The counts the server at ``port`` made since the previous read, as a counter to report from."""
    counted = OpCounter(lambda: "")
    rows = get(port, "/ops")
    counted.add(Counter({(label, name, own, ran_for): count for label, name, own, ran_for, count in rows}))
    return counted


def run(args: argparse.Namespace) -> int:
    from schedsvc.cli.bench._serve_load import wrk_load
    from schedsvc.cli.bench.serve import running

    load_setup = load_of(args.model)
    if load_setup is None:
        return 2
    wrk, body, n_out = load_setup
    with running(servers(__file__, args.model, args.variants)) as started:
        for server in started:
            wrk_load(wrk, server.port, body, n_out, 1, args.connections)  # warm-up
            _ops(server.port)  # (the warm-up's counts, forgotten)
            load = wrk_load(wrk, server.port, body, n_out, args.seconds, args.connections)
            counted = _ops(server.port)
            if not load.ok:
                print(f"{args.model} {server.variant}: no request was answered", file=sys.stderr)
                return 1
            print(
                f"{args.model} {server.variant}: {load.ok:,} requests answered under wrk ({args.connections} connections)"
            )
            counted.report(load.ok, "request", ("loop", "workers"), args.top)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, _, many = commands(__doc__, "counting server", "counting servers under wrk, and their counts", 4)
    many.add_argument("--top", type=int, default=25, help="functions listed per thread (default 25)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.variant, args.model)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
