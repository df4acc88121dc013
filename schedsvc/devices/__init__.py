"""Executor kinds, one module each, imported only when a device of that kind is used."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .._errors import DeviceError

if TYPE_CHECKING:
    from .._config import Config
    from .._runtime import Device, Runtime

__all__ = ["check_device", "make_device"]

_CUDA = re.compile(r"^cuda:(\d+)$")


def check_device(name: str) -> None:
    """Raise DeviceError unless ``name`` is a device this install can run."""
    if name == "cpu":
        return
    match = _CUDA.match(name) if isinstance(name, str) else None
    if match is None:
        raise DeviceError(f"unknown device {name!r}: use 'cpu' or 'cuda:N' (e.g. 'cuda:0')")
    from . import cuda

    cuda.check(int(match.group(1)))


def make_device(name: str, rt: Runtime, config: Config) -> Device:
    """The executor for device ``name``."""
    check_device(name)
    if name == "cpu":
        from .cpu import CpuPool

        return CpuPool(rt, config.cpu_workers)
    from . import cuda

    return cuda.make(name, rt, config)
