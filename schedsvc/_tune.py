"""``schedsvc tune``: sweep queue depth on a workload (being built)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    tune = sub.add_parser("tune", help="sweep max_pending on a workload and recommend settings")
    tune.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print("schedsvc tune: not built yet", file=sys.stderr)
    return 2
