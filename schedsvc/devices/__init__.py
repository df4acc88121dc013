"""Executors, one module per kind, found by name and imported only when an engine uses them.

``KINDS`` maps an executor kind to its module and class; ``executor_for``
picks the kind that serves a device under a config, and ``open_executor``
builds it.  The engine, the runtime and the core never test which kind a
device is: what differs is in the executor (``_executor.Executor``).
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any

from .._errors import DeviceError
from ._executor import Executor, Keyer

if TYPE_CHECKING:
    from .._config import Config
    from .._runtime import Runtime

__all__ = [
    "KINDS",
    "Executor",
    "Keyer",
    "check_config",
    "check_device",
    "executor_for",
    "open_executor",
    "scheduler_options",
]

#: executor kind -> (module in this package, class): imported on first use
KINDS: dict[str, tuple[str, str]] = {
    "cpu": ("cpu", "CpuPool"),
    "dask": ("dask", "DaskExecutor"),
    "cuda": ("cuda", "CudaExecutor"),
}

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


def executor_for(name: str, config: Config) -> type[Executor]:
    """The executor class that runs device ``name``'s tasks under ``config`` (imported now)."""
    check_device(name)
    kind = name.partition(":")[0]  # "cpu", "cuda"
    if kind == "cpu" and config.backend == "dask":
        kind = "dask"  # the cluster runs the "cpu" device's tasks
    module, cls = KINDS[kind]
    found: type[Executor] = getattr(importlib.import_module(f".{module}", __package__), cls)
    return found


def check_config(config: Config) -> None:
    """Raise if ``config`` asks for what its executors cannot do, naming the field: the backend's
    settings first, then each device (unknown, unavailable)."""
    if config.backend != "threads":
        executor_for("cpu", config).check_config(config)
    for name in config.devices:
        executor_for(name, config).check_config(config)


def scheduler_options(config: Config) -> dict[str, Any]:
    """The core's per-device settings its executors ask for: which devices launch asynchronously,
    and the byte budget of each device with memory of its own (``max_device_bytes``)."""
    kinds = {name: executor_for(name, config) for name in config.devices}
    budget = config.max_device_bytes
    return {
        "asynchronous": tuple(name for name, kind in kinds.items() if kind.asynchronous),
        "device_bytes": {name: budget for name, kind in kinds.items() if kind.own_memory and budget},
    }


async def open_executor(name: str, rt: Runtime, config: Config) -> Executor:
    """Build the executor of device ``name``."""
    return await executor_for(name, config).open(rt, name, config)
