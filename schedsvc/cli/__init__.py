"""The ``schedsvc`` command: demo, bench, tune, info.

Each subcommand lives in its own module, which adds its parser with
``register(subparsers)`` and sets ``run`` (``args -> exit status``); heavy
imports happen inside ``run``, so ``schedsvc --help`` stays fast.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["emit", "main", "output_problem", "progress"]


def main(argv: list[str] | None = None) -> int:
    from .._errors import ConfigError
    from . import demo, info, tune

    parser = argparse.ArgumentParser(prog="schedsvc", description="schedsvc: async array compute engine")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register(sub)
    _register_bench(sub)
    tune.register(sub)
    info.register(sub)
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except ConfigError as exc:  # e.g. a bad SCHEDSVC_* variable, met when the subcommand builds an engine
        print(f"schedsvc {args.command}: {exc}", file=sys.stderr)
        return 2
    return status


def _register_bench(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks against baselines measured in the same run")
    bench.add_argument("suite", choices=["core", "tensor", "dask"], help="which benchmark suite")
    bench.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median reported)")
    bench.add_argument("--cases", help="comma-separated subset of cases (ratios need all)")
    bench.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from .bench import core

    if args.reps < 1:
        print("schedsvc bench: --reps must be at least 1", file=sys.stderr)
        return 2
    if problem := output_problem("--json", args.json):
        print(f"schedsvc bench: {problem}", file=sys.stderr)
        return 2
    if args.suite != "core":
        return _bench_suite(args)
    cases = args.cases.split(",") if args.cases else None
    unknown = set(cases or ()) - set(core.CASES)
    if unknown:
        print(
            f"schedsvc bench: unknown cases {sorted(unknown)}; known: {', '.join(core.CASES)}",
            file=sys.stderr,
        )
        return 2
    return _report(args, functools.partial(core.run, cases=cases), core.format_report)


def _bench_suite(args: argparse.Namespace) -> int:
    """``tensor`` or ``dask``: suites without --cases."""
    if args.cases:
        print(f"schedsvc bench {args.suite}: --cases applies to the core suite only", file=sys.stderr)
        return 2
    try:
        suite = importlib.import_module(f".bench.{args.suite}", __package__)
    except ImportError:  # only the dask suite needs an extra
        print(f"schedsvc bench {args.suite} needs Dask: pip install 'schedsvc[dask]'", file=sys.stderr)
        return 2
    return _report(args, suite.run, suite.format_report)


def _report(
    args: argparse.Namespace, run: Callable[..., dict[str, Any]], fmt: Callable[[dict[str, Any]], str]
) -> int:
    """Run a suite (progress lines unless the JSON goes to stdout) and emit its report."""
    quiet = args.json == "-"
    emit(run(reps=args.reps, progress=None if quiet else progress), args.json, fmt)
    return 0


def emit(report: dict[str, Any], path: str | None, fmt: Callable[[dict[str, Any]], str]) -> None:
    """Print ``fmt(report)``, and write the report as JSON to ``path`` ('-': JSON to stdout instead)."""
    if path == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(fmt(report))
    if path:
        with open(path, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {path}")


def output_problem(flag: str, path: str | None) -> str | None:
    """Why ``path`` cannot take an output file, checked before a run rather than after it; None if it can."""
    if not path or path == "-":
        return None
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path}: that is a directory; name a file in it"
    if not target.resolve().parent.is_dir():
        return f"{flag} {path}: the directory {str(target.parent)!r} does not exist"
    return None


def progress(line: str) -> None:
    """A progress line on stderr (stdout stays the report)."""
    print(f"  ... {line}", file=sys.stderr, flush=True)
