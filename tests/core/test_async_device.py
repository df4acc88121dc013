"""Asynchronous devices (launch, then complete) and per-device byte budgets, event by event.

A fake asynchronous device: the test plays its executor, taking a task (running), launching it
(``launch``: its work is queued on the device) and reporting its completion (``complete``).
"""

from __future__ import annotations

from typing import Any

import pytest

from schedsvc import DependencyError, MemoryLimitError
from schedsvc._core import Scheduler, Task

from .helpers import BIG, R, W, out_of, resolved

GPU, GPU1 = "cuda:0", "cuda:1"


def make(
    *,
    max_pending: int = 1000,
    max_pending_bytes: int = BIG,
    device_bytes: dict[str, int] | None = None,
) -> Scheduler:
    return Scheduler(
        max_pending=max_pending,
        max_pending_bytes=max_pending_bytes,
        devices=("cpu", GPU, GPU1),
        asynchronous=(GPU, GPU1),
        device_bytes=device_bytes,
        check=True,
    )


def task(name: str, device: str = GPU, **fields: Any) -> Task:
    t = Task(name=name, device=device, **fields)
    t.watchers = []
    return t


def submit(s: Scheduler, *tasks: Task) -> None:
    for t in tasks:
        assert s.submit(t), t
        s.validate()


def take(s: Scheduler, device: str = GPU) -> Task | None:
    t = s.take(device)
    s.validate()
    return t


def take_all(s: Scheduler, device: str = GPU) -> list[Task]:
    taken = []
    while (t := take(s, device)) is not None:
        taken.append(t)
    return taken


def launch(s: Scheduler, t: Task, chain: bool = False) -> list[tuple[str, Any]]:
    """Launch ``t`` (``chain``: as a device that launches what it makes ready itself, where it hands on
    nothing): what it produced."""
    assert s.launch(t, chain) is None
    s.validate()
    return out_of(s)


def complete(
    s: Scheduler, t: Task, value: Any = None, error: BaseException | None = None
) -> list[tuple[str, Any]]:
    s.complete(t, value, error)
    return out_of(s)


def run(s: Scheduler, t: Task, value: Any = None) -> list[tuple[str, Any]]:
    """Take ``t`` (it must be next on its device), launch it and complete it: what completing it gave."""
    assert take(s, t.device) is t
    launch(s, t)
    return complete(s, t, value)


# -- construction --------------------------------------------------------------------------------


def test_unknown_asynchronous_or_budgeted_device_is_refused() -> None:
    with pytest.raises(ValueError, match="cuda:9"):
        Scheduler(max_pending=1, max_pending_bytes=1, devices=("cpu",), asynchronous=("cuda:9",))
    with pytest.raises(ValueError, match="cuda:9"):
        Scheduler(max_pending=1, max_pending_bytes=1, devices=("cpu",), device_bytes={"cuda:9": 1})


# -- two completion points ---------------------------------------------------------------------------


def test_a_chain_on_one_device_becomes_ready_launch_by_launch() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    submit(s, a, b, c)
    assert take(s) is a
    assert b.state == "waiting"  # not before a is launched
    assert launch(s, a) == []
    assert a.state == "launched" and b.state == "ready" and c.state == "waiting"
    assert (s.running, s.launched, s.pending) == (0, 1, 3)
    assert take(s) is b
    launch(s, b)
    assert c.state == "ready"
    assert take(s) is c
    launch(s, c)
    assert resolved(complete(s, a, 1)) == [a]
    assert a.state == "done" and a.value == 1 and s.pending == 2
    assert resolved(complete(s, b, 2)) == [b]
    assert resolved(complete(s, c, 3)) == [c]
    assert s.pending == 0 and s.launched == 0 and s.completed == 3


def test_a_chained_launch_hands_on_the_dependent_it_made_ready_running_with_no_queue_hand_off() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    on_cpu = task("on_cpu", device="cpu", deps=(a,))
    submit(s, a, b, c, on_cpu)
    assert take(s) is a
    assert s.launch(a, chain=True) is b
    s.validate()
    assert b.state == "running" and s.running == 1 and take(s) is None  # the device's to launch now
    assert on_cpu.state == "waiting"  # elsewhere: it waits for a to complete
    assert s.launch(b, chain=True) is c
    assert s.launch(c, chain=True) is None  # nothing behind it
    s.validate()
    for t, value in ((a, 1), (b, 2), (c, 3)):
        assert resolved(complete(s, t, value)) == [t]
    assert s.pending == 1 and take(s, "cpu") is on_cpu  # ready once a completed


def test_a_chained_launch_hands_on_one_dependent_and_queues_the_others() -> None:
    s = make()
    a = task("a")
    first, second = task("first", deps=(a,)), task("second", deps=(a,))
    submit(s, a, first, second)
    assert take(s) is a
    assert s.launch(a, chain=True) is first
    s.validate()
    assert second.state == "ready" and take(s) is second


def test_dependents_on_the_cpu_or_another_device_wait_for_completion() -> None:
    s = make()
    a = task("a")
    on_cpu = task("on_cpu", device="cpu", deps=(a,))
    other = task("other", device=GPU1, deps=(a,))
    same = task("same", deps=(a,))
    submit(s, a, on_cpu, other, same)
    assert take(s) is a
    launch(s, a)
    assert same.state == "ready"
    assert on_cpu.state == other.state == "waiting"
    complete(s, a, 1)
    assert on_cpu.state == other.state == "ready"
    assert take(s, "cpu") is on_cpu and take(s, GPU1) is other


def test_a_task_submitted_after_its_parent_launched_is_ready_at_once_on_the_same_device_only() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    assert take(s) is a
    launch(s, a)
    same, on_cpu = task("same", deps=(a,)), task("on_cpu", device="cpu", deps=(a,))
    submit(s, same, on_cpu)
    assert same.state == "ready" and on_cpu.state == "waiting"
    complete(s, a)
    assert on_cpu.state == "ready"


def test_write_after_write_on_one_device_is_ready_at_launch_and_a_cpu_reader_waits_for_completion() -> None:
    s = make()
    w1, w2 = task("w1", buffers=(W(1),)), task("w2", buffers=(W(1),))
    r = task("r", device="cpu", buffers=(R(1),))
    submit(s, w1, w2, r)
    assert take(s) is w1
    assert w2.state == "waiting"
    launch(s, w1)
    assert w2.state == "ready"
    assert take(s) is w2
    launch(s, w2)
    assert r.state == "waiting"
    complete(s, w1)
    assert r.state == "waiting"  # its writer w2 has not completed
    complete(s, w2)
    assert r.state == "ready"


def test_a_reader_launched_behind_a_writer_keeps_a_later_cpu_writer_waiting() -> None:
    s = make()
    w = task("w", buffers=(W(1),))
    r = task("r", buffers=(R(1),))
    w_cpu = task("w_cpu", device="cpu", buffers=(W(1),))
    submit(s, w, r, w_cpu)
    assert take(s) is w
    launch(s, w)
    assert take(s) is r
    launch(s, r)
    complete(s, r)  # out of order: held until w completes
    assert r.state == "launched" and w_cpu.state == "waiting"
    complete(s, w)
    assert r.state == "done" and w_cpu.state == "ready"


def test_a_parent_that_fails_after_its_dependent_launched_fails_the_dependent_at_completion() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", device="cpu", deps=(b,))
    submit(s, a, b, c)
    assert take(s) is a
    launch(s, a)
    assert take(s) is b
    launch(s, b)
    boom = ValueError("boom")
    assert resolved(complete(s, a, error=boom)) == [a]
    assert b.state == "launched"  # its work is queued on the device: it ends when it completes
    out = complete(s, b, "garbage")
    assert set(resolved(out)) == {b, c}
    for t in (b, c):
        assert t.state == "failed" and isinstance(t.error, DependencyError)
        assert t.error.__cause__ is boom
    assert b.value is None
    assert "has no result" in str(b.error)
    assert s.pending == 0 and s.failed == 3


def test_a_ready_dependent_of_a_parent_that_fails_after_launch_fails_without_running() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    hazard = task("hazard", buffers=(R(1),))  # unrelated to a
    submit(s, a, b, hazard)
    assert take(s) is a
    launch(s, a)
    assert b.state == "ready"
    boom = RuntimeError("kernel failed")
    out = complete(s, a, error=boom)
    assert resolved(out) == [a, b]
    assert b.state == "failed" and b.error.__cause__ is boom  # type: ignore[union-attr]
    assert take_all(s) == [hazard]
    assert s.pending == 1


def test_a_running_dependent_of_a_parent_that_fails_fails_even_if_it_reports_a_launch_failure() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    submit(s, a, b)
    assert take(s) is a
    launch(s, a)
    assert take(s) is b  # b's executor is launching it
    boom = ValueError("a")
    complete(s, a, error=boom)
    assert b.state == "running"
    s.finish(b, None, OSError("launch failed"))
    assert resolved(out_of(s)) == [b]
    assert isinstance(b.error, DependencyError) and b.error.__cause__ is boom


def test_out_of_order_completes_are_held_until_the_parents_complete() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    c = task("c", deps=(b,))
    submit(s, a, b, c)
    for t in (a, b, c):
        assert take(s) is t
        launch(s, t)
    assert complete(s, c, 3) == []  # held: b, which it was launched behind, has not completed
    assert complete(s, b, 2) == []
    assert b.state == c.state == "launched" and s.pending == 3
    out = complete(s, a, 1)
    assert resolved(out) == [a, b, c]
    assert (a.value, b.value, c.value) == (1, 2, 3)
    assert s.pending == 0 and s.launched == 0


def test_an_out_of_order_failure_is_reported_when_the_parent_completes() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    submit(s, a, b)
    for t in (a, b):
        assert take(s) is t
        launch(s, t)
    boom = ValueError("b")
    assert complete(s, b, error=boom) == []
    assert resolved(complete(s, a, 1)) == [a, b]
    assert b.state == "failed" and b.error is boom


def test_a_long_chain_completed_in_reverse_does_not_recurse() -> None:
    n = 5_000
    s = make(max_pending=n + 1)
    chain = [task("t0")]
    for i in range(1, n):
        chain.append(task(f"t{i}", deps=(chain[-1],)))
    for t in chain:
        assert s.submit(t)
    for t in chain:
        assert s.take(GPU) is t
        s.launch(t)
    for i, t in enumerate(reversed(chain)):
        s.complete(t, i)
    s.validate()
    assert all(t.state == "done" for t in chain)
    assert [t for _, t in s.drain()] == chain
    assert s.pending == 0


def test_a_task_that_fails_while_launching_behind_a_launched_parent_keeps_its_place() -> None:
    s = make()
    w1 = task("w1", buffers=(W(1),))
    w2 = task("w2", buffers=(W(1),))
    r = task("r", device="cpu", buffers=(R(1),))
    submit(s, w1, w2, r)
    assert take(s) is w1
    launch(s, w1)
    assert take(s) is w2
    boom = OSError("launch failed")
    assert s.finish(w2, None, boom) is None
    assert resolved(out_of(s)) == [w2]
    assert w2.state == "failed" and w2.error is boom
    assert r.state == "waiting"  # w1, which writes what r reads, is still queued on the device
    complete(s, w1)
    assert r.state == "ready"


def test_a_launched_task_cannot_be_cancelled() -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    submit(s, a, b)
    assert take(s) is a
    launch(s, a)
    assert s.cancel(a) is False
    assert a.state == "launched"
    assert s.cancel(b)  # ready behind a: cancelled, keeps its place until a completes
    s.validate()
    assert b.state == "cancelled" and s.pending == 2
    complete(s, a)
    assert s.pending == 0


def test_a_barrier_counts_a_launched_task_until_it_completes() -> None:
    s = make()
    a = task("a")
    submit(s, a)
    s.barrier("t")
    assert take(s) is a
    assert launch(s, a) == []
    assert complete(s, a) == [("resolve", a), ("barrier", "t")]


def test_a_launched_task_holds_its_max_pending_slot_and_bytes_until_it_completes() -> None:
    s = make(max_pending=1, max_pending_bytes=100)
    a = task("a", nbytes=60)
    submit(s, a)
    assert take(s) is a
    launch(s, a)
    b = task("b")
    assert s.submit(b) is False
    s.enqueue(b, "b")
    assert out_of(s) == [] and s.pending_bytes == 60
    assert complete(s, a) == [("resolve", a), ("admitted", "b")]
    assert s.pending_bytes == 0


@pytest.mark.parametrize("chain", [False, True])
def test_dependents_made_ready_by_a_launch_go_by_priority(chain: bool) -> None:
    s = make()
    a = task("a", priority=2)
    low = task("low", deps=(a,), priority=0)
    high = task("high", deps=(a,), priority=5)
    queued = task("queued", priority=1)
    submit(s, a, low, high, queued)
    assert take(s) is a
    launch(s, a, chain)  # chained: low, made ready first, is outranked: not handed on
    assert take_all(s) == [high, queued, low]


@pytest.mark.parametrize("chain", [False, True])
def test_a_staged_dependent_made_ready_by_a_launch_waits_for_publish(chain: bool) -> None:
    s = make()
    a = task("a")
    submit(s, a)
    assert take(s) is a
    b = task("b", deps=(a,))
    assert s.submit(b, stage=True)
    launch(s, a, chain)  # chained: a staged dependent is not handed on
    assert b.state == "ready" and take(s) is None
    s.publish()
    s.validate()
    assert take(s) is b


@pytest.mark.parametrize("chain", [False, True])
def test_cancel_pending_cancels_what_a_launch_makes_ready(chain: bool) -> None:
    s = make()
    a = task("a")
    b = task("b", deps=(a,))
    submit(s, a, b)
    assert take(s) is a
    assert s.cancel_pending() == []
    launch(s, a, chain)  # chained: a cancelled dependent is not handed on
    assert b.state == "cancelled" and take(s) is None
    complete(s, a, 1)
    assert a.state == "done" and s.pending == 0


def test_finish_cancelled_of_a_task_made_ready_behind_a_launched_parent() -> None:
    s = make()
    a, b = task("a"), task("b", buffers=(W(1),))
    b.deps = (a,)
    r = task("r", device="cpu", buffers=(R(1),))
    submit(s, a, b, r)
    assert take(s) is a
    launch(s, a)
    assert take(s) is b
    s.finish_cancelled(b)
    s.validate()
    assert b.state == "cancelled" and r.state == "waiting"
    complete(s, a)
    assert r.state == "ready"


# -- per-device byte budgets ---------------------------------------------------------------------


def test_a_task_is_admitted_only_if_it_fits_its_device_budget() -> None:
    s = make(device_bytes={GPU: 100})
    a = task("a", nbytes=60)
    b = task("b", nbytes=50)
    on_cpu = task("on_cpu", device="cpu", nbytes=500)  # the cpu has no budget
    submit(s, a, on_cpu)
    assert s.device_pending_bytes(GPU) == 60 and s.device_pending_bytes("cpu") == 500
    assert s.fits(b) is False and s.submit(b) is False
    assert take(s) is a
    launch(s, a)
    assert s.submit(b) is False  # launched: still holds its bytes
    complete(s, a)
    assert s.device_pending_bytes(GPU) == 0
    assert s.submit(b)
    assert s.device_peak_bytes(GPU) == 60
    s.validate()


def test_a_task_that_does_not_fit_its_device_blocks_the_admission_queue() -> None:
    s = make(device_bytes={GPU: 100})
    a = task("a", nbytes=80)
    big = task("big", nbytes=40)
    small_cpu = task("small_cpu", device="cpu")
    submit(s, a)
    s.enqueue(big, "big")
    assert s.submit(small_cpu) is False  # FIFO: behind big, although it would fit
    s.enqueue(small_cpu, "small_cpu")
    assert out_of(s) == []
    assert [x[1] for x in run(s, a) if x[0] == "admitted"] == ["big", "small_cpu"]


def test_a_task_larger_than_its_device_budget_raises_naming_the_device() -> None:
    s = make(device_bytes={GPU: 100})
    t = task("huge", buffers=(R(1, 90),), nbytes=20)
    with pytest.raises(MemoryLimitError) as info:
        s.submit(t)
    message = str(info.value)
    assert "110" in message and "100" in message and GPU in message and "max_device_bytes" in message
    assert t.state == "new" and s.pending == 0
    assert s.submit(task("fine_on_cpu", device="cpu", buffers=(R(2, 90),), nbytes=20))
    s.validate()


def test_two_devices_have_separate_budgets_and_buffers_count_for_the_device_that_brought_them() -> None:
    s = make(device_bytes={GPU: 100, GPU1: 80})
    a = task("a", buffers=(W(1, 40),))
    b = task("b", device=GPU1, buffers=(R(1, 40), W(2, 30)))  # buffer 1 is a's: only buffer 2 counts here
    c = task("c", device=GPU1, nbytes=60)
    submit(s, a, b)
    assert s.device_pending_bytes(GPU) == 40 and s.device_pending_bytes(GPU1) == 30
    assert s.submit(c) is False  # 30 + 60 > 80 on cuda:1
    assert s.fits(task("d", nbytes=60))  # cuda:0 has room
    run(s, a)
    assert s.device_pending_bytes(GPU) == 40  # b still uses buffer 1, which a brought in
    run(s, b)
    assert s.device_pending_bytes(GPU) == s.device_pending_bytes(GPU1) == 0
    assert s.submit(c)
    s.validate()


def test_device_bytes_are_not_counted_without_a_budget() -> None:
    s = make()
    submit(s, task("a", nbytes=10, buffers=(R(1, 5),)))
    assert s.device_pending_bytes(GPU) == 0 and s.pending_bytes == 15


# -- what a budgeted device's memory holds (results user code references) ----------------------------


def test_memory_a_device_reports_counts_against_its_budget() -> None:
    s = make(device_bytes={GPU: 100})
    s.device_used(GPU, 70)  # results referenced there
    busy = task("busy", nbytes=10)
    submit(s, busy)
    assert s.submit(task("over", nbytes=30)) is False  # 10 pending + 70 held + 30 > 100: it waits
    assert s.submit(task("fits", nbytes=20))  # 10 + 70 + 20 = 100
    assert s.submit(task("cpu_is_not_budgeted", device="cpu", nbytes=1000))
    s.validate()


def test_a_submission_only_dropped_results_could_make_room_for_raises_at_once() -> None:
    s = make(device_bytes={GPU: 100})
    s.device_used(GPU, 90)  # nothing unfinished on the device: nothing the engine runs frees it
    t = task("t", nbytes=20)
    for force in (False, True):  # operators, admitted over the limits, are refused too
        with pytest.raises(
            MemoryLimitError, match=r"still referenced there hold 90 of its max_device_bytes=100"
        ):
            s.submit(t, force)
        assert t.state == "new" and s.pending == 0
    s.device_used(GPU, 80)  # some were dropped
    assert s.submit(t)
    s.validate()


def test_a_waiter_kept_out_only_by_referenced_results_is_let_in_once_the_device_is_idle() -> None:
    """Waiting could not make room, and refusing it then would race a consumer about to drop its results:
    it is let in, and the device's allocator decides."""
    s = make(device_bytes={GPU: 100})
    a = task("a", nbytes=40)
    submit(s, a)
    s.device_used(GPU, 40)  # a's result, allocated
    late = task("late", nbytes=30)
    assert s.submit(late) is False  # 40 pending + 40 + 30 > 100, while a is in flight: it waits
    s.enqueue(late, "late")
    s.device_used(GPU, 80)  # a completed; its result and others are referenced
    assert [x[1] for x in run(s, a) if x[0] == "admitted"] == ["late"]
    s.validate()


def test_throttle_waits_while_a_busy_device_is_full_and_not_for_an_idle_one() -> None:
    s = make(device_bytes={GPU: 100})
    a = task("a", nbytes=60)
    submit(s, a)
    s.device_used(GPU, 40)
    assert not s.devices_have_room()
    s.enqueue(None, "throttle")
    assert [x[1] for x in run(s, a) if x[0] == "admitted"] == ["throttle"]  # idle now: let through
    s.device_used(GPU, 100)
    assert s.devices_have_room()  # idle and full: only dropping results frees it, nobody waits for that
