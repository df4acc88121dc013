"""``TaskCancelled``, apart from the other errors: its bases import asyncio, which ``import schedsvc`` does
not (``_errors`` gives it on first use)."""

from __future__ import annotations

import asyncio
import concurrent.futures

from ._errors import SchedsvcError

__all__ = ["TaskCancelled"]


class TaskCancelled(SchedsvcError, asyncio.CancelledError, concurrent.futures.CancelledError):
    """The task was cancelled: what ``await fut``, ``fut.result()`` and ``fut.exception()`` raise for it.

    One error for every way of reading a cancelled task, under asyncio and trio
    alike.  It is an ``asyncio.CancelledError`` (an asyncio task that lets it
    through ends cancelled, as when it awaits a cancelled ``asyncio.Future``)
    and a ``concurrent.futures.CancelledError`` (what threads and executors
    expect).  The cancellation of the awaiting coroutine itself is the async
    library's own (``asyncio.CancelledError``, ``trio.Cancelled``), never this.
    """
