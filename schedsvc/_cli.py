"""The ``schedsvc`` command: demo, bench, info."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedsvc", description="schedsvc: async array compute engine")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the sources' experiments on this machine and print a table")
    demo.add_argument("--reps", type=int, default=3, help="repetitions per experiment (median shown)")
    bench = sub.add_parser("bench", help="benchmarks against baselines measured in the same run")
    bench.add_argument("suite", choices=["core", "tensor"], help="which benchmark suite")
    bench.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median reported)")
    bench.add_argument("--cases", help="comma-separated subset of cases (ratios need all)")
    bench.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    sub.add_parser("info", help="version, devices and the settings in force")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import main as demo_main

        return demo_main(reps=args.reps)
    if args.command == "bench":
        return _bench(args)
    return _info()


def _bench(args: argparse.Namespace) -> int:
    from ._bench import core

    if args.reps < 1:
        print("schedsvc bench: --reps must be at least 1", file=sys.stderr)
        return 2
    if args.suite == "tensor":
        return _bench_tensor(args)
    cases = args.cases.split(",") if args.cases else None
    unknown = set(cases or ()) - set(core.CASES)
    if unknown:
        print(
            f"schedsvc bench: unknown cases {sorted(unknown)}; known: {', '.join(core.CASES)}",
            file=sys.stderr,
        )
        return 2
    quiet = args.json == "-"
    report = core.run(reps=args.reps, cases=cases, progress=None if quiet else _progress)
    _emit(report, args.json, core.format_report)
    return 0


def _bench_tensor(args: argparse.Namespace) -> int:
    from ._bench import tensor

    if args.cases:
        print("schedsvc bench tensor: --cases applies to the core suite only", file=sys.stderr)
        return 2
    quiet = args.json == "-"
    report = tensor.run(reps=args.reps, progress=None if quiet else _progress)
    _emit(report, args.json, tensor.format_report)
    return 0


def _emit(report: dict[str, Any], path: str | None, fmt: Callable[[dict[str, Any]], str]) -> None:
    if path == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(fmt(report))
    if path:
        with open(path, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {path}")


def _progress(line: str) -> None:
    print(f"  ... {line}", file=sys.stderr, flush=True)


def _info() -> int:
    import os

    import schedsvc
    from schedsvc._errors import DeviceError
    from schedsvc.devices import check_device

    print(f"schedsvc {schedsvc.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPU cores")
    try:
        check_device("cuda:0")
        print("cuda:0: available")
    except DeviceError as exc:
        print(f"cuda: {exc}")
    print("settings in force (defaults < SCHEDSVC_* environment):")
    for field, value in schedsvc.Config().model_dump().items():
        print(f"  {field} = {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
