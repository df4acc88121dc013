"""The ``schedsvc`` command: demo, bench, tune, info.

Each subcommand lives in its own module (``demo``, ``bench``, ``tune``,
``info``), which adds its parser with ``register(subparsers)`` and sets
``run`` (``args -> exit status``); what more than one of them needs is in
``_common``, and they never import each other.  The helpers the tests share
with the commands (the MLP the experiments run, the bench's worker count)
are exported here.  ``main`` imports them only
when it is called, and they import anything heavy inside ``run``, so
``schedsvc --help`` stays fast.
"""

from __future__ import annotations

import argparse

from ._common import NeedsExtra, bench_workers, fail, make_mlp, mlp_weights

__all__ = ["bench_workers", "main", "make_mlp", "mlp_weights"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), run the subcommand, return its exit status."""
    from .. import __version__
    from .._errors import ConfigError
    from . import bench, demo, info, tune

    parser = argparse.ArgumentParser(prog="schedsvc", description="schedsvc: async array compute engine")
    parser.add_argument("--version", action="version", version=f"schedsvc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,bench,tune,info}")
    for command in (demo, bench, tune, info):  # the order --help lists them in
        command.register(sub)
    args = parser.parse_args(argv)
    if args.command is None:  # a bare ``schedsvc``: what it can do, not an error
        parser.print_help()
        return 0
    try:
        status: int = args.run(args)
    except (ConfigError, NeedsExtra) as exc:  # e.g. a bad SCHEDSVC_* variable, met building an engine
        return fail(args.command, str(exc))
    return status
