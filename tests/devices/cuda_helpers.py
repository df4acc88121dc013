"""Shared by the CUDA executor tests: which CUDA binding they run on, the simulator's checks, engines.

``SCHEDSVC_TEST_CUDA=cupy`` runs them on CuPy and a real GPU (``cuda_simulator=False``); unset, always
on the CUDA simulator.  The variable is read at import time: ``tests/conftest.py`` deletes every
``SCHEDSVC_*`` variable for the duration of each test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from tests.helpers import started

#: "cupy": a real GPU through CuPy; anything else: the CUDA simulator.
ON_CUPY = os.environ.get("SCHEDSVC_TEST_CUDA", "") == "cupy"


def _cupy_missing() -> str | None:
    """Why the cupy runs cannot happen here (None: they can)."""
    try:
        import cupy
    except ImportError:
        return "SCHEDSVC_TEST_CUDA=cupy, but CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "SCHEDSVC_TEST_CUDA=cupy, but there is no CUDA device"
    except Exception as exc:  # no driver
        return f"SCHEDSVC_TEST_CUDA=cupy, but CUDA is unavailable: {exc}"
    return None


CUPY_MISSING = _cupy_missing() if ON_CUPY else None


def _gpu_count() -> int:
    """How many CUDA devices the tests may use: the simulator's two, or the real ones (at most two)."""
    if not ON_CUPY or CUPY_MISSING:
        return 2
    import cupy

    return min(2, int(cupy.cuda.runtime.getDeviceCount()))


GPU_COUNT = _gpu_count()

#: For tests that move work between cuda:0 and cuda:1 (the simulator always has both).
two_devices = pytest.mark.skipif(
    GPU_COUNT < 2, reason=f"needs two CUDA devices; this machine has {GPU_COUNT}"
)

#: For tests that need the simulator's knobs (delays, host-sync counters, injected failures, races).
simulator_only = pytest.mark.skipif(
    ON_CUPY, reason="needs the CUDA simulator's knobs (SCHEDSVC_TEST_CUDA=cupy runs on a real GPU)"
)


def sim() -> Any:
    """The CUDA simulator (only where the tests run on it)."""
    from schedsvc.devices.cudasim import simulator

    return simulator()


def cuda_api() -> Any:
    """The CUDA binding the tests run on."""
    from schedsvc.devices import load_cuda_api

    return load_cuda_api(not ON_CUPY)


def xp() -> Any:
    """The array module of the binding (``cupy`` or the simulator's)."""
    return cuda_api().xp


def current_device() -> int:
    """This thread's current CUDA device."""
    if ON_CUPY:
        import cupy

        return int(cupy.cuda.runtime.getDevice())
    return int(sim().local.device)


def host(x: Any) -> np.ndarray[Any, Any]:
    """A device array's values, on the host (a host sync: never on a launching thread)."""
    if type(x) is np.ndarray:
        return x
    return np.asarray(x.get())


def devices_for(n_gpus: int) -> tuple[str, ...]:
    return ("cpu", *(f"cuda:{i}" for i in range(n_gpus)))


def engine_options(**overrides: Any) -> dict[str, Any]:
    """Options of an engine with cpu, cuda:0 and cuda:1 (cuda:0 alone on a one-GPU machine), on the binding
    the tests run on."""
    options: dict[str, Any] = {
        "devices": devices_for(GPU_COUNT),
        "cuda_simulator": not ON_CUPY,
        "cpu_workers": 2,
    }
    options.update(overrides)
    return options


@asynccontextmanager
async def cuda_engine(**overrides: Any) -> AsyncIterator[ss.Engine]:
    """A started engine on cpu and the CUDA devices of ``engine_options`` with a bounded close (a wedged engine fails the test)."""
    if CUPY_MISSING:
        pytest.skip(CUPY_MISSING)
    async with started(**engine_options(**overrides)) as eng:
        yield eng


def checked_simulator(request: pytest.FixtureRequest) -> Iterator[None]:
    """Reset the simulator before a test; after it, no race and no fault unless the test expects
    them (the test takes the fixture ``expect_faults``)."""
    if ON_CUPY:
        yield
        return
    simulator = sim()
    simulator.reset()
    yield
    try:
        if "expect_faults" not in request.fixturenames:
            assert simulator.races == [], f"races: {simulator.races}"
            assert simulator.faults == [], f"faults: {simulator.faults}"
    finally:
        simulator.reset()
