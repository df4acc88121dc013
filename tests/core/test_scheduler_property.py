"""The core under random event sequences: ``validate()`` after every step, and sequential consistency.

Random tasks (data dependencies, reads and writes of a few buffers, priorities, declared bytes, on the
CPU or on an asynchronous device "gpu") are submitted -- staged or not, through the admission queue when
the limits are reached -- while tasks are taken, finished, failed, cancelled, launched and completed
(in any order, successfully or not) in a random interleaving.  Whenever a task is ready or starts, every
earlier task it conflicts with (a write and any access of the same buffer) must be final -- or launched,
when both are on the gpu -- and every input it takes must be done (or launched, both on the gpu); in the
end every task is final, resolved exactly once, and nothing is held.  Some submissions come with riders
(``Scheduler.ride``: the outputs picked from a call's result), which hold no slot of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsvc import DependencyError
from schedsvc._core import FINAL_STATES, Scheduler, Task

GPU = "gpu"  # an asynchronous device: launch, then complete

N_KEYS = 2  # few buffers: many conflicts
NBYTES = 8


@dataclass
class Spec:
    deps: list[int]  # indices of earlier tasks whose value this one takes
    buffers: dict[int, bool]  # key -> is_write
    priority: int
    nbytes: int
    gpu: bool
    riders: int = 0  # tasks that read its result, admitted with it on its slot


specs = st.builds(
    Spec,
    deps=st.lists(st.integers(0, 10**6), max_size=2),
    buffers=st.dictionaries(st.integers(0, N_KEYS - 1), st.booleans(), max_size=2),
    priority=st.integers(-1, 1),
    nbytes=st.integers(0, 16),
    gpu=st.booleans(),
    riders=st.sampled_from([0, 0, 0, 1, 3]),
)

actions = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "submit",
                "stage",
                "publish",
                "take",
                "finish",
                "fail",
                "cancel",
                "take_gpu",
                "launch",
                "launch_fail",
                "complete",
                "complete_fail",
            ]
        ),
        st.integers(0, 10**6),
    ),
    min_size=20,
    max_size=150,
)


@dataclass
class Driver:
    s: Scheduler
    specs: list[Spec]
    tasks: list[Task] = field(default_factory=list)
    admitted: list[Task] = field(default_factory=list)  # in admission (= submission) order
    running: list[Task] = field(default_factory=list)  # on the cpu
    launching: list[Task] = field(default_factory=list)  # running on the gpu: being launched
    launched: list[Task] = field(default_factory=list)
    resolves: dict[int, int] = field(default_factory=dict)  # id(task) -> ("resolve", task) count
    ran: set[int] = field(default_factory=set)  # ids of tasks that started
    cancelled_by_user: set[int] = field(default_factory=set)
    never_admitted: set[int] = field(default_factory=set)  # cancelled while waiting for admission
    riders: dict[int, list[Task]] = field(default_factory=dict)  # id(submission) -> its riders
    call_of: dict[int, Task] = field(default_factory=dict)  # id(rider) -> its submission

    def step(self, kind: str, n: int) -> None:
        s = self.s
        if kind in ("submit", "stage"):
            self.submit_next(stage=kind == "stage")
        elif kind == "publish":
            s.publish()
        elif kind in ("take", "take_gpu"):
            task = s.take(GPU if kind == "take_gpu" else "cpu")
            if task is not None:
                self.started(task)
        elif kind in ("finish", "fail") and self.running:
            task = self.running.pop(n % len(self.running))
            error = RuntimeError(f"task {task.name}") if kind == "fail" else None
            nxt = s.finish(task, value=n, error=error)
            if nxt is not None:
                self.started(nxt)
        elif kind == "gpu":  # the asynchronous device's next event, whichever applies
            if self.launched and n % 3 == 0:
                self.step("complete_fail" if n % 9 == 0 else "complete", n // 3)
            elif self.launching:
                self.step("launch_fail" if n % 17 == 0 else "launch", n)
            elif s.ready_count(GPU):
                self.step("take_gpu", n)
            elif self.launched:
                self.step("complete", n)
            return
        elif kind == "launch" and self.launching:
            task = self.launching.pop(n % len(self.launching))
            nxt = s.launch(task, chain=n % 2 == 0)  # chained: a dependent it made ready comes back running
            self.launched.append(task)
            if nxt is not None:
                self.started(nxt)
        elif kind == "launch_fail" and self.launching:
            task = self.launching.pop(n % len(self.launching))
            nxt = s.finish(task, error=RuntimeError(f"launch of task {task.name}"))
            if nxt is not None:
                self.started(nxt)
        elif kind in ("complete", "complete_fail") and self.launched:
            task = self.launched.pop(n % len(self.launched))
            error = RuntimeError(f"task {task.name}") if kind == "complete_fail" else None
            s.complete(task, value=n, error=error)
        elif kind == "cancel" and self.tasks:
            # (a rider is made known once it is admitted: the outputs a call returns)
            every = [*self.tasks, *(r for t in self.tasks for r in self.riders[id(t)] if r.state != "new")]
            task = every[n % len(every)]
            before = task.state
            if s.cancel(task):
                assert before in ("admitting", "waiting", "ready"), before
                self.cancelled_by_user.add(id(task))
                if before == "admitting":
                    self.never_admitted.add(id(task))
            else:
                assert task.state in ("running", "launched") or task.state in FINAL_STATES
        self.absorb(s.drain())
        s.validate()
        for task in self.tasks:
            if task.state == "ready":
                self.may_start(task)

    def submit_next(self, stage: bool) -> None:
        index = len(self.tasks)
        if index >= len(self.specs):
            return
        spec = self.specs[index]
        deps = tuple(dict.fromkeys(self.tasks[d % index] for d in spec.deps)) if index else ()
        buffers = tuple((key, NBYTES, write) for key, write in spec.buffers.items())
        device = GPU if spec.gpu else "cpu"
        task = Task(
            name=str(index),
            deps=deps,
            buffers=buffers,
            priority=spec.priority,
            nbytes=spec.nbytes,
            device=device,
        )
        task.watchers = []
        self.tasks.append(task)
        riders = [Task(name=f"{index}.{i}", deps=(task,), device=device) for i in range(spec.riders)]
        for rider in riders:
            rider.watchers = []
            self.call_of[id(rider)] = task
        self.riders[id(task)] = riders
        if self.s.submit(task, stage=stage):
            self.admitted.append(task)
            if riders:
                self.s.ride(riders, task, stage)
        else:
            self.s.enqueue(task, task, riders=riders)

    def absorb(self, out: list[tuple[str, Any]]) -> None:
        for kind, obj in out:
            if kind == "admitted":
                self.admitted.append(obj)
            else:
                assert kind == "resolve", kind
                assert obj.state in FINAL_STATES
                self.resolves[id(obj)] = self.resolves.get(id(obj), 0) + 1

    def started(self, task: Task) -> None:
        """A task starts: everything it must follow is final (or launched on its device), its inputs done."""
        assert task.state == "running"
        assert id(task) not in self.ran, "a task started twice"
        self.ran.add(id(task))
        (self.launching if task.device == GPU else self.running).append(task)
        self.may_start(task)

    def may_start(self, task: Task) -> None:
        """``task`` is ready or starts: an input or conflicting earlier task on another device (or on
        the cpu) is final (done, for an input); one on the same asynchronous device may be launched."""
        call = self.call_of.get(id(task))
        if call is not None:  # a rider: it reads its submission's result alone
            same = call.device == task.device == GPU
            assert call.state == "done" or (same and call.state == "launched"), (task, call)
            return
        index = self.tasks.index(task)
        spec = self.specs[index]
        behind_ok = ("launched",) if task.device == GPU else ()

        def passed(parent: Task, final: tuple[str, ...]) -> bool:
            return parent.state in final or (parent.device == task.device and parent.state in behind_ok)

        for d in spec.deps if index else ():
            parent = self.tasks[d % index]
            assert passed(parent, ("done",)), (
                f"task {index} is {task.state} before its input {parent} was done"
            )
        mine = spec.buffers
        for earlier in self.admitted:
            if earlier is task:
                break
            theirs = self.specs[self.tasks.index(earlier)].buffers
            for key, write in mine.items():
                if key in theirs and (write or theirs[key]):
                    assert passed(earlier, tuple(FINAL_STATES)), (
                        f"task {index} is {task.state} while earlier task {earlier} that it conflicts with on "
                        f"buffer {key} is {earlier.state}"
                    )

    def drain_all(self) -> None:
        """Submit the rest and run everything to completion, successfully."""
        while len(self.tasks) < len(self.specs):
            self.step("submit", 0)
        self.step("publish", 0)
        for _ in range(20 * len(self.specs) + 10):
            if self.running:
                self.step("finish", 0)
            elif self.launching:
                self.step("launch", 0)
            elif self.s.ready_count(GPU):
                self.step("take_gpu", 0)
            elif self.s.ready_count("cpu"):
                self.step("take", 0)
            elif self.launched:
                self.step("complete", -1)  # the latest first: completions out of order
            else:
                break
        assert not self.running and not self.launching and not self.launched


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(specs, min_size=1, max_size=40),
    actions,
    st.sampled_from([1, 2, 3, 5, 1000]),
    st.sampled_from([48, 64, 10_000]),
    st.sampled_from([None, 40, 64]),
)
def test_random_event_sequences_keep_sequential_consistency(
    task_specs: list[Spec],
    steps: list[tuple[str, int]],
    max_pending: int,
    max_pending_bytes: int,
    gpu_bytes: int | None,
) -> None:
    run_program(task_specs, steps, max_pending, max_pending_bytes, gpu_bytes)


gpu_specs = st.builds(
    Spec,
    deps=st.lists(st.integers(0, 10**6), max_size=2),
    buffers=st.dictionaries(st.integers(0, N_KEYS - 1), st.booleans(), max_size=2),
    priority=st.integers(-1, 1),
    nbytes=st.integers(0, 16),
    gpu=st.sampled_from([True, True, True, False]),
)

# mostly the asynchronous device's events, so that launches behind launched parents, completions out of
# order and failures after launch are common
gpu_actions = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("submit", "submit", "submit", "stage", "publish", "take", "finish", "fail", "cancel"),
                *("gpu",) * 12,
            ]
        ),
        st.integers(0, 10**6),
    ),
    min_size=50,
    max_size=300,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(gpu_specs, min_size=2, max_size=30),
    gpu_actions,
    st.sampled_from([2, 5, 1000]),
    st.sampled_from([None, 40, 10_000]),
)
def test_random_asynchronous_programs_keep_sequential_consistency(
    task_specs: list[Spec], steps: list[tuple[str, int]], max_pending: int, gpu_bytes: int | None
) -> None:
    run_program(task_specs, steps, max_pending, 10_000, gpu_bytes)


def run_program(
    task_specs: list[Spec],
    steps: list[tuple[str, int]],
    max_pending: int,
    max_pending_bytes: int,
    gpu_bytes: int | None,
) -> None:
    s = Scheduler(
        max_pending=max_pending,
        max_pending_bytes=max_pending_bytes,
        devices=("cpu", GPU),
        asynchronous=(GPU,),
        device_bytes=None if gpu_bytes is None else {GPU: gpu_bytes},
        check=True,
    )
    driver = Driver(s, task_specs)
    for kind, n in steps:
        driver.step(kind, n)
    driver.drain_all()

    assert s.pending == 0 and s.riding == 0 and s.running == 0 and s.launched == 0 and s.pending_bytes == 0
    assert s.device_pending_bytes(GPU) == 0
    assert s.waiting_admission == 0
    assert len(driver.admitted) + len(driver.never_admitted) == len(task_specs)
    for index, task in enumerate(driver.tasks):
        assert task.state in FINAL_STATES, (index, task.state)
        inputs = [driver.tasks[d % index] for d in task_specs[index].deps] if index else []
        if task.state == "cancelled":
            assert id(task) in driver.cancelled_by_user or any(p.state == "cancelled" for p in inputs)
            assert id(task) not in driver.ran
        elif task.state == "failed" and isinstance(task.error, DependencyError):
            assert any(p.state == "failed" for p in inputs)
            # it did not run, or it was made ready behind an input launched on its device that failed
            assert id(task) not in driver.ran or any(p.device == GPU == task.device for p in inputs)
        else:
            assert id(task) in driver.ran  # done, or failed by raising: it ran
            if task.state == "done":
                assert all(p.state == "done" for p in inputs)
        assert driver.resolves.get(id(task)) == 1, (index, task.state, driver.resolves.get(id(task)))
        for rider in driver.riders[id(task)]:
            if id(task) in driver.never_admitted:
                assert rider.state == "new" and id(rider) not in driver.resolves
                continue
            assert driver.resolves.get(id(rider)) == 1, rider
            assert rider.state in FINAL_STATES and (rider.state != "done" or task.state == "done")
    riders = sum(len(driver.riders[id(t)]) for t in driver.admitted)
    assert s.submitted == len(driver.admitted) + riders
    # a task cancelled before it was admitted is not counted: the counts add up to what was submitted
    assert s.completed + s.failed + s.cancelled == s.submitted
