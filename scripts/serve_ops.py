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
import json
import shutil
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _opcount import OpCounter  # (beside this script)


def serve(variant: str, model: str) -> int:
    """Run the bench's server of ``variant`` and ``model`` with every thread's bytecodes counted."""
    from schedsvc.cli.bench import _serve_app as app

    loop_thread = threading.get_ident()  # (the server's event loop runs on this thread)
    counter = OpCounter(lambda: "loop" if threading.get_ident() == loop_thread else "workers")
    counter.on = True
    threading.settrace(counter.tracer)  # the engine's workers start with the app
    sys.settrace(counter.tracer)
    create_app = app.create_app

    def with_ops(variant: str, model: str, **options: Any) -> Any:
        from starlette.responses import JSONResponse

        served = create_app(variant, model, **options)

        async def ops(request: Any) -> Any:
            return JSONResponse([[*key, count] for key, count in counter.take().items()])

        served.add_route("/ops", ops, methods=["GET"])
        return served

    app.create_app = with_ops
    return app.main([variant, model])


def _counting(variant: str, model: str) -> Any:
    """The bench's ``Server`` of ``variant``, started as a counting server of this script."""
    from schedsvc.cli.bench.serve import Server

    class Counting(Server):
        def command(self) -> list[str]:
            return [sys.executable, str(Path(__file__).resolve()), "serve", self.variant, self.model]

    return Counting(variant, model)


def _ops(port: int) -> OpCounter:
    """The counts the server at ``port`` made since the previous read, as a counter to report from."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ops", timeout=60) as answer:
        rows = json.loads(answer.read())
    counted = OpCounter(lambda: "")
    counted.add(Counter({(label, name, own, ran_for): count for label, name, own, ran_for, count in rows}))
    return counted


def run(args: argparse.Namespace) -> int:
    from schedsvc.cli.bench._serve_app import MODELS, request_row
    from schedsvc.cli.bench._serve_load import wrk_load
    from schedsvc.cli.bench.serve import running

    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not on PATH (Debian, Ubuntu: apt-get install wrk)", file=sys.stderr)
        return 2
    body, n_out = json.dumps({"x": request_row(args.model)}).encode(), MODELS[args.model][-1]
    servers = [_counting(variant, args.model) for variant in args.variants]
    with running(servers):
        for server in servers:
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("serve", help="one counting server (prints 'ready PORT')")
    one.add_argument("variant")
    one.add_argument("model")
    many = commands.add_parser("run", help="counting servers under wrk, and their counts per request")
    many.add_argument("model")
    many.add_argument("variants", nargs="+")
    many.add_argument("--seconds", type=int, default=4, help="of counted load per variant (default 4)")
    many.add_argument("--connections", type=int, default=64, help="wrk's connections (default 64)")
    many.add_argument("--top", type=int, default=25, help="functions listed per thread (default 25)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.variant, args.model)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
