"""Ready queue of one device: higher priority first, FIFO within a priority."""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ._task import Task

__all__ = ["HELD", "ReadyQueue"]

#: a task's ``staged`` while it is held (``ReadyQueue.hold``): listed by its fusion only
HELD = -1


_state = attrgetter("state")
_staged = attrgetter("staged")


def _all_fit(like: deque[Task], limit: int, weight: Callable[[Task], int] | None) -> bool:
    """Are the tasks listed for a fusion all ready, and do their weights add up to at most ``limit``?"""
    if (len(like) if weight is None else sum(map(weight, like))) > limit:
        return False
    return list(map(_state, like)).count("ready") == len(like)


class ReadyQueue:
    """Tasks ready to run, bucketed by priority.

    A cancelled task stays in its bucket and is skipped when popped, so
    cancelling is O(1); ``count`` always counts ready tasks only.  Tasks with a
    ``fusion`` are also listed by it, in the order they became ready, for
    ``take_like`` (entries that left the ready state are dropped as it meets them).
    A *held* task (``hold``) is listed by its fusion only, in no bucket, and counted
    in ``held``, not ``count``: ``take_like`` takes it with the others of its fusion,
    and ``pop_held`` once no task of a bucket is ready.
    """

    __slots__ = ("_buckets", "_order", "count", "fusions", "held")

    def __init__(self) -> None:
        self._buckets: dict[int, deque[Task]] = {}
        self._order: list[int] = []  # negated priorities, ascending = highest first
        #: fusion -> its tasks, oldest first (read without a call: ``runs``)
        self.fusions: dict[Any, deque[Task]] = {}
        self.count = 0
        self.held = 0  # held tasks ready (``hold``): listed by their fusion only

    def push(self, task: Task) -> None:
        bucket = self._buckets.get(task.priority)
        if bucket is None:
            bucket = self._buckets[task.priority] = deque()
            insort(self._order, -task.priority)
        bucket.append(task)
        self.count += 1
        if task.fusion is not None:  # hot path: the one check a task without one pays
            self._list_like(task)

    def hold(self, task: Task) -> None:
        """List a ready task by its fusion only (its ``staged`` is ``HELD``)."""
        # (_list_like, inlined: every held call comes here, and the call would cost it about 30 ns)
        like = self.fusions.get(task.fusion)
        if like is None:
            like = self.fusions[task.fusion] = deque()
        like.append(task)
        self.held += 1

    def _list_like(self, task: Task) -> None:
        like = self.fusions.get(task.fusion)
        if like is None:
            like = self.fusions[task.fusion] = deque()
        like.append(task)

    def take_like(self, fusion: Any, limit: int, weight: Callable[[Task], int] | None = None) -> list[Task]:
        """Remove and return the ready tasks of ``fusion``, oldest first, while their weights (default 1
        each) add up to at most ``limit``; whatever their priority.  The caller moves them out of the
        ready state (they stay in their buckets, skipped when met, as a cancelled task is)."""
        like = self.fusions.get(fusion)
        taken: list[Task] = []
        held = 0
        if like and _all_fit(like, limit, weight):  # (a batch of calls: taken at once, not one step each)
            taken = list(like)
            like.clear()
            held = list(map(_staged, taken)).count(HELD)
        while like and limit > 0:
            task = like[0]
            if task.state != "ready":  # popped, claimed or cancelled since it was listed
                like.popleft()
                continue
            share = 1 if weight is None else weight(task)
            if share > limit:
                break
            like.popleft()
            limit -= share
            taken.append(task)
            if task.staged == HELD:
                held += 1
        if like is not None and not like:
            del self.fusions[fusion]
        if taken:
            self.held -= held
            self.count -= len(taken) - held
            if not self.count:
                self._clear()
        return taken

    def pop_held(self) -> Task | None:
        """Remove and return the oldest held task of the first fusion that has one, or None."""
        for fusion, like in self.fusions.items():
            while like:
                task = like.popleft()
                if task.state == "ready" and task.staged == HELD:
                    self.held -= 1
                    if not like:
                        del self.fusions[fusion]
                    return task
            del self.fusions[fusion]
            return self.pop_held()  # (the dict changed: look again)
        return None

    def discard_held(self) -> None:
        """Account for one held task that left the ready state (cancelled or claimed)."""
        self.held -= 1

    def pop(self) -> Task | None:
        """Remove and return the highest-priority ready task, or None."""
        while self.count:
            neg = self._order[0]
            bucket = self._buckets[-neg]
            while bucket:
                task = bucket.popleft()
                if task.state == "ready":
                    self.count -= 1
                    if not self.count:
                        self._clear()
                    elif not bucket:
                        self._drop(neg)
                    return task
            self._drop(neg)
        return None

    def runs(self) -> int:
        """How many workers the ready tasks can keep busy: the tasks of a fusion run as one (the worker that
        takes one takes the others), so they count once; at least one while any task is ready.  (A
        fusion's list may still hold tasks that left the ready state: then fewer are counted.)"""
        if not self.count and not self.held:
            return 0
        listed = sum(len(like) for like in self.fusions.values()) - self.held
        return max(1, self.count - listed + len(self.fusions))

    def top_priority(self) -> int | None:
        """The highest priority that holds a ready task, or None when empty."""
        while self.count:
            neg = self._order[0]
            bucket = self._buckets[-neg]
            while bucket and bucket[0].state != "ready":
                bucket.popleft()
            if bucket:
                return -neg
            self._drop(neg)
        return None

    def discard(self) -> None:
        """Account for one queued task that left the ready state (cancelled or claimed)."""
        self.count -= 1
        if not self.count:
            self._clear()

    def _clear(self) -> None:
        """No task of a bucket is ready: drop the stale entries (they hold finished tasks' values)."""
        self._buckets.clear()
        self._order.clear()
        if not self.held:
            self.fusions.clear()

    def tasks(self) -> list[Task]:
        """The ready tasks, in pop order, then the held ones (for validation, cancelling, and tests)."""
        ready = [t for neg in self._order for t in self._buckets[-neg] if t.state == "ready"]
        if self.held:
            ready += [
                t for like in self.fusions.values() for t in like if t.state == "ready" and t.staged == HELD
            ]
        return ready

    def like(self, fusion: Any) -> list[Task]:
        """The ready tasks of ``fusion``, oldest first (for validation and tests)."""
        return [t for t in self.fusions.get(fusion, ()) if t.state == "ready"]

    def _drop(self, neg: int) -> None:
        del self._buckets[-neg]
        self._order.pop(0)

    def __len__(self) -> int:
        return self.count + self.held
