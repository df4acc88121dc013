"""``Runtime.execute`` on a worker: a task with a ``fusion`` runs with the other ready tasks of it, as one run,
and each is finished with its own outcome (``Fusion``).  Driven by a held worker, never by timing."""

from __future__ import annotations

from threading import get_ident
from typing import Any

import anyio
import pytest

import schedsvc as ss
from schedsvc._core import Task
from schedsvc._port import port_of
from schedsvc._runtime import NOW

from ..helpers import occupied, within


class Tagged(ss.Future[Any]):
    """A task that may run with the other ready tasks of its ``fusion``."""

    __slots__ = ("fusion",)


class Tens:
    """A ``Fusion``: each task's value is its argument times ten; an argument of -1 raises, alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.runs: list[list[int]] = []

    def weight(self, task: Task) -> int:
        return 1

    def run(
        self, tasks: list[Task], args: list[Any]
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        self.runs.append([a[0] for a in args])
        return [self.one(a[0]) for a in args], {"name": "tens", "calls": len(tasks)}

    @staticmethod
    def one(x: int) -> tuple[Any, BaseException | None]:
        return (None, ValueError(f"no tens of {x}")) if x < 0 else (x * 10, None)

    def __call__(self, x: int) -> int:  # a task run alone (a thread that waits for it, sync mode)
        value, error = self.one(x)
        if error is not None:
            raise error
        return value  # type: ignore[no-any-return]


def tagged(eng: ss.Engine, fusion: Tens, x: Any) -> Tagged:
    port = port_of(eng)
    task = Tagged(port, fusion, (x,), None, "cpu")
    task.name, task.fusion = "tens", fusion
    rt = eng._rt
    assert rt is not None and rt.door.admit(task, get_ident(), NOW)
    return task


async def submitted_while_held(eng: ss.Engine, make: Any) -> Any:
    async with occupied(eng, 1):
        made = make()
        rt = eng._rt
        assert rt is not None
        rt.flush()  # every task made is in the ready queue when the worker is let go
    return made


async def test_the_ready_tasks_of_a_fusion_run_as_one_up_to_its_limit() -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        tens = Tens(limit=3)
        tasks = await submitted_while_held(eng, lambda: [tagged(eng, tens, i) for i in range(5)])
        assert [await within(t) for t in tasks] == [0, 10, 20, 30, 40]
        assert tens.runs == [[0, 1, 2], [3, 4]]


async def test_tasks_of_other_fusions_and_plain_tasks_keep_their_own_runs() -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        a, b = Tens(limit=8), Tens(limit=8)

        def make() -> list[Any]:
            return [tagged(eng, a, 1), tagged(eng, b, 2), eng.submit_nowait(abs, -7), tagged(eng, a, 3)]

        tasks = await submitted_while_held(eng, make)
        assert [await within(t) for t in tasks] == [10, 20, 7, 30]
        assert (a.runs, b.runs) == ([[1, 3]], [[2]])


async def test_each_task_of_a_run_gets_its_own_outcome_and_its_dependents_follow_it() -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        tens = Tens(limit=8)

        def make() -> list[Any]:
            good, bad = tagged(eng, tens, 4), tagged(eng, tens, -1)
            return [good, bad, eng.submit_nowait(abs, good), eng.submit_nowait(abs, bad)]

        good, bad, after_good, after_bad = await submitted_while_held(eng, make)
        assert await within(good) == 40
        with pytest.raises(ValueError, match="no tens of -1"):
            await within(bad)
        assert await within(after_good) == 40
        with pytest.raises(ss.DependencyError) as info:
            await within(after_bad)
        assert info.value.__cause__ is bad.exception()
        assert tens.runs == [[4, -1]]


async def test_a_thread_waiting_for_a_queued_task_of_a_fusion_runs_it_alone() -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:
        tens = Tens(limit=8)
        async with occupied(eng, 1):
            task = tagged(eng, tens, 5)
            assert await within(anyio.to_thread.run_sync(task.result)) == 50  # (no timeout: it runs there)
        assert tens.runs == []  # run by the waiting thread, as the task's function
