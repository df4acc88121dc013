"""``schedsvc info``: version, devices found and the settings in force."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    info = sub.add_parser("info", help="version, devices and the settings in force")
    info.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
