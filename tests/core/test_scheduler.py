"""The pure scheduling core, event by event: no threads, no event loop, ``validate()`` after every step."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from schedsvc import DependencyError, MemoryLimitError
from schedsvc._core import (
    FINAL_STATES,
    TRANSITIONS,
    Scheduler,
    Task,
)

from .helpers import BIG, R, W, out_of, resolved


def make(
    *,
    max_pending: int = 1000,
    max_pending_bytes: int = BIG,
    devices: tuple[str, ...] = ("cpu",),
) -> Scheduler:
    return Scheduler(
        max_pending=max_pending, max_pending_bytes=max_pending_bytes, devices=devices, check=True
    )


def task(name: str, **fields: Any) -> Task:
    """A task whose completion the scheduler reports (it has watchers, as an awaited future does)."""
    t = Task(name=name, **fields)
    t.watchers = []
    return t


def submit(s: Scheduler, *tasks: Task) -> None:
    for t in tasks:
        assert s.submit(t), t
        assert out_of(s) == [], t


def take(s: Scheduler, device: str = "cpu") -> Task | None:
    t = s.take(device)
    assert out_of(s) == []
    return t


def finish(
    s: Scheduler, t: Task, value: Any = None, error: BaseException | None = None
) -> list[tuple[str, Any]]:
    """``finish`` a task: its instructions, then ``("run", dependent)`` if it handed one back to run inline."""
    inline = s.finish(t, value, error)
    out = out_of(s)
    return out if inline is None else [*out, ("run", inline)]


def finish_cancelled(s: Scheduler, t: Task) -> list[tuple[str, Any]]:
    s.finish_cancelled(t)
    return out_of(s)


def cancel(s: Scheduler, t: Task) -> list[tuple[str, Any]]:
    s.cancel(t)
    return out_of(s)


def enqueue(s: Scheduler, t: Task | None, token: Any) -> list[tuple[str, Any]]:
    s.enqueue(t, token)
    return out_of(s)


def barrier(s: Scheduler, token: Any) -> list[tuple[str, Any]]:
    s.barrier(token)
    return out_of(s)


def take_all(s: Scheduler, device: str = "cpu") -> list[Task]:
    taken = []
    while (t := take(s, device)) is not None:
        taken.append(t)
    return taken


def runs(out: list[tuple[str, Any]]) -> list[Task]:
    return [obj for kind, obj in out if kind == "run"]


# -- the state table -----------------------------------------------------------


def test_transition_table_covers_every_state() -> None:
    states = {"new", "admitting", "waiting", "ready", "running", "launched", "done", "failed", "cancelled"}
    assert set(TRANSITIONS) == states
    assert set(FINAL_STATES) == {"done", "failed", "cancelled"}
    for final in FINAL_STATES:
        assert not TRANSITIONS[final]
    assert "running" not in TRANSITIONS["waiting"]
    # a running task ends cancelled only through finish_cancelled (a remote executor's); cancel() refuses it
    assert TRANSITIONS["running"] == {"launched", "done", "failed", "cancelled"}
    # launched (asynchronous devices): only its completion ends it; it cannot be cancelled
    assert TRANSITIONS["launched"] == {"done", "failed"}
    # a task made ready behind a launched parent fails, unrun, if that parent's result fails
    assert TRANSITIONS["ready"] == {"running", "failed", "cancelled"}


def test_validate_needs_check_mode() -> None:
    with pytest.raises(AssertionError):
        Scheduler(max_pending=1, max_pending_bytes=1).validate()


# -- readiness and dependencies -------------------------------------------------


def test_independent_tasks_are_ready_at_once() -> None:
    s = make()
    a, b, c = task("a"), task("b"), task("c")
    submit(s, a, b, c)
    assert [t.state for t in (a, b, c)] == ["ready"] * 3
    assert s.ready_count("cpu") == 3
    assert take_all(s) == [a, b, c]
    assert all(t.state == "running" for t in (a, b, c))
    assert s.running == 3


def test_data_dependency_waits_for_its_parent() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    submit(s, a, b)
    assert a.state == "ready"
    assert b.state == "waiting"
    assert take_all(s) == [a]
    out = finish(s, a, value=1)
    assert resolved(out) == [a]
    assert runs(out) == [b]  # the only dependent runs inline on the finishing worker
    assert a.state == "done" and a.value == 1
    assert b.state == "running"
    out = finish(s, b, value=2)
    assert resolved(out) == [b]
    assert s.pending == 0 and s.completed == 2


def test_dependency_on_a_finished_task_is_ready_at_once() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    finish(s, a, value=1)
    b = task("b", deps=(a,))
    submit(s, b)
    assert b.state == "ready"


def test_task_with_two_parents_waits_for_both() -> None:
    s = make()
    a, b = task("a"), task("b")
    c = task("c", deps=(a, b))
    submit(s, a, b, c)
    assert take_all(s) == [a, b]
    assert runs(finish(s, b)) == []
    assert c.state == "waiting"
    assert runs(finish(s, a)) == [c]


def test_two_dependents_made_ready_by_one_finish_both_run() -> None:
    s = make()
    a = task("a")
    b, c = task("b", deps=(a,)), task("c", deps=(a,))
    submit(s, a, b, c)
    take(s)
    inline = runs(finish(s, a))
    rest = take_all(s)
    assert sorted(t.name for t in inline + rest) == ["b", "c"]  # type: ignore[type-var]
    assert len(inline) <= 1
    assert b.state == c.state == "running"


def test_tasks_of_other_devices_are_not_taken() -> None:
    s = make(devices=("cpu", "cuda:0"))
    a = task("a", device="cuda:0")
    b = task("b")
    submit(s, a, b)
    assert take_all(s) == [b]
    assert take_all(s, "cuda:0") == [a]


# -- buffer hazards ---------------------------------------------------------------


def test_read_after_write_waits() -> None:
    s = make()
    w, r = task("w", buffers=(W(1),)), task("r", buffers=(R(1),))
    submit(s, w, r)
    assert r.state == "waiting"
    assert take_all(s) == [w]
    assert runs(finish(s, w)) == [r]


def test_write_after_read_waits() -> None:
    s = make()
    r, w = task("r", buffers=(R(1),)), task("w", buffers=(W(1),))
    submit(s, r, w)
    assert w.state == "waiting"
    assert take_all(s) == [r]
    assert runs(finish(s, r)) == [w]


def test_write_after_write_waits() -> None:
    s = make()
    w1, w2 = task("w1", buffers=(W(1),)), task("w2", buffers=(W(1),))
    submit(s, w1, w2)
    assert w2.state == "waiting"
    assert take_all(s) == [w1]
    assert runs(finish(s, w1)) == [w2]


def test_concurrent_readers_are_both_ready() -> None:
    s = make()
    r1, r2 = task("r1", buffers=(R(1),)), task("r2", buffers=(R(1),))
    submit(s, r1, r2)
    assert take_all(s) == [r1, r2]


def test_writer_waits_for_every_earlier_reader() -> None:
    s = make()
    r1, r2 = task("r1", buffers=(R(1),)), task("r2", buffers=(R(1),))
    w = task("w", buffers=(W(1),))
    submit(s, r1, r2, w)
    assert take_all(s) == [r1, r2]
    assert runs(finish(s, r2)) == []
    assert w.state == "waiting"
    assert runs(finish(s, r1)) == [w]


def test_reader_after_writer_after_readers_waits_for_the_writer_only() -> None:
    s = make()
    r1 = task("r1", buffers=(R(1),))
    w = task("w", buffers=(W(1),))
    r2 = task("r2", buffers=(R(1),))
    submit(s, r1, w, r2)
    assert r2.state == "waiting"
    take_all(s)
    assert runs(finish(s, r1)) == [w]
    assert runs(finish(s, w)) == [r2]


def test_different_buffers_do_not_order() -> None:
    s = make()
    a, b = task("a", buffers=(W(1),)), task("b", buffers=(W(2),))
    submit(s, a, b)
    assert take_all(s) == [a, b]


def test_hazards_on_one_buffer_chain_in_submission_order() -> None:
    s = make()
    kinds = [W, R, R, W, W, R]
    tasks = [task(f"t{i}", buffers=(k(7),)) for i, k in enumerate(kinds)]
    submit(s, *tasks)
    order: list[Task] = []
    while len(order) < len(tasks):
        batch = take_all(s)
        assert batch, "nothing ready although tasks are unfinished"
        while batch:
            t = batch.pop(0)
            order.append(t)
            batch.extend(runs(finish(s, t)))
            batch.extend(take_all(s))
    # writers run alone, in order; the readers between two writers may run in any order
    assert order.index(tasks[0]) < order.index(tasks[1]) < order.index(tasks[3])
    assert order.index(tasks[0]) < order.index(tasks[2]) < order.index(tasks[3])
    assert order.index(tasks[3]) < order.index(tasks[4]) < order.index(tasks[5])


# -- priorities -----------------------------------------------------------------------


def test_higher_priority_first_fifo_within_a_priority() -> None:
    s = make()
    low = task("low", priority=0)
    high1 = task("high1", priority=5)
    mid = task("mid", priority=1)
    high2 = task("high2", priority=5)
    low2 = task("low2", priority=0)
    neg = task("neg", priority=-3)
    submit(s, low, high1, neg, mid, high2, low2)
    assert take_all(s) == [high1, high2, mid, low, low2, neg]


def test_finish_does_not_run_a_dependent_inline_when_a_higher_priority_task_is_queued() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,), priority=0)
    submit(s, a)
    assert take(s) is a
    urgent = task("urgent", priority=5)
    submit(s, b, urgent)
    out = finish(s, a)
    assert runs(out) == []
    assert b.state == "ready"
    assert take_all(s) == [urgent, b]


def test_finish_runs_a_higher_priority_dependent_inline_over_lower_queued_work() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    b = task("b", deps=(a,), priority=5)
    low = task("low", priority=0)
    submit(s, b, low)
    assert runs(finish(s, a)) == [b]
    assert take_all(s) == [low]


# -- failures -------------------------------------------------------------------------


def test_failure_cascades_to_data_dependents_with_the_original_as_cause() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    submit(s, a, b, c)
    take(s)
    boom = ValueError("boom")
    out = finish(s, a, error=boom)
    assert runs(out) == []
    assert set(resolved(out)) == {a, b, c}
    assert a.state == "failed" and a.error is boom
    for child in (b, c):
        assert child.state == "failed"
        assert isinstance(child.error, DependencyError)
        assert child.error.__cause__ is boom
    assert "a" in str(b.error)  # names the input that failed
    assert s.failed == 3 and s.completed == 0 and s.pending == 0


def test_submitting_a_dependent_of_a_failed_task_fails_it_at_once() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    boom = KeyError("k")
    finish(s, a, error=boom)
    b = task("b", deps=(a,))
    assert s.submit(b)
    out = out_of(s)
    assert resolved(out) == [b]
    assert b.state == "failed"
    assert isinstance(b.error, DependencyError)
    assert b.error.__cause__ is boom


def test_hazard_only_dependent_still_runs_after_a_failure() -> None:
    s = make()
    a = task("a", buffers=(W(1),))
    hazard = task("hazard", buffers=(R(1),))  # orders after a, does not take its value
    data = task("data", deps=(a,))
    submit(s, a, hazard, data)
    take(s)
    out = finish(s, a, error=RuntimeError("x"))
    assert data.state == "failed"
    assert hazard.state in ("ready", "running")
    ran = runs(out) + take_all(s)
    assert ran == [hazard]
    finish(s, hazard, value=3)
    assert hazard.state == "done" and hazard.value == 3


def test_failure_cascade_over_a_long_chain_does_not_recurse() -> None:
    n = 10_000
    s = make(max_pending=n + 1)
    first = task("t0")
    chain = [first]
    for i in range(1, n):
        chain.append(task(f"t{i}", deps=(chain[-1],)))
    for t in chain:
        assert s.submit(t)
    assert s.take("cpu") is first
    boom = ValueError("first")
    assert s.finish(first, error=boom) is None
    s.validate()
    assert all(t.state == "failed" for t in chain)
    assert all(t.error.__cause__ is boom for t in chain[1:])  # type: ignore[union-attr]
    assert s.pending == 0
    assert len(resolved(s.drain())) == n


def test_dependency_error_messages_stay_short_down_a_chain() -> None:
    """Each relay names its input and the original failure is its __cause__; the message must not embed the
    whole chain above it (that is quadratic time and memory: gigabytes for a 10,000-task chain)."""
    n = 200
    s = make(max_pending=n + 1)
    chain = [task("t0")]
    for i in range(1, n):
        chain.append(task(f"t{i}", deps=(chain[-1],)))
    for t in chain:
        assert s.submit(t)
    s.take("cpu")
    boom = ValueError("root cause")
    s.finish(chain[0], error=boom)
    for t in chain[1:]:
        assert isinstance(t.error, DependencyError)
        assert t.error.__cause__ is boom
        assert len(str(t.error)) < 500, f"{t.name}: {len(str(t.error))} characters"
    s.validate()


def test_cancel_cascade_over_a_long_chain_does_not_recurse() -> None:
    n = 10_000
    s = make(max_pending=n + 1)
    chain = [task("t0")]
    for i in range(1, n):
        chain.append(task(f"t{i}", deps=(chain[-1],)))
    for t in chain:
        assert s.submit(t)
    assert s.cancel(chain[0])
    s.validate()
    assert all(t.state == "cancelled" for t in chain)
    assert s.pending == 0 and s.cancelled == n


# -- cancellation ------------------------------------------------------------------------


def test_cancel_ready_task_cancels_its_data_dependents() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    hazard = task("hazard", buffers=(R(1),))
    submit(s, a, b, c, hazard)
    out = cancel(s, a)
    assert set(resolved(out)) == {a, b, c}
    assert a.state == b.state == c.state == "cancelled"
    assert take_all(s) == [hazard]
    assert s.cancelled == 3


def test_cancel_waiting_task_leaves_its_parent_alone() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    submit(s, a, b, c)
    assert take(s) is a
    out = cancel(s, b)
    assert set(resolved(out)) == {b, c}
    assert a.state == "running"
    out = finish(s, a, value=1)
    assert runs(out) == []
    assert a.state == "done" and s.pending == 0


def test_edges_listed_for_a_trace_include_values_of_finished_parents() -> None:
    """While ``edges`` is a list (a trace is on), every data dependency is listed, made or not; hazards only
    when they order something; and nothing is listed while it is None."""
    s = make()
    a = task("a", buffers=(W(1),))
    submit(s, a)
    assert take_all(s) == [a]
    finish(s, a)
    s.edges = []
    b = task("b", deps=(a,), buffers=(W(1),))  # a is done: no scheduling edge, but its value flows to b
    c = task("c", buffers=(R(1),))  # reads after b writes: a hazard edge
    submit(s, b, c)
    assert s.edges == [(a.seq, b.seq), (b.seq, c.seq)]
    s.edges = None
    d = task("d", deps=(a, b))
    submit(s, d)
    assert b.dependents == [c, d]


def test_cancel_releases_hazard_edges() -> None:
    s = make()
    a = task("a", buffers=(R(1),))
    b = task("b", buffers=(W(1),))
    c = task("c", buffers=(W(2),))
    d = task("d", buffers=(R(2),))
    submit(s, a, c, b, d)
    assert take_all(s) == [a, c]
    cancel(s, b)
    finish(s, a)
    assert runs(finish(s, c)) == [d]


def test_cancelling_a_waiting_task_keeps_the_hazard_order_around_it() -> None:
    """w1 writes, w2 writes (waits for w1), r reads (waits for w2, hence for w1).

    Cancelling w2 must not let r read while w1 is still writing: sequentially, r sees w1's write.
    """
    s = make()
    w1 = task("w1", buffers=(W(1),))
    w2 = task("w2", buffers=(W(1),))
    r = task("r", buffers=(R(1),))
    submit(s, w1, w2, r)
    assert take_all(s) == [w1]
    cancel(s, w2)
    assert w2.state == "cancelled"
    assert r.state == "waiting", "r became ready while w1, which writes what r reads, is still running"
    assert take_all(s) == []
    assert runs(finish(s, w1)) == [r]


def test_failing_a_waiting_task_keeps_the_hazard_order_around_it() -> None:
    """w2 takes p's value and writes what w1 writes; r reads it.  p fails, so w2 fails without running:
    r must still wait for w1."""
    s = make()
    p = task("p")
    w1 = task("w1", buffers=(W(1),))
    w2 = task("w2", deps=(p,), buffers=(W(1),))
    r = task("r", buffers=(R(1),))
    submit(s, p, w1, w2, r)
    assert take_all(s) == [p, w1]
    finish(s, p, error=ValueError("p"))
    assert w2.state == "failed"
    assert r.state == "waiting", "r became ready while w1, which writes what r reads, is still running"
    assert runs(finish(s, w1)) == [r]


def test_cancelling_a_waiting_reader_keeps_the_writer_after_the_earlier_writer() -> None:
    s = make()
    w1 = task("w1", buffers=(W(1),))
    r = task("r", buffers=(R(1),))
    w2 = task("w2", buffers=(W(1),))
    submit(s, w1, r, w2)
    assert take_all(s) == [w1]
    cancel(s, r)
    assert w2.state == "waiting", "w2 became ready while w1 is still writing the same buffer"
    assert runs(finish(s, w1)) == [w2]


def test_running_task_cannot_be_cancelled() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    assert s.cancel(a) is False
    s.validate()
    assert a.state == "running"
    finish(s, a, value=1)
    assert a.state == "done"


def test_a_running_task_cancelled_where_it_was_sent_cancels_its_dependents() -> None:
    s = make()
    a = task("a", buffers=(W(1),))
    b = task("b", deps=(a,))  # takes a's value: cancelled with it
    r = task("r", buffers=(R(1),))  # ordered after a by a hazard only: runs once a is final
    submit(s, a, b, r)
    assert take(s) is a
    assert s.cancel(a) is False  # a worker thread cannot be stopped: cancel refuses a running task
    out = finish_cancelled(s, a)  # but a remote executor dropped it unrun
    assert set(resolved(out)) == {a, b}
    assert a.state == b.state == "cancelled" and a.error is None
    assert s.cancelled == 2 and s.failed == 0 and s.running == 0
    assert take_all(s) == [r]
    finish(s, r)
    assert s.pending == 0


def test_final_task_cannot_be_cancelled() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    finish(s, a, value=1)
    assert s.cancel(a) is False
    assert a.state == "done"


def test_cancel_a_task_waiting_for_admission() -> None:
    s = make(max_pending=1)
    a, b, c = task("a"), task("b"), task("c")
    submit(s, a)
    assert s.submit(b) is False and out_of(s) == []
    enqueue(s, b, "tb")
    enqueue(s, c, "tc")
    out = cancel(s, b)
    assert resolved(out) == [b]
    assert b.state == "cancelled"
    assert s.waiting_admission == 1
    take(s)
    out = finish(s, a)
    assert ("admitted", "tc") in out
    assert ("admitted", "tb") not in out


def test_a_task_cancelled_before_admission_is_not_counted() -> None:
    """Regression: stats counted a submission cancelled while it waited for admission as cancelled,
    though it was never submitted, so submitted != completed + failed + cancelled + pending."""
    s = make(max_pending=1)
    a, b, c = task("a"), task("b"), task("c")
    submit(s, a)
    enqueue(s, b, "tb")
    enqueue(s, c, "tc")
    cancel(s, b)
    s.cancel_pending()  # c, still queued, and a, admitted and not started
    s.validate()
    assert (s.submitted, s.completed, s.failed, s.cancelled, s.pending) == (1, 0, 0, 1, 0)
    assert a.state == b.state == c.state == "cancelled"


def test_a_task_ordered_after_one_cancelled_before_admission_runs() -> None:
    """A task ordered after a queued one (``after``: a Tensor's pending write) that is then cancelled
    does not wait for it forever."""
    s = make(max_pending=1)
    blocker, queued = task("blocker"), task("queued")
    submit(s, blocker)
    enqueue(s, queued, "tq")
    later = task("later", nested=True)  # (admitted over the limits, as a running task's submission is)
    later.after = (queued,)
    assert s.submit(later, force=True)
    assert later.state == "waiting"
    cancel(s, queued)
    s.validate()
    assert later.state == "ready"


def test_a_parent_it_runs_after_does_not_fail_it() -> None:
    """``after``: ordered after the parent, but its failure is not the task's own."""
    s = make()
    writer, reader, dependent = task("writer"), task("reader"), task("dependent", deps=())
    submit(s, writer)
    reader.after = (writer,)
    dependent.deps = (writer,)
    submit(s, reader, dependent)
    assert reader.state == "waiting"
    take(s)
    finish(s, writer, error=ValueError("boom"))
    s.validate()
    assert reader.state in ("ready", "running")  # (running: handed back to run at once)
    assert dependent.state == "failed" and isinstance(dependent.error, DependencyError)


class Copy(Task):
    """A task made for a submission (as the runtime's copies are): it rides on the submission's slot."""

    __slots__ = ()
    rides = True


def copy_task(name: str) -> Task:
    t = Copy(name=name)
    t.watchers = []
    return t


def test_a_task_and_its_copies_are_admitted_together_or_not_at_all() -> None:
    s = make(max_pending=1)
    blocker, copy, t = task("blocker"), copy_task("copy"), task("t")
    t.deps = (copy,)
    submit(s, blocker)
    assert s.submit(t, along=[copy]) is False  # no slot for t: neither is admitted
    assert copy.state == t.state == "new" and s.pending == 1
    s.enqueue(t, "tt", along=[copy])
    assert out_of(s) == []
    take(s)
    out = finish(s, blocker)
    assert ("admitted", "tt") in out
    assert copy.seq < t.seq and s.pending == 2 and s.riding == 1
    s.validate()


def test_copies_ride_on_their_submission_s_slot() -> None:
    """A submission needs one slot of max_pending however many copies are made for it (has_room() is
    then the truth), and its copies keep no slot from anyone once it is admitted."""
    s = make(max_pending=2)
    blocker = task("blocker")
    submit(s, blocker)
    assert take(s) is blocker  # (running: the copies are next)
    assert s.has_room()
    copies = [copy_task(f"copy{i}") for i in range(3)]
    t = task("t", deps=tuple(copies))
    assert s.submit(t, along=copies)  # what has_room() said
    assert s.pending == 5 and s.riding == 3 and not s.has_room()
    assert s.submit(task("over")) is False  # 2 submissions pending: full
    s.validate()
    for _ in copies:
        ran = take(s)
        assert ran in copies
        finish(s, ran)
    assert s.riding == 0 and s.copies == {"admitted": 3, "done": 3, "failed": 0, "cancelled": 0}
    s.validate()


def test_a_group_larger_than_max_pending_gets_in_once_nothing_is_pending() -> None:
    s = make(max_pending=1)
    copy, t = copy_task("copy"), task("t")
    t.deps = (copy,)
    assert s.submit(t, along=[copy])
    assert s.pending == 2 and s.riding == 1  # one slot: the copy rides on t's
    s.validate()


def readers_of(call: Task, n: int) -> list[Task]:
    """The outputs picked from a call's result (as a compiled call with several outputs makes them)."""
    return [task(f"out{i}", deps=(call,)) for i in range(n)]


def run(s: Scheduler, t: Task) -> None:
    """Take ``t`` (or run it as it was handed back inline) and finish it."""
    if t.state == "ready":
        assert take(s) is t
    assert t.state == "running"
    out = finish(s, t)
    for kind, obj in out:
        if kind == "run":  # handed back to run inline: run it now, as the worker would
            run(s, obj)


def test_a_call_and_its_outputs_hold_one_slot_until_the_last_output_ends() -> None:
    """The outputs ride on their call's slot; they outlive the call, so as it ends its slot passes to
    them: one slot, from the call's admission until its last output ends."""
    s = make(max_pending=1)
    call = task("call")
    assert s.submit(call)
    outs = readers_of(call, 3)
    s.ride(outs, call)
    assert s.pending == 4 and s.riding == 3 and not s.has_room()
    s.validate()
    run(s, call)  # its slot passes to an output, which carries the others
    assert s.riding == s.pending - 1 and not s.has_room()
    s.validate()
    for out in outs:
        assert not s.has_room() and s.submit(task("over")) is False
        if out.state != "done":
            run(s, out)
        s.validate()
    assert s.pending == 0 and s.riding == 0 and s.has_room()
    assert s.copies["admitted"] == 0  # (the outputs are no copies)


def test_an_output_cancelled_before_its_call_runs_gets_off_its_slot() -> None:
    s = make(max_pending=2)
    call = task("call")
    assert s.submit(call)
    outs = readers_of(call, 2)
    s.ride(outs, call)
    cancel(s, outs[0])
    assert outs[0].state == "cancelled" and s.pending - s.riding == 1  # (released once its call ends)
    s.validate()
    run(s, call)
    s.validate()
    if outs[1].state != "done":
        run(s, outs[1])
    assert s.pending == 0 and s.riding == 0
    s.validate()


def test_a_queued_call_is_admitted_with_its_outputs_on_one_slot() -> None:
    s = make(max_pending=1)
    blocker, call = task("blocker"), task("call")
    submit(s, blocker)
    outs = readers_of(call, 2)
    s.enqueue(call, "token", riders=outs)
    assert out_of(s) == [] and all(o.state == "new" for o in outs)
    assert take(s) is blocker
    assert ("admitted", "token") in finish(s, blocker)
    assert s.pending == 3 and s.riding == 2 and not s.has_room()
    s.validate()


def test_a_queued_call_cancelled_never_admits_its_outputs() -> None:
    s = make(max_pending=1)
    blocker, call = task("blocker"), task("call")
    submit(s, blocker)
    outs = readers_of(call, 2)
    s.enqueue(call, "token", riders=outs)
    cancel(s, call)
    take(s)
    finish(s, blocker)
    assert all(o.state == "new" for o in outs) and s.pending == 0 and s.riding == 0
    s.validate()


def test_the_outputs_of_a_call_that_failed_at_once_fail_with_it_and_hold_nothing() -> None:
    s = make(max_pending=1)
    parent = task("parent")
    submit(s, parent)
    take(s)
    finish(s, parent, error=ValueError("boom"))
    call = task("call", deps=(parent,))
    assert s.submit(call, force=True) and call.state == "failed"
    outs = readers_of(call, 2)
    s.ride(outs, call)
    assert all(o.state == "failed" for o in outs) and s.pending == 0 and s.riding == 0
    s.validate()


# -- admission ------------------------------------------------------------------------------


def test_admission_by_count() -> None:
    s = make(max_pending=2)
    a, b, c = task("a"), task("b"), task("c")
    assert s.submit(a) and s.submit(b)
    assert s.submit(c) is False
    s.validate()
    assert c.state == "new"  # untouched
    assert s.submit(c) is False and out_of(s) == []
    assert s.pending == 2


def test_queued_submissions_are_admitted_fifo_as_tasks_finish() -> None:
    s = make(max_pending=2)
    a, b = task("a"), task("b")
    submit(s, a, b)
    queued = [task(f"q{i}") for i in range(3)]
    for i, t in enumerate(queued):
        assert enqueue(s, t, f"tok{i}") == []
        assert t.state == "admitting"
    assert s.waiting_admission == 3
    take_all(s)
    out = finish(s, b)
    assert [x for x in out if x[0] == "admitted"] == [("admitted", "tok0")]
    assert queued[0].state == "ready"
    out = finish(s, a)
    assert [x for x in out if x[0] == "admitted"] == [("admitted", "tok1")]
    assert take_all(s) == [queued[0], queued[1]]
    out = finish(s, queued[1])
    assert [x for x in out if x[0] == "admitted"] == [("admitted", "tok2")]
    assert s.waiting_admission == 0


def test_submit_does_not_jump_the_admission_queue() -> None:
    s = make(max_pending=10, max_pending_bytes=100)
    a = task("a", buffers=(R(1, 60),))
    big = task("big", buffers=(R(2, 60),))
    small = task("small", buffers=(R(3, 10),))
    submit(s, a)
    assert s.submit(big) is False
    enqueue(s, big, "big")
    assert s.submit(small) is False  # would fit, but big waits ahead of it
    assert s.fits(small) is False
    enqueue(s, small, "small")
    take(s)
    out = finish(s, a)
    assert [x[1] for x in out if x[0] == "admitted"] == ["big", "small"]


def test_admission_by_bytes_counts_each_buffer_once() -> None:
    s = make(max_pending_bytes=100)
    a = task("a", buffers=(R(1, 60),))
    b = task("b", buffers=(W(1, 60),))  # the same buffer: no new bytes
    c = task("c", buffers=(R(2, 60),))
    submit(s, a, b)
    assert s.pending_bytes == 60
    assert s.submit(c) is False
    take_all(s)
    finish(s, a)
    assert s.pending_bytes == 60  # b still holds buffer 1
    finish(s, b)
    assert s.pending_bytes == 0
    assert s.submit(c)
    assert s.peak_pending_bytes == 60


def test_declared_output_bytes_count() -> None:
    s = make(max_pending_bytes=100)
    a = task("a", nbytes=70)
    b = task("b", buffers=(R(1, 40),))
    submit(s, a)
    assert s.pending_bytes == 70
    assert s.submit(b) is False
    take(s)
    finish(s, a)
    assert s.pending_bytes == 0
    assert s.submit(b)


def test_force_admits_over_the_limits() -> None:
    s = make(max_pending=1)
    a, b = task("a"), task("b", nested=True)
    submit(s, a)
    assert s.submit(b, force=True) and out_of(s) == []
    assert b.state == "ready"
    assert s.pending == 2


def test_task_that_can_never_fit_raises_memory_limit_error() -> None:
    s = make(max_pending_bytes=100)
    t = task("huge", buffers=(R(1, 150),), nbytes=10)
    with pytest.raises(MemoryLimitError) as info:
        s.submit(t)
    message = str(info.value)
    assert "160" in message and "100" in message
    assert t.state == "new"
    assert s.pending == 0 and s.pending_bytes == 0
    s.validate()


def test_task_exactly_at_the_byte_limit_fits() -> None:
    s = make(max_pending_bytes=100)
    t = task("exact", buffers=(R(1, 60),), nbytes=40)
    submit(s, t)
    assert s.pending_bytes == 100


def test_enqueue_without_a_task_waits_for_room() -> None:
    s = make(max_pending=1)
    a = task("a")
    submit(s, a)
    s.enqueue(None, "throttle")
    assert s.drain() == []
    take(s)
    out = finish(s, a)
    assert ("admitted", "throttle") in out


def admitted(out: list[tuple[str, Any]]) -> list[Any]:
    return [x[1] for x in out if x[0] == "admitted"]


def throttle(s: Scheduler, token: str) -> list[Any]:
    """A ``throttle`` waiter queues for room; the tokens let through at once."""
    s.enqueue(None, token)
    s.validate()
    return admitted(s.drain())


def test_throttle_waiters_are_let_through_one_per_free_slot_in_fifo_order() -> None:
    s = make(max_pending=2)
    a, b = task("a"), task("b")
    submit(s, a, b)
    assert [throttle(s, f"t{i}") for i in range(3)] == [[], [], []]
    take_all(s)
    assert admitted(finish(s, a)) == ["t0"]  # one slot freed: one waiter, and it holds the slot
    assert s.reserved == 1 and s.waiting_admission == 2
    assert admitted(finish(s, b)) == ["t1"]
    assert s.reserved == 2 and s.waiting_admission == 1
    assert s.unreserve("t0")  # t0's caller resumed without submitting: its slot goes to the next in line
    s.validate()
    assert admitted(s.drain()) == ["t2"]
    assert s.reserved == 2 and s.waiting_admission == 0


def test_a_reserved_slot_is_not_taken_by_a_submission_that_did_not_wait_for_it() -> None:
    s = make(max_pending=1)
    a = task("a")
    submit(s, a)
    assert throttle(s, "t") == []
    late, queued = task("late"), task("queued")
    take(s)
    assert admitted(finish(s, a)) == ["t"]
    assert s.submit(late) is False  # nobody queued, pending 0, but the slot is t's
    assert s.fits(late) is False and s.has_room() is False
    enqueue(s, queued, "q")
    assert queued.state == "admitting"
    assert s.unreserve("t")
    s.validate()
    assert admitted(s.drain()) == ["q"]
    assert queued.state == "ready"


def test_a_throttle_waiter_and_a_submission_share_one_fifo() -> None:
    s = make(max_pending=1)
    a, first = task("a"), task("first")
    submit(s, a)
    enqueue(s, first, "first")
    assert throttle(s, "t") == []
    take(s)
    assert admitted(finish(s, a)) == ["first"]  # the submission queued first gets the slot
    assert s.reserved == 0 and s.waiting_admission == 1
    take(s)
    assert admitted(finish(s, first)) == ["t"]
    assert s.reserved == 1


def test_submit_reserved_uses_the_slot_ahead_of_the_queue() -> None:
    s = make(max_pending=1)
    a, mine, other = task("a"), task("mine"), task("other")
    submit(s, a)
    assert throttle(s, "t") == []
    take(s)
    assert admitted(finish(s, a)) == ["t"]
    enqueue(s, other, "o")  # queued after t was let through
    assert s.submit(mine) is False  # the queue is not empty
    assert s.submit_reserved(mine, "o") is False  # o holds no reservation
    assert s.submit_reserved(mine, "t") is True
    s.validate()
    assert s.reserved == 0 and s.pending == 1 and mine.state == "ready"
    assert s.drain() == [] and other.state == "admitting"


def test_submit_reserved_that_does_not_fit_gives_the_slot_back() -> None:
    s = make(max_pending=2, max_pending_bytes=100)
    a, big, other = task("a", buffers=(R(1, 60),)), task("big", buffers=(R(2, 60),)), task("other")
    submit(s, a)
    assert throttle(s, "t") == ["t"]  # a free slot: let through at once, and reserved
    enqueue(s, other, "o")  # waits behind the reservation (pending 1 + reserved 1)
    assert s.submit_reserved(big, "t") is False  # its bytes do not fit
    s.validate()
    assert big.state == "new" and s.reserved == 0
    assert admitted(s.drain()) == ["o"]


def test_withdraw_tells_a_queued_throttle_waiter_from_one_let_through() -> None:
    s = make(max_pending=1)
    a = task("a")
    submit(s, a)
    assert throttle(s, "t1") == [] and throttle(s, "t2") == []
    assert s.withdraw("t2") is True
    take(s)
    assert admitted(finish(s, a)) == ["t1"]
    assert s.withdraw("t1") is False  # let through: it holds a slot, which it gives back
    assert s.unreserve("t1") and not s.unreserve("t1")  # given back once
    s.validate()
    assert s.reserved == 0 and s.has_room()


def test_has_room_counts_tasks_bytes_and_the_queue() -> None:
    s = make(max_pending=2, max_pending_bytes=100)
    a = task("a", buffers=(R(1, 60),))
    submit(s, a)
    assert s.has_room() and s.has_room(40)
    assert s.has_room(41) is False
    b = task("b")
    assert s.submit(b)
    out_of(s)
    assert s.has_room() is False  # two of two tasks
    enqueue(s, task("c", buffers=(R(2, 60),)), "c")
    take_all(s)
    finish(s, b)
    assert s.pending == 1 and s.waiting_admission == 1  # c's bytes do not fit yet
    assert s.has_room() is False  # c is queued ahead


# -- barriers --------------------------------------------------------------------------------


def test_barrier_with_nothing_pending_fires_at_once() -> None:
    s = make()
    assert barrier(s, "t") == [("barrier", "t")]


def test_barrier_waits_for_earlier_tasks_only() -> None:
    s = make()
    a, b = task("a"), task("b")
    submit(s, a, b)
    assert barrier(s, "t") == []
    later = task("later")
    submit(s, later)
    take_all(s)
    assert ("barrier", "t") not in finish(s, a)
    assert ("barrier", "t") in finish(s, b)
    assert later.state == "running"


def test_barrier_counts_failed_and_cancelled_tasks_as_final() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c")
    submit(s, a, b, c)
    barrier(s, "t")
    assert take(s) is a
    assert ("barrier", "t") not in cancel(s, c)
    assert ("barrier", "t") in finish(s, a, error=ValueError())


def test_a_dropped_barrier_is_forgotten_and_never_fires() -> None:
    """A cancelled ``waitall`` drops its barrier: it held its token while any older task ran."""
    s = make()
    a = task("a")
    submit(s, a)
    tokens = [object() for _ in range(3)]
    for token in tokens:
        barrier(s, token)
    assert s.waiting_barriers == 3
    s.drop_barrier(tokens[1])
    assert s.waiting_barriers == 2
    take_all(s)
    fired = [t for kind, t in finish(s, a) if kind == "barrier"]
    assert fired == [tokens[0], tokens[2]]
    assert s.waiting_barriers == 0
    s.validate()


def test_two_barriers_fire_in_their_own_time() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    barrier(s, "first")
    b = task("b")
    submit(s, b)
    barrier(s, "second")
    take_all(s)
    out = finish(s, b)
    assert ("barrier", "first") not in out and ("barrier", "second") not in out
    out = finish(s, a)
    assert ("barrier", "first") in out and ("barrier", "second") in out


# -- stopping -----------------------------------------------------------------------------------


def test_cancel_pending_stops_queued_and_future_work() -> None:
    s = make(max_pending=4)
    running = task("running")
    submit(s, running)
    assert take(s) is running
    ready = task("ready")
    waiting = task("waiting", deps=(running,))
    hazard = task("hazard", buffers=(R(1),))
    submit(s, ready, waiting, hazard)
    queued = task("queued")
    assert s.submit(queued) is False
    s.enqueue(queued, "tok")
    tokens = s.cancel_pending()
    s.validate()
    assert tokens == ["tok"]
    assert ready.state == hazard.state == queued.state == "cancelled"
    assert waiting.state == "waiting"
    assert running.state == "running"
    out = finish(s, running, value=1)
    assert runs(out) == []
    assert running.state == "done"
    assert waiting.state == "cancelled"  # became ready while stopping: cancelled, not run
    assert s.pending == 0
    assert take_all(s) == []


# -- staging (the runtime's batched hand-off) ----------------------------------------------------


def test_staged_tasks_are_hidden_from_take_until_published() -> None:
    s = make()
    a, b = task("a"), task("b")
    assert s.submit(a, stage=True) and s.submit(b, stage=True)
    s.validate()
    assert a.state == b.state == "ready"
    assert take(s) is None
    s.publish()
    s.validate()
    assert take_all(s) == [a, b]


def test_staged_and_queued_tasks_keep_priority_order_once_published() -> None:
    s = make()
    low = task("low", priority=0)
    high = task("high", priority=3)
    submit(s, low)
    assert s.submit(high, stage=True)
    s.publish()
    assert take_all(s) == [high, low]


def test_cancel_a_staged_task() -> None:
    s = make()
    a = task("a")
    child = task("child", deps=(a,))
    assert s.submit(a, stage=True) and s.submit(child, stage=True)
    cancel(s, a)
    assert a.state == child.state == "cancelled"
    s.publish()
    s.validate()
    assert take(s) is None


def test_claim_a_staged_task() -> None:
    s = make()
    a = task("a")
    assert s.submit(a, stage=True)
    assert s.claim(a)
    s.validate()
    assert a.state == "running"
    s.publish()
    assert take(s) is None
    assert s.claim(a) is False


def test_cancel_pending_cancels_staged_tasks() -> None:
    s = make()
    a = task("a")
    assert s.submit(a, stage=True)
    assert s.cancel_pending() == []
    s.validate()
    assert a.state == "cancelled"
    assert resolved(s.drain()) == [a]
    s.publish()
    assert take(s) is None


# -- check mode -------------------------------------------------------------------------------------


def test_illegal_transition_raises_in_check_mode() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    with pytest.raises(AssertionError, match="illegal transition"):
        s.finish(a, value=1)  # finishing a task that never started


def test_finishing_twice_raises_in_check_mode() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    take(s)
    finish(s, a, value=1)
    with pytest.raises(AssertionError):  # from the transition check, or at the latest from validate()
        s.finish(a, value=2)
        s.validate()


def test_tasks_without_watchers_resolve_silently() -> None:
    s = make()
    a = Task(name="quiet")
    submit(s, a)
    take(s)
    assert finish(s, a, value=1) == []
    assert a.state == "done"


def test_final_task_lets_go_of_its_arguments() -> None:
    s = make()
    payload = object()
    a = task("a", args=(payload,), kwargs={"x": payload}, buffers=(R(1),))
    submit(s, a)
    take(s)
    finish(s, a, value=1)
    assert a.args == () and not a.kwargs and a.buffers == ()


def test_stats_counters() -> None:
    s = make()
    ok, bad, child, gone = task("ok"), task("bad"), None, task("gone")
    child = task("child", deps=(bad,))
    submit(s, ok, bad, child, gone)
    cancel(s, gone)
    take_all(s)
    finish(s, ok, value=1)
    finish(s, bad, error=ValueError())
    assert (s.submitted, s.completed, s.failed, s.cancelled, s.pending, s.running) == (4, 1, 2, 1, 0, 0)


# -- purity ---------------------------------------------------------------------------------------------

FORBIDDEN = {"threading", "asyncio", "numpy", "cupy", "concurrent", "anyio", "multiprocessing", "dask"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_no_threads_event_loop_or_arrays() -> None:
    core = Path(sys.modules[Scheduler.__module__].__file__ or "").parent
    files = sorted(core.glob("*.py"))
    assert files
    for path in files:
        bad = _imports(path) & FORBIDDEN
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_core_imports_nothing_from_higher_layers() -> None:
    core = Path(sys.modules[Scheduler.__module__].__file__ or "").parent
    for path in sorted(core.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert node.module == "_errors", f"{path.name} imports ..{node.module}"
