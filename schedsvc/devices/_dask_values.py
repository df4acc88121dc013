"""Values that stay on the cluster until asked for, and the batched fetch that brings them here.

A finished task's value is a ``DaskValue``: a ``Remote`` holding its Dask
future.  Dependents on the cluster take the future itself, so the data moves
only between workers; the value comes to this process only when the schedsvc
Future is awaited (or ``result()`` is called), and is then kept.  The values
asked for in one turn of the loop (``asyncio.gather`` over many futures) come
in one ``client.gather`` (``Fetcher``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._runtime import Remote
from ._dask_cluster import Client, DaskFuture

__all__ = ["DaskValue", "Fetcher"]


class DaskValue(Remote):
    """A finished task's value, held by the cluster as a Dask future."""

    __slots__ = ("fetcher",)

    handle: DaskFuture

    def __init__(self, handle: DaskFuture, fetcher: Fetcher) -> None:
        super().__init__(handle)
        self.fetcher = fetcher

    async def _fetch(self) -> Any:
        return await self.fetcher.fetch(self.handle)

    def _fetch_blocking(self, timeout: float | None) -> Any:
        loop = self.handle.client.loop.asyncio_loop
        return asyncio.run_coroutine_threadsafe(self._fetch(), loop).result(timeout)


class Fetcher:
    """Brings values here: the fetches asked for in one turn of the loop go in one ``client.gather``.

    ``await asyncio.gather(*futures)`` over many results then costs one round
    trip to the cluster, not one per result.  A fetch asked for alone is one
    gather of one key, as before.
    """

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.asked: list[tuple[DaskFuture, asyncio.Future[Any]]] = []
        self._jobs: set[asyncio.Task[None]] = set()

    def fetch(self, dfut: DaskFuture) -> asyncio.Future[Any]:
        """(On the loop) the value of ``dfut``, gathered with the others asked for in this turn."""
        waiter = self.loop.create_future()
        if not self.asked:  # the first of this turn: gather after the callbacks already queued
            self.loop.call_soon(self._flush)
        self.asked.append((dfut, waiter))
        return waiter

    def _flush(self) -> None:
        batch, self.asked = self.asked, []
        job = self.loop.create_task(self._gather(batch))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _gather(self, batch: list[tuple[DaskFuture, asyncio.Future[Any]]]) -> None:
        batch = [(dfut, waiter) for dfut, waiter in batch if not waiter.done()]  # not given up on
        if not batch:
            return
        try:
            values = await self.client.gather([dfut for dfut, _ in batch])
        except BaseException:  # also a CancelledError, which is not an Exception: only ours re-raises
            if _closing(batch):
                raise
            # a key could not be fetched (released, lost with its worker): each alone, with its own outcome
            for dfut, waiter in batch:
                try:
                    value = await dfut
                except BaseException as exc:
                    if _closing(batch):
                        raise
                    if not waiter.done():
                        waiter.set_exception(exc)
                else:
                    if not waiter.done():
                        waiter.set_result(value)
            return
        for (_, waiter), value in zip(batch, values, strict=True):
            if not waiter.done():
                waiter.set_result(value)


def _closing(batch: list[tuple[DaskFuture, asyncio.Future[Any]]]) -> bool:
    """Is this fetch job itself being cancelled (the loop closes)?  Then its waiters are cancelled too."""
    task = asyncio.current_task()
    if task is None or not task.cancelling():
        return False
    for _, waiter in batch:
        waiter.cancel()
    return True
