"""The core under random event sequences: ``validate()`` after every step, and sequential consistency.

Random tasks (data dependencies, reads and writes of a few buffers, priorities, declared bytes) are
submitted -- staged or not, through the admission queue when the limits are reached -- while tasks are
taken, finished, failed and cancelled in a random interleaving.  Whenever a task starts, every earlier
task it conflicts with (a write and any access of the same buffer) must be final, and every input it
takes must be done; in the end every task is final and nothing is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsvc import DependencyError
from schedsvc._core import FINAL_STATES, Scheduler, Task

N_KEYS = 2  # few buffers: many conflicts
NBYTES = 8


@dataclass
class Spec:
    deps: list[int]  # indices of earlier tasks whose value this one takes
    buffers: dict[int, bool]  # key -> is_write
    priority: int
    nbytes: int


specs = st.builds(
    Spec,
    deps=st.lists(st.integers(0, 10**6), max_size=2),
    buffers=st.dictionaries(st.integers(0, N_KEYS - 1), st.booleans(), max_size=2),
    priority=st.integers(-1, 1),
    nbytes=st.integers(0, 16),
)

actions = st.lists(
    st.tuples(
        st.sampled_from(["submit", "stage", "publish", "take", "finish", "fail", "cancel"]),
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
    running: list[Task] = field(default_factory=list)
    ran: set[int] = field(default_factory=set)  # ids of tasks that started
    cancelled_by_user: set[int] = field(default_factory=set)
    never_admitted: set[int] = field(default_factory=set)  # cancelled while waiting for admission

    def step(self, kind: str, n: int) -> None:
        s = self.s
        if kind in ("submit", "stage"):
            self.submit_next(stage=kind == "stage")
        elif kind == "publish":
            s.publish()
        elif kind == "take":
            task = s.take("cpu")
            if task is not None:
                self.started(task)
        elif kind in ("finish", "fail") and self.running:
            task = self.running.pop(n % len(self.running))
            error = RuntimeError(f"task {self.tasks.index(task)}") if kind == "fail" else None
            nxt = s.finish(task, value=n, error=error)
            if nxt is not None:
                self.started(nxt)
        elif kind == "cancel" and self.tasks:
            task = self.tasks[n % len(self.tasks)]
            before = task.state
            if s.cancel(task):
                assert before in ("admitting", "waiting", "ready"), before
                self.cancelled_by_user.add(id(task))
                if before == "admitting":
                    self.never_admitted.add(id(task))
            else:
                assert task.state == "running" or task.state in FINAL_STATES
        self.absorb(s.drain())
        s.validate()

    def submit_next(self, stage: bool) -> None:
        index = len(self.tasks)
        if index >= len(self.specs):
            return
        spec = self.specs[index]
        deps = tuple(dict.fromkeys(self.tasks[d % index] for d in spec.deps)) if index else ()
        buffers = tuple((key, NBYTES, write) for key, write in spec.buffers.items())
        task = Task(name=str(index), deps=deps, buffers=buffers, priority=spec.priority, nbytes=spec.nbytes)
        task.watchers = []
        self.tasks.append(task)
        if self.s.submit(task, stage=stage):
            self.admitted.append(task)
        else:
            self.s.enqueue(task, task)

    def absorb(self, out: list[tuple[str, Any]]) -> None:
        for kind, obj in out:
            if kind == "admitted":
                self.admitted.append(obj)
            else:
                assert kind == "resolve", kind
                assert obj.state in FINAL_STATES

    def started(self, task: Task) -> None:
        """A task starts: everything it must follow is final, and its inputs are done."""
        assert task.state == "running"
        assert id(task) not in self.ran, "a task started twice"
        self.ran.add(id(task))
        self.running.append(task)
        index = self.tasks.index(task)
        spec = self.specs[index]
        for d in spec.deps if index else ():
            parent = self.tasks[d % index]
            assert parent.state == "done", f"task {index} started before its input {parent} was done"
        mine = spec.buffers
        for earlier in self.admitted:
            if earlier is task:
                break
            theirs = self.specs[self.tasks.index(earlier)].buffers
            for key, write in mine.items():
                if key in theirs and (write or theirs[key]):
                    assert earlier.state in FINAL_STATES, (
                        f"task {index} started while earlier task {earlier} that it conflicts with on "
                        f"buffer {key} is {earlier.state}"
                    )

    def drain_all(self) -> None:
        """Submit the rest and run everything to completion, successfully."""
        while len(self.tasks) < len(self.specs):
            self.step("submit", 0)
        self.step("publish", 0)
        for _ in range(10 * len(self.specs) + 10):
            if self.running:
                self.step("finish", 0)
            elif self.s.ready_count("cpu"):
                self.step("take", 0)
            else:
                break
        assert not self.running


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(specs, min_size=1, max_size=40),
    actions,
    st.sampled_from([1, 2, 3, 5, 1000]),
    st.sampled_from([48, 64, 10_000]),
)
def test_random_event_sequences_keep_sequential_consistency(
    task_specs: list[Spec], steps: list[tuple[str, int]], max_pending: int, max_pending_bytes: int
) -> None:
    s = Scheduler(max_pending=max_pending, max_pending_bytes=max_pending_bytes, check=True)
    driver = Driver(s, task_specs)
    for kind, n in steps:
        driver.step(kind, n)
    driver.drain_all()

    assert s.pending == 0 and s.running == 0 and s.pending_bytes == 0
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
            assert id(task) not in driver.ran
        else:
            assert id(task) in driver.ran  # done, or failed by raising: it ran
    assert s.submitted == len(driver.admitted)
    assert s.completed + s.failed + s.cancelled == len(task_specs)
