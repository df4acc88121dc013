"""The executor interface: kinds found by name and imported lazily, the choice of kind, and a new kind
added without touching the engine."""

from __future__ import annotations

import asyncio
import importlib
import json
import operator
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc import devices
from schedsvc._runtime import Runtime, Task
from schedsvc.devices import KINDS, Device, device_class_for
from schedsvc.devices.cpu import CpuPool

from ..helpers import TIMEOUT, within

_RESOLVE = """
import importlib, json, sys
import schedsvc
from schedsvc import devices
heavy = ("dask", "distributed", "cupy")
def loaded():
    return sorted({m.split(".")[0] for m in sys.modules} & set(heavy))
at_import = loaded()
kinds = {}
for kind, (module, cls) in devices.KINDS.items():
    found = getattr(importlib.import_module(f"schedsvc.devices.{module}"), cls)
    kinds[kind] = [found.__module__, found.__name__, issubclass(found, devices.Device), found.kind]
print(json.dumps({"at_import": at_import, "after_resolving": loaded(), "kinds": kinds}))
"""


def test_every_kind_resolves_lazily_to_an_executor_subclass() -> None:
    """Importing schedsvc, and resolving every kind's class, imports neither Dask nor CuPy: an executor
    imports its library when an engine opens it."""
    out = subprocess.run(
        [sys.executable, "-c", _RESOLVE], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(out.stdout)
    assert report["at_import"] == []
    assert report["after_resolving"] == []
    assert set(report["kinds"]) == set(KINDS) >= {"cpu", "dask", "cuda"}
    for kind, (module, cls, is_executor, name) in report["kinds"].items():
        assert is_executor, f"{kind}: {module}.{cls} is not a Device"
        assert module == f"schedsvc.devices.{KINDS[kind][0]}" and cls == KINDS[kind][1]
        assert name == kind, f"{module}.{cls}.kind is {name!r}, registered as {kind!r}"


def test_the_cpu_device_runs_on_dask_under_the_dask_backend_and_on_threads_otherwise() -> None:
    dask_kind = getattr(importlib.import_module(f"schedsvc.devices.{KINDS['dask'][0]}"), KINDS["dask"][1])
    assert device_class_for("cpu", ss.Config(backend="dask")) is dask_kind
    assert device_class_for("cpu", ss.Config(backend="threads")) is CpuPool
    assert device_class_for("cpu", ss.Config()) is CpuPool


def test_an_unknown_device_names_the_ones_there_are() -> None:
    with pytest.raises(ss.DeviceError, match="use 'cpu' or 'cuda:N'"):
        device_class_for("tpu:0", ss.Config())


@pytest.mark.parametrize("workers", [1, 3])
async def test_the_cpu_pools_window_is_twice_its_workers(workers: int) -> None:
    async with ss.Engine(cpu_workers=workers) as eng:
        rt = eng._rt
        assert rt is not None
        pool = rt.devices["cpu"]
        assert isinstance(pool, CpuPool)
        assert pool.concurrency == workers
        assert pool.window == 2 * workers


# -- a new kind, added without touching the engine --------------------------------------------------


class OneThread(Device):
    """A minimal executor: one thread that takes tasks through the runtime and runs them there."""

    kind = "cpu"
    runs_anywhere = True

    def __init__(self, rt: Runtime, name: str) -> None:
        super().__init__(rt, name)
        self.hungry = False  # nobody is parked until the thread has started
        self.park = threading.Lock()
        self.park.acquire()
        self.stopping = False
        self.ran: list[str] = []  # names of the tasks it ran
        self.thread = threading.Thread(target=self._main, name="schedsvc-one-thread", daemon=True)

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: ss.Config) -> OneThread:
        return cls(rt, name)

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        rt = self.rt
        rt.worker_started()
        while True:
            found = rt.next_task(self, self)
            if isinstance(found, Task):
                task: Task | None = found
                del found
                while task is not None:  # run it, then what its finish hands on
                    self.ran.append(task.name)
                    task = rt.execute(task)
            elif found is None:
                self.park.acquire()  # parked: dispatch() wakes it
            else:
                return

    def leaving(self, worker: Any, ready: int) -> bool:
        return self.stopping and not ready

    def dispatch(self, ready: int) -> Callable[[], None] | None:
        self.idle.clear()
        self.hungry = False
        return self.park.release

    def stop(self) -> None:
        if self.rt.under_lock(self._stopping):
            self.park.release()  # it looks again, and leaves once nothing is ready

    def _stopping(self) -> bool:
        """With the lock held: no more work comes; was the thread parked?"""
        self.stopping = True
        self.hungry = False
        parked = bool(self.idle)
        self.idle.clear()
        return parked

    def join(self, timeout: float | None) -> list[threading.Thread]:
        self.thread.join(timeout)
        return [self.thread] if self.thread.is_alive() else []


@pytest.fixture
def one_thread_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register ``OneThread`` as the "cpu" kind: a module of schedsvc.devices named in KINDS."""
    module = types.ModuleType("schedsvc.devices._one_thread")
    module.OneThread = OneThread  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(devices.KINDS, "cpu", ("_one_thread", "OneThread"))


@pytest.mark.usefixtures("one_thread_kind")
async def test_a_new_executor_kind_runs_an_engines_tasks_end_to_end() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=4) as eng:
        rt = eng._rt
        assert rt is not None
        executor = rt.devices["cpu"]
        assert type(executor) is OneThread

        def where(x: int) -> tuple[int, str]:
            return x, threading.current_thread().name

        assert await within(eng.run(where, 1)) == (1, "schedsvc-one-thread")
        # a chain, a buffer written in place, futures awaited, more tasks than max_pending (backpressure)
        total = eng.submit_nowait(operator.add, 0, 1, name="first")
        for i in range(20):
            total = await within(eng.submit(operator.add, total, i, name=f"add-{i}"))
        assert await within(total) == 1 + sum(range(20))
        data = np.zeros(3)
        writes = [await within(eng.submit(np.add, data, 1, out=data)) for _ in range(5)]
        await within(eng.waitall())
        assert all(w.done() for w in writes)
        assert data.tolist() == [5.0, 5.0, 5.0]
        # a plain thread waiting on a result, and a failure reaching its dependents
        late = eng.submit_nowait(operator.mul, 6, 7)
        assert await within(asyncio.to_thread(late.result, TIMEOUT)) == 42
        bad = eng.submit_nowait(operator.truediv, 1, 0)
        child = eng.submit_nowait(operator.neg, bad)
        with pytest.raises(ss.DependencyError):
            await within(child)
        assert "first" in executor.ran and "add-19" in executor.ran
    assert not executor.thread.is_alive()
