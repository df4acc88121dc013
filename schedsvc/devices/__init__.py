"""Devices, one module per kind, found by name and imported only when an engine uses them.

``KINDS`` maps a kind of device to its module and class; ``resolve`` checks
a config and picks the kind that serves each of its devices (``device_class_for``),
whose ``open`` builds the device.  The engine, the runtime and the core
never test which kind a device is: what differs is in the kind's class, a
``Device`` (the interface, beside the runtime that drives it).  The frontend
also finds here the narrow CUDA API (``CudaApi``, ``binding_of``; importing it
imports no CuPy) and ``to_device``, the callable of a host-to-device copy task.  The CPU budget
(``plan_blas``, ``hold_blas``: BLAS threads per CPU worker) is here for the CPU kind and ``schedsvc info``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._errors import DeviceError
from .._runtime import Device, Keyer
from ._blas import BLAS_VARIABLES, BlasHold, BlasPlan, blas_libraries, engine_cores, hold_blas, plan_blas
from ._cudaapi import CudaApi, binding_of
from ._cudaapi import load as load_cuda_api
from ._transfer import to_device

if TYPE_CHECKING:
    from .._config import Config

__all__ = [
    "BACKENDS",
    "BLAS_VARIABLES",
    "KINDS",
    "BlasHold",
    "BlasPlan",
    "CudaApi",
    "Device",
    "Keyer",
    "binding_of",
    "blas_libraries",
    "check_device",
    "device_class",
    "device_class_for",
    "engine_cores",
    "hold_blas",
    "is_device_name",
    "load_cuda_api",
    "plan_blas",
    "resolve",
    "scheduler_options",
    "to_device",
    "unknown_device",
]

#: kind of device -> (module, class), imported on first use; a module without a dot is one of
#: this package's.  A device is named by its kind ("cpu", "cuda:0" of kind "cuda").
KINDS: dict[str, tuple[str, str]] = {
    "cpu": ("cpu", "CpuPool"),
    "dask": ("dask", "DaskDevice"),
    "cuda": ("cuda", "CudaDevice"),
}
#: kinds that run another kind's device when ``Config.backend`` names them, and name no device
BACKENDS = {"dask": "cpu"}


def unknown_device(name: object) -> DeviceError:
    return DeviceError(f"unknown device {name!r}: use 'cpu' or 'cuda:N' (e.g. 'cuda:0')")


def is_device_name(name: str) -> bool:
    """Does ``name`` name a device of a known kind: ``cpu``, or ``KIND:N`` for the others?"""
    kind, sep, index = name.partition(":")
    if kind not in KINDS or kind in BACKENDS:
        return False
    if kind == "cpu":
        return not sep
    return bool(sep) and index.isascii() and index.isdigit()


def device_class(kind: str) -> type[Device]:
    """The class of the devices of ``kind`` (its module is imported now)."""
    module, cls = KINDS[kind]
    where = module if "." in module else f"{__package__}.{module}"
    found: type[Device] = getattr(importlib.import_module(where), cls)
    return found


def check_device(name: str, config: Config | None = None) -> None:
    """Raise DeviceError unless ``name`` is a device this install can run (under ``config``: the CUDA
    simulator runs any ``cuda:N``)."""
    if not isinstance(name, str) or not is_device_name(name):
        raise unknown_device(name)
    device_class(name.partition(":")[0]).check_device(name, config)


def device_class_for(name: str, config: Config, check: bool = True) -> type[Device]:
    """The class that runs device ``name``'s tasks under ``config`` (imported now);
    ``check``: raise DeviceError unless this machine can run the device (``check_device``)."""
    if check:
        check_device(name, config)
    kind = name.partition(":")[0]
    if BACKENDS.get(config.backend) == kind:
        kind = config.backend  # the backend runs this device's tasks (Dask: the "cpu" device's)
    return device_class(kind)


def resolve(config: Config) -> dict[str, type[Device]]:
    """The class of each of ``config``'s devices, once ``config`` is checked: the backend's
    settings first, then each device (unknown, unavailable), naming the field."""
    if config.backend in BACKENDS:
        device_class(config.backend).check_config(config)
    kinds = {}
    for name in config.devices:
        kinds[name] = device_class_for(name, config)
        kinds[name].check_config(config)
    return kinds


def scheduler_options(kinds: dict[str, type[Device]], config: Config) -> dict[str, Any]:
    """The core's per-device settings its kinds ask for: which devices launch asynchronously,
    and the byte budget of each device with memory of its own (``max_device_bytes``)."""
    budget = config.max_device_bytes
    return {
        "asynchronous": tuple(name for name, kind in kinds.items() if kind.asynchronous),
        "device_bytes": {name: budget for name, kind in kinds.items() if kind.own_memory and budget},
        "host_copy": to_device,  # what its copies read is host memory, not the device's
    }
