"""``schedsvc bench``: benchmark suites, each against baselines measured in the same run.

One module per suite (``core``, ``tensor``, ``batch``, ``dask``, ``gpu``), each with
``run(reps=..., progress=...) -> report`` and ``format_report(report)``; this
command imports the suite it runs (the ``dask`` suite needs the extra; the ``gpu``
suite needs a GPU, and without one says so and measures nothing).
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

SUITES = ("core", "tensor", "batch", "dask", "gpu")


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks against baselines measured in the same run")
    bench.add_argument("suite", choices=list(SUITES), help="which benchmark suite")
    bench.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median reported)")
    bench.add_argument("--cases", help="comma-separated subset of cases (ratios need all)")
    bench.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    # tests only: the gpu suite's code on the CUDA simulator at tiny sizes, its figures labelled as not real
    bench.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    bench.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand."""
    if args.reps < 1:
        return fail("bench", "--reps must be at least 1")
    if problem := output_problem("--json", args.json):
        return fail("bench", problem)
    if args.simulate and args.suite != "gpu":
        return fail("bench", "--simulate applies to the gpu suite only")
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
        return fail(f"bench {args.suite}", "--cases applies to the core suite only")
    try:
        suite = importlib.import_module(f".{args.suite}", __package__)
    except ImportError:  # only the dask suite needs an extra
        print(f"schedsvc bench {args.suite} needs Dask: pip install 'schedsvc[dask]'", file=sys.stderr)
        return 2
    run = functools.partial(suite.run, simulate=True) if args.simulate else suite.run
    return _report(args, run, suite.format_report)


def _report(
    args: argparse.Namespace, run: Callable[..., dict[str, Any]], fmt: Callable[[dict[str, Any]], str]
) -> int:
    """Run a suite (progress lines unless the JSON goes to stdout) and emit its report."""
    quiet = args.json == "-"
    emit(run(reps=args.reps, progress=None if quiet else progress), args.json, fmt)
    return 0
