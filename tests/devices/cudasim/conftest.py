"""Every cudasim test starts from a reset simulator, on device 0, with no current stream pushed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from schedsvc.devices.cudasim import SimApi, Simulator, api, simulator


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    sim = simulator()
    sim.reset()
    api().use_device(0)
    yield
    sim.reset()
    api().use_device(0)


@pytest.fixture
def sim() -> Simulator:
    return simulator()


@pytest.fixture
def cuda() -> SimApi:
    return api()


class Gate:
    """Holds a stream at a host callback until ``open()`` (every wait bounded)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def hold(self, stream: Any) -> None:
        stream.launch_host_func(self._wait, None)

    def _wait(self, _: object) -> None:
        self.reached.set()
        assert self.opened.wait(10)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def gate() -> Iterator[Callable[[], Gate]]:
    made: list[Gate] = []

    def make() -> Gate:
        made.append(Gate())
        return made[-1]

    yield make
    for g in made:
        g.open()
