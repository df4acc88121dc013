"""``take_like``: the worker that takes a task with a ``fusion`` also takes the other ready tasks of it.

Event by event, ``validate()`` after every step; no threads, no event loop.
"""

from __future__ import annotations

from typing import Any

from schedsvc._core import Scheduler, Task

from .helpers import BIG, R, W, out_of, resolved


class Fusable(Task):
    """A task that may run together with the other ready tasks of its ``fusion``."""

    __slots__ = ("fusion", "rows")

    def __init__(self, name: str, fusion: Any, rows: int = 1, **fields: Any) -> None:
        super().__init__(name=name, **fields)
        self.fusion = fusion
        self.rows = rows
        self.watchers = []


def make() -> Scheduler:
    return Scheduler(max_pending=1000, max_pending_bytes=BIG, devices=("cpu", "gpu"), check=True)


def submit(s: Scheduler, *tasks: Task) -> None:
    for t in tasks:
        assert s.submit(t), t
        assert out_of(s) == []


def take_like(s: Scheduler, fusion: Any, limit: int, device: str = "cpu", **kw: Any) -> list[Task]:
    taken = s.take_like(device, fusion, limit, **kw)
    assert out_of(s) == []
    assert all(t.state == "running" for t in taken)
    return taken


def rows_of(task: Task) -> int:
    assert isinstance(task, Fusable)
    return task.rows


def test_take_like_takes_the_ready_tasks_of_one_fusion_oldest_first() -> None:
    s = make()
    f, g = object(), object()
    a1, b1, a2, plain, a3 = (
        Fusable("a1", f),
        Fusable("b1", g),
        Fusable("a2", f),
        Task(name="p"),
        Fusable("a3", f),
    )
    submit(s, a1, b1, a2, plain, a3)
    first = s.take("cpu")
    assert first is a1
    assert take_like(s, f, 10) == [a2, a3]
    assert s.running == 3 and s.queues["cpu"].count == 2
    assert s.take("cpu") is b1  # the others keep their order
    assert s.take("cpu") is plain
    assert s.take("cpu") is None


def test_take_like_takes_a_whole_ready_listing_at_once_and_keeps_the_counts() -> None:
    for check in (True, False):  # (a checking core queues what it would hold)
        s = Scheduler(max_pending=1000, max_pending_bytes=BIG, devices=("cpu",), check=check)
        f = object()
        calls = [Fusable(f"c{i}", f, rows=2, buffers=(R(i),)) for i in range(3)]
        plain = Task(name="p")
        for call in calls:
            assert s.submit(call) if check else s.hold(call)
        assert s.submit(plain)
        queue = s.queues["cpu"]
        assert s.take_like("cpu", f, 6, weight=rows_of) == calls  # all of them: 6 rows fit 6
        assert all(c.state == "running" for c in calls)
        if check:
            s.validate()
        assert (queue.count, queue.held, queue.fusions) == (1, 0, {})
        assert s.running == 3 and s.take("cpu") is plain and s.take("cpu") is None


def test_take_like_stops_at_the_limit() -> None:
    s = make()
    f = object()
    tasks = [Fusable(f"a{i}", f) for i in range(5)]
    submit(s, *tasks)
    assert take_like(s, f, 2) == tasks[:2]
    assert take_like(s, f, 0) == []
    assert take_like(s, f, 10) == tasks[2:]
    assert take_like(s, f, 10) == []


def test_take_like_weighs_each_task_and_stops_at_the_first_that_does_not_fit() -> None:
    s = make()
    f = object()
    a, b, c = Fusable("a", f, rows=3), Fusable("b", f, rows=4), Fusable("c", f, rows=1)
    submit(s, a, b, c)
    assert take_like(s, f, 6, weight=rows_of) == [a]  # b (4 rows) would make 7: it and c stay, in order
    assert take_like(s, f, 6, weight=rows_of) == [b, c]


def test_take_like_skips_tasks_that_left_the_ready_state() -> None:
    s = make()
    f = object()
    a, b, c, d = (Fusable(n, f) for n in "abcd")
    submit(s, a, b, c, d)
    assert s.take("cpu") is a  # taken the ordinary way: its entry is stale
    assert s.claim(c)  # claimed by a thread that waits on it
    assert s.cancel(b)
    out_of(s)
    assert take_like(s, f, 10) == [d]


def test_take_like_sees_only_ready_tasks_of_its_device() -> None:
    s = make()
    f = object()
    writer = Task(name="writer", buffers=(W(1),))
    waiting = Fusable("waiting", f, buffers=(W(1),))  # ordered after the writer
    other = Fusable("other", f, device="gpu")
    ready = Fusable("ready", f)
    submit(s, writer, waiting, other, ready)
    assert take_like(s, f, 10) == [ready]
    assert waiting.state == "waiting" and other.state == "ready"
    assert take_like(s, f, 10, device="gpu") == [other]


def test_tasks_taken_together_finish_one_by_one_and_release_their_dependents() -> None:
    s = make()
    f = object()
    a, b = Fusable("a", f, buffers=(W(1),)), Fusable("b", f, buffers=(W(2),))
    after_a, after_b = Task(name="after a", deps=(a,)), Task(name="after b", deps=(b,))
    submit(s, a, b, after_a, after_b)
    assert s.take("cpu") is a
    assert take_like(s, f, 10) == [b]
    assert s.finish(a, "A", None, chain=False) is None
    out_of(s)
    assert after_a.state == "ready"
    s.finish(b, None, ValueError("b alone"), chain=False)
    out_of(s)
    assert (a.state, b.state, after_b.state) == ("done", "failed", "failed")
    assert s.take("cpu") is after_a


def test_the_listing_of_a_fusion_is_dropped_once_nothing_is_ready() -> None:
    s = make()
    f = object()
    a = Fusable("a", f)
    submit(s, a)
    assert s.take("cpu") is a
    assert s.queues["cpu"].fusions == {}  # (the queue emptied: its stale entries went with it)
    s.finish(a, None, None, chain=False)
    out_of(s)
    assert take_like(s, f, 10) == []


# -- held tasks: listed by their fusion only ------------------------------------------------------------


def reader(name: str, fusion: Any, key: int, nbytes: int = 8) -> Fusable:
    return Fusable(name, fusion, buffers=((key, nbytes, False),), nbytes=4)


def test_held_tasks_are_counted_and_taken_with_their_fusion_or_alone_once_nothing_else_is_ready() -> None:
    s = Scheduler(max_pending=1000, max_pending_bytes=BIG)
    f = object()
    h1, h2, h3 = reader("h1", f, 1), reader("h2", f, 2), reader("h3", f, 3)
    plain = Task(name="p")
    assert s.hold(h1) and s.hold(h2)
    assert s.submit(plain)
    assert s.hold(h3)
    queue = s.queues["cpu"]
    assert (queue.count, queue.held, len(queue), s.ready_count("cpu")) == (1, 3, 4, 4)
    assert [t.seq for t in (h1, h2, plain, h3)] == [1, 2, 3, 4]
    assert s.pending == 4 and s.pending_bytes == 3 * (4 + 8) and s.submitted == 4
    assert s.take("cpu") is plain  # a queued task first: held ones wait for a worker of their fusion
    first = s.take("cpu")
    assert first is h1 and first.state == "running"
    assert s.take_like("cpu", f, 10) == [h2, h3]
    assert queue.held == 0 and queue.count == 0 and s.take("cpu") is None
    for t in (plain, h1, h2, h3):
        s.finish(t, 0, None, False)
    assert s.pending == 0 and s.pending_bytes == 0 and s.completed == 4


def test_a_held_task_cancelled_or_cancelled_at_close_leaves_the_counts_right() -> None:
    s = Scheduler(max_pending=1000, max_pending_bytes=BIG)
    f = object()
    h1, h2, h3 = reader("h1", f, 1), reader("h2", f, 2), reader("h3", f, 3)
    for t in (h1, h2, h3):
        assert s.hold(t)
    assert s.cancel(h2) and h2.state == "cancelled"
    queue = s.queues["cpu"]
    assert queue.held == 2 and queue.tasks() == [h1, h3]
    assert s.claim(h3) and h3.state == "running" and queue.held == 1  # (a thread runs the call it waits for)
    s.cancel_pending()
    assert h1.state == "cancelled" and queue.held == 0 and s.take("cpu") is None
    s.finish(h3, 0, None, False)
    assert s.pending == 0 and s.pending_bytes == 0 and (s.completed, s.cancelled) == (1, 2)


def test_a_task_is_not_held_where_submit_would_do_more() -> None:
    s = Scheduler(max_pending=2, max_pending_bytes=100)
    f = object()
    writer = Task(name="w", buffers=((7, 8, True),))
    assert s.submit(writer)
    assert not s.hold(reader("after-a-write", f, 7))  # it must wait for the write: submit orders it
    assert not s.hold(reader("too-big", f, 8, nbytes=200))  # over max_pending_bytes: submit refuses
    assert s.hold(reader("fits", f, 9))
    assert not s.hold(reader("over", f, 10))  # max_pending=2
    assert s.pending == 2
    checked = Scheduler(max_pending=10, max_pending_bytes=BIG, check=True)
    assert not checked.hold(reader("checked", f, 1))  # check mode keeps books a held task would skip
    assert checked.pending == 0


def test_a_write_after_a_held_read_waits_for_it() -> None:
    s = Scheduler(max_pending=1000, max_pending_bytes=BIG)
    f = object()
    held = reader("read", f, 5)
    assert s.hold(held)
    write = Task(name="w", buffers=((5, 8, True),))
    assert s.submit(write) and write.state == "waiting"
    assert s.take("cpu") is held
    s.finish(held, 0, None, False)
    assert write.state == "ready" and s.take("cpu") is write


def finish_fused_batch(check: bool) -> tuple[Scheduler, list[Task], Task, Task]:
    """Six held calls of one fusion, taken together and finished with ``finish_all``: the first two read a
    buffer a writer then waits to write, the third raises, the fourth has a dependent, and the last two
    read one buffer and nothing follows them (the short way)."""
    s = Scheduler(max_pending=1000, max_pending_bytes=BIG, devices=("cpu",), check=check)
    f = object()
    calls = [Fusable(f"c{i}", f, buffers=(R(key, 100),)) for i, key in enumerate((1, 1, 2, 3, 4, 4))]
    for call in calls:
        call.out_bytes = 10
        if check:  # (a checking core holds nothing: it queues)
            assert s.submit(call)
        else:
            assert s.hold(call)
    writer = Task(name="writer", buffers=(W(1, 100),))
    after = Task(name="after", deps=(calls[3],))  # (its value: the fourth's)
    assert s.submit(writer) and s.submit(after)
    s.drain()
    assert writer.state == "waiting" and after.state == "waiting"
    first = s.take("cpu")
    assert first is calls[0]
    taken = [first, *s.take_like("cpu", f, 10)]
    assert taken == calls
    outcomes: list[tuple[Any, BaseException | None]] = [
        ("a", None),
        ("b", None),
        (None, ValueError("c")),
        ("d", None),
        ("e", None),
        ("f", None),
    ]
    assert s.finish_all(taken, outcomes) is None  # (the call with a dependent is not the last)
    return s, calls, writer, after


def test_calls_finished_together_end_as_each_would_alone() -> None:
    for check in (False, True):  # the short way for the common call, and finish() for any other
        s, calls, writer, after = finish_fused_batch(check)
        out = s.drain()
        assert [(c.state, c.value) for c in calls] == [
            ("done", "a"),
            ("done", "b"),
            ("failed", None),
            ("done", "d"),
            ("done", "e"),
            ("done", "f"),
        ]
        assert isinstance(calls[2].error, ValueError)
        assert resolved(out) == calls  # each caller is told, in order
        assert (s.completed, s.failed, s.running) == (5, 1, 0)
        assert writer.state == "ready" and after.state == "ready"  # the reads released, the value there
        assert s.pending == 2 and s.pending_bytes == 100  # the writer's and the dependent's, no more
        assert all(c.args == () and c.buffers == () and c.fn is None for c in calls)
        if check:
            s.validate()
