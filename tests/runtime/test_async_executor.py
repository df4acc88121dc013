"""An asynchronous executor through the runtime: launched, then complete, end to end.

A fake kind, ``fake:0``, plays a device that queues work: its launcher thread
takes ready tasks (``rt.next_task``), computes each value at once (as a kernel
launch allocates its output), and reports ``rt.launched``; a second thread
reports ``rt.complete`` in launch order when the test opens a gate -- the
moment a stream's event would fire.  This proves the runtime and the core
give an asynchronous device what CUDA streams need (issue 17 builds on it),
with no change to the engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pytest

import schedsvc as ss
from schedsvc import devices
from schedsvc._runtime import Runtime, substitute, substitute_args
from schedsvc.devices import Device, Keyer
from tests.helpers import TIMEOUT, state, wait_thread_event


class DeviceArray:
    """A stand-in for a device array (a CuPy array): memory the scanner does not know by itself."""

    def __init__(self, nbytes: int, base: DeviceArray | None = None) -> None:
        self.nbytes = nbytes
        self.base = base

    def view(self) -> DeviceArray:
        return DeviceArray(self.nbytes, self.base or self)


def device_key(array: DeviceArray) -> tuple[int, int]:
    """A view keys to its base, as the CUDA executor keys a CuPy view."""
    owner = array.base or array
    return id(owner), owner.nbytes


def fill(value: float, out: DeviceArray) -> DeviceArray:
    return out


class FakeStream(Device):
    """One launcher thread and one completer; completions only once ``gate`` is set."""

    kind = "fake"
    asynchronous = True
    own_memory = True
    buffer_types: ClassVar[Mapping[type, Keyer]] = MappingProxyType({DeviceArray: device_key})

    def __init__(self, rt: Runtime, name: str) -> None:
        super().__init__(rt, name)
        self.hungry = False
        self.gate = threading.Event()
        self.wake = threading.Semaphore(0)
        self.launched: deque[Any] = deque()  # launched, not reported complete yet
        self.order: list[str] = []  # what happened, in order
        self.more = threading.Condition()
        self.stopping = False
        self.threads = [
            threading.Thread(target=self._launch_loop, daemon=True),
            threading.Thread(target=self._complete_loop, daemon=True),
        ]

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Any) -> FakeStream:
        return cls(rt, name)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def leaving(self, worker: Any, ready: int) -> bool:
        return self.stopping and not ready

    def dispatch(self, ready: int) -> Any:
        self.idle.clear()
        self.hungry = False
        return self.wake.release

    def _launch_loop(self) -> None:
        while True:
            task = self.rt.next_task(self, self)
            if task is None:
                self.wake.acquire()
                continue
            if not isinstance(task, ss.Future):  # False: the engine is closing
                return
            args = substitute_args(task.args)
            kwargs = substitute(task.kwargs or {})
            try:
                value = task.fn(*args, **kwargs)
            except Exception as exc:  # a launch that fails: the task fails from running
                self.order.append(f"fail {task.name}")
                self.rt.finish(task, None, exc)
                continue
            self.order.append(f"launch {task.name}")
            self.rt.launched(task, value)
            with self.more:
                self.launched.append((task, value))
                self.more.notify()

    def _complete_loop(self) -> None:
        while True:
            with self.more:
                while not self.launched and not self.stopping:
                    self.more.wait()
                if not self.launched:
                    return
            self.gate.wait()
            with self.more:
                task, value = self.launched.popleft()
            self.order.append(f"complete {task.name}")
            self.rt.complete(task, value)

    def stop(self) -> None:
        self.stopping = True
        self.gate.set()
        self.wake.release()
        with self.more:
            self.more.notify_all()

    def join(self, timeout: float | None) -> list[threading.Thread]:
        for thread in self.threads:
            thread.join(timeout)
        return [t for t in self.threads if t.is_alive()]


@pytest.fixture
def fake_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the kind by its module's full name: an executor may live outside schedsvc."""
    monkeypatch.setitem(devices.KINDS, "fake", (__name__, "FakeStream"))


def stream(eng: ss.Engine) -> FakeStream:
    assert eng._rt is not None
    executor = eng._rt.devices["fake:0"]
    assert isinstance(executor, FakeStream)
    return executor


async def test_a_chain_launches_behind_its_parents_before_any_completes(fake_kind: None) -> None:
    async with ss.Engine(devices=("cpu", "fake:0"), cpu_workers=1) as eng:
        fake = stream(eng)
        a = eng.submit_nowait(np.add, np.ones(3), 1, device="fake:0", name="a")
        b = eng.submit_nowait(np.multiply, a, 2, device="fake:0", name="b")
        c = eng.submit_nowait(np.subtract, b, 1, device="fake:0", name="c")
        host = eng.submit_nowait(np.sum, c, name="host")  # a CPU task: waits for c to complete
        await state(eng, lambda: c.state == "launched")  # all three launched, nothing complete
        assert fake.order == ["launch a", "launch b", "launch c"]
        assert [f.state for f in (a, b, c)] == ["launched"] * 3
        assert host.state == "waiting" and eng.stats().pending == 4
        fake.gate.set()
        assert await asyncio.wait_for(host, TIMEOUT) == 9.0
        assert fake.order == ["launch a", "launch b", "launch c", "complete a", "complete b", "complete c"]
        np.testing.assert_array_equal(await c, [3.0, 3.0, 3.0])


async def test_a_launch_that_fails_fails_what_takes_its_value(fake_kind: None) -> None:
    def boom(x: Any) -> Any:
        raise ValueError("bad kernel")

    async with ss.Engine(devices=("cpu", "fake:0"), cpu_workers=1) as eng:
        fake = stream(eng)
        fake.gate.set()
        a = eng.submit_nowait(boom, np.ones(2), device="fake:0", name="a")
        b = eng.submit_nowait(np.add, a, 1, device="fake:0", name="b")
        with pytest.raises(ValueError, match="bad kernel"):
            await asyncio.wait_for(a, TIMEOUT)
        with pytest.raises(ss.DependencyError, match="bad kernel"):
            await asyncio.wait_for(b, TIMEOUT)
        assert await eng.run(np.add, 1, 1) == 2  # the engine keeps serving


async def test_max_device_bytes_bounds_what_the_device_holds(fake_kind: None) -> None:
    big = np.ones(1000)  # 8,000 bytes
    async with ss.Engine(devices=("cpu", "fake:0"), cpu_workers=1, max_device_bytes=20_000) as eng:
        fake = stream(eng)
        first = eng.submit_nowait(np.add, big, 1, device="fake:0", nbytes=8000)  # 16,000 bytes on fake:0
        with pytest.raises(ss.QueueFull):  # 16,000 more would exceed 20,000 on fake:0
            eng.submit_nowait(np.add, np.ones(1000), 1, device="fake:0", nbytes=8000)
        on_cpu = eng.submit_nowait(np.add, np.ones(1000), 1, nbytes=8000)  # the CPU has no such budget
        with pytest.raises(ss.MemoryLimitError, match="max_device_bytes"):
            eng.submit_nowait(np.add, np.ones(3000), 1, device="fake:0")  # 24,000 bytes: never fits
        fake.gate.set()
        await asyncio.wait_for(first, TIMEOUT)
        await asyncio.wait_for(on_cpu, TIMEOUT)
        again = eng.submit_nowait(np.add, np.ones(1000), 1, device="fake:0", nbytes=8000)  # room again
        await asyncio.wait_for(again, TIMEOUT)


async def test_a_thread_blocked_on_a_launched_task_is_woken_at_complete(fake_kind: None) -> None:
    async with ss.Engine(devices=("cpu", "fake:0"), cpu_workers=1) as eng:
        fake = stream(eng)
        a = eng.submit_nowait(np.add, np.ones(2), 1, device="fake:0")
        done = threading.Event()
        got: list[Any] = []

        def reader() -> None:
            got.append(a.result(TIMEOUT))  # never runs a fake:0 task itself: waits for complete
            done.set()

        threading.Thread(target=reader, daemon=True).start()
        await asyncio.sleep(0)
        assert not done.is_set()
        fake.gate.set()
        await wait_thread_event(done)
        np.testing.assert_array_equal(got[0], [2.0, 2.0])


async def test_the_executors_buffer_types_order_tasks_through_views(fake_kind: None) -> None:
    """A device array is memory because its executor says so (``buffer_types``): a host task reading a
    view of it waits for the device task that writes it to complete."""
    async with ss.Engine(devices=("cpu", "fake:0"), cpu_workers=1) as eng:
        fake = stream(eng)
        array = DeviceArray(64)
        try:
            write = eng.submit_nowait(fill, 1.0, out=array, device="fake:0")
            read = eng.submit_nowait(lambda a: a.nbytes, array.view())  # on the CPU
            await state(eng, lambda: write.state == "launched")
            assert read.state == "waiting"  # ordered after the write, through the view's base
        finally:
            fake.gate.set()  # (a failed assertion must not leave the close waiting for the device)
        assert await asyncio.wait_for(read, TIMEOUT) == 64
