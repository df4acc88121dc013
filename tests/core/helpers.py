"""What the core's tests share: reading instructions, and buffer entries by key."""

from __future__ import annotations

from typing import Any

from schedsvc._core import Scheduler, Task

BIG = 1 << 40


def out_of(s: Scheduler) -> list[tuple[str, Any]]:
    """The instructions the last event produced; checks the invariants first."""
    s.validate()
    return s.drain()


def resolved(out: list[tuple[str, Any]]) -> list[Task]:
    return [obj for kind, obj in out if kind == "resolve"]


def R(key: int, nbytes: int = 8) -> tuple[int, int, bool]:
    """A read of buffer ``key``."""
    return (key, nbytes, False)


def W(key: int, nbytes: int = 8) -> tuple[int, int, bool]:
    """A write of buffer ``key``."""
    return (key, nbytes, True)
