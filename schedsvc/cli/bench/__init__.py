"""``schedsvc bench``: benchmark suites, each against baselines measured in the same run.

One module per suite (``core``, ``tensor``, ``batch``, ``dask``, ``gpu``, ``serve``), each with
``run(reps=..., progress=...) -> report`` and ``format_report(report)``; this
command imports the suite it runs (the ``dask`` suite needs the extra; the ``gpu``
suite needs a GPU, and without one says so and measures nothing; the ``serve``
suite needs uvicorn and Starlette, and takes options of its own).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from .._common import emit, fail, output_problem, progress

__all__ = ["SUITES", "register", "run"]

SUITES = ("core", "tensor", "batch", "dask", "gpu", "serve")


def register(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks against baselines measured in the same run",
        description="Run one benchmark suite; every figure is a median over interleaved repetitions and "
        "every ratio is against a baseline measured in the same run. Suites: core (the scheduler against "
        "a thread pool), tensor (Tensor ops and compiled functions), batch (dynamic batching), dask, gpu "
        "(needs a GPU; --peers: PyTorch, JAX), serve (an HTTP model server under wrk).",
    )
    bench.add_argument("suite", choices=list(SUITES), help="which benchmark suite")
    bench.add_argument(
        "--reps", "--rounds", type=int, default=5, help="interleaved repetitions (median reported)"
    )
    bench.add_argument(
        "--cases",
        "--variants",
        help="comma-separated subset of cases (core: ratios need all; serve: variants)",
    )
    bench.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    bench.add_argument(
        "--peers",
        action="store_true",
        help="gpu suite: the sources' workloads P1-P5 on schedsvc, raw CuPy, PyTorch and JAX (a process each)",
    )
    # tests only: the gpu suite's code on the CUDA simulator at tiny sizes, its figures labelled as not real
    bench.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    _serve_options(bench.add_argument_group("serve suite"))
    bench.set_defaults(run=run)


#: the serve suite's options and their defaults (None: the option was not given)
SERVE_OPTIONS = ("duration", "connections", "model", "client", "overload", "max_pending", "cpus", "processes")


def _serve_options(group: Any) -> None:
    group.add_argument("--duration", type=float, help="seconds of load per variant and round (default 3)")
    group.add_argument("--connections", type=int, help="connections kept busy (default 64)")
    group.add_argument("--model", choices=["digits", "wide", "both"], help="the model served (default both)")
    group.add_argument(
        "--client", choices=["auto", "wrk", "asyncio"], help="load generator (default auto: wrk if on PATH)"
    )
    group.add_argument(
        "--overload",
        action="store_true",
        default=None,
        help="also batched with a small max_pending under 256 connections: 503s, health, peak RSS",
    )
    group.add_argument("--max-pending", type=int, help="the overload server's max_pending (default 64)")
    group.add_argument(
        "--cpus",
        metavar="LIST",
        help="pin the servers and the load to cores: SERVER:CLIENT cpu lists (e.g. 0-7:8-15), or one list "
        "both share (e.g. 0,1); default: not pinned",
    )
    group.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="uvicorn processes per server on one socket, each with its own loop and engine, each on its "
        "share of the server's cores (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand."""
    if args.reps < 1:
        return fail("bench", "--reps must be at least 1")
    if problem := output_problem("--json", args.json):
        return fail("bench", problem)
    if args.simulate and args.suite != "gpu":
        return fail("bench", "--simulate applies to the gpu suite only")
    if args.peers and args.suite != "gpu":
        return fail("bench", "--peers applies to the gpu suite only")
    if args.suite == "serve":
        return _serve(args)
    if given := [o for o in SERVE_OPTIONS if getattr(args, o) is not None]:
        return fail("bench", f"--{given[0].replace('_', '-')} applies to the serve suite only")
    if args.suite != "core":
        return _other_suite(args)
    from . import core

    cases = args.cases.split(",") if args.cases else None
    unknown = set(cases or ()) - set(core.CASES)
    if unknown:
        return fail("bench", f"unknown cases {sorted(unknown)}; known: {', '.join(core.CASES)}")
    return _report(args, functools.partial(core.run, cases=cases), core.format_report)


def _other_suite(args: argparse.Namespace) -> int:
    """``tensor``, ``batch``, ``dask`` or ``gpu``: suites without --cases."""
    if args.cases:
        return fail(f"bench {args.suite}", "--cases applies to the core suite only (--variants: serve)")
    if args.peers:
        from . import peers

        run_peers = functools.partial(peers.run, simulate=args.simulate)
        return _report(args, run_peers, peers.format_report)
    try:
        suite = importlib.import_module(f".{args.suite}", __package__)
    except ImportError:  # only the dask suite needs an extra
        print(f"schedsvc bench {args.suite} needs Dask: pip install 'schedsvc[dask]'", file=sys.stderr)
        return 2
    run = functools.partial(suite.run, simulate=True) if args.simulate else suite.run
    return _report(args, run, suite.format_report)


def _serve(args: argparse.Namespace) -> int:
    """The ``serve`` suite: its options checked, then run; exit status 1 when a variant failed."""
    from . import serve

    options: dict[str, Any] = {}
    if args.max_pending is not None and not args.overload:
        return fail("bench serve", "--max-pending applies to the overload server: add --overload")
    if args.cases:
        variants = tuple(args.cases.split(","))
        if unknown := set(variants) - set(serve.DEFAULT_VARIANTS):
            known = ", ".join(serve.DEFAULT_VARIANTS)
            return fail("bench serve", f"unknown variants {sorted(unknown)}; known: {known}")
        options["variants"] = variants
    if args.model is not None:
        options["models"] = serve.MODELS if args.model == "both" else (args.model,)
    for name in ("duration", "connections", "max_pending"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            return fail("bench serve", f"--{name.replace('_', '-')} must be more than 0")
        if value is not None:
            options[name] = value
    options |= {k: getattr(args, k) for k in ("client", "overload") if getattr(args, k) is not None}
    try:
        if args.cpus is not None:
            options["server_cpus"], options["client_cpus"] = serve.parse_cpus(args.cpus)
        if args.processes is not None:
            options["processes"] = args.processes
        serve.server_shares(options.get("server_cpus"), options.get("processes", 1))
    except ValueError as exc:
        return fail("bench serve", str(exc))
    try:
        report = serve.run(reps=args.reps, progress=None if args.json == "-" else progress, **options)
    except serve.ServeError as exc:
        return fail("bench serve", str(exc), status=1)
    emit(report, args.json, serve.format_report)
    return 1 if report["failed"] else 0


def _report(
    args: argparse.Namespace, run: Callable[..., dict[str, Any]], fmt: Callable[[dict[str, Any]], str]
) -> int:
    """Run a suite (progress lines unless the JSON goes to stdout) and emit its report."""
    quiet = args.json == "-"
    emit(run(reps=args.reps, progress=None if quiet else progress), args.json, fmt)
    return 0
