"""``eng.map``: an async generator that runs ``fn(item)`` as a task per item, a window at a time.

Two coroutines share one ``_Pipeline``.  The *feeder* (a background task of
its own on the engine's loop, ``Bridge.spawn``) takes a slot of the window, pulls the next item from the source, submits
``fn(item)`` through the engine's normal admission, and repeats; the
*consumer* (the generator body, running in whoever iterates it) hands the
results out and gives each slot back as it yields.  So the source is pulled
ahead, concurrently with the work and with the consumer, but never more than
``max_inflight`` items past what was yielded: a slow async source overlaps the
compute instead of adding to it, and memory stays bounded even when the
consumer is slow.

The feeder talks to the consumer through one queue of events, in the order
the consumer must see them: submitted futures (ordered) or finished ones (as
completed), then the end of the source or the error that stopped the feeder.
A background task rather than a task group: a cancel scope must not span the
``yield`` of a generator, so the feeder is cancelled and awaited explicitly
when the generator ends, however it ends.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from threading import get_ident
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._core import name_of
from ._errors import SchedsvcError, stop_through_await

if TYPE_CHECKING:
    from ._engine import Engine
    from ._future import Future
    from ._port import Port
    from ._runtime import Job

__all__ = ["pipeline"]

T = TypeVar("T")


class _End:
    """The feeder's last event when the source is exhausted."""


_END = _End()


class _Failure:
    """The feeder's last event when pulling or submitting raised: the consumer raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def pipeline(
    engine: Engine,
    port: Port,
    fn: Callable[..., T],
    source: Iterable[Any] | AsyncIterable[Any],
    max_inflight: int | None,
    ordered: bool,
    device: str | None,
    options: dict[str, Any],
) -> AsyncGenerator[T, None]:
    """Check the arguments now (not at the first ``__anext__``) and return the generator."""
    port.running()  # fn was checked by eng.map (check_fn)
    if type(ordered) is not bool:
        raise TypeError(
            f"eng.map(ordered=...) must be a bool (True: results in source order; False: as they finish), "
            f"got {type(ordered).__name__} {ordered!r}"
        )
    device = port.device(device)
    window = port.window(device) if max_inflight is None else _checked_window(max_inflight)
    items = _iterator(source)
    return _Pipeline(engine, fn, items, window, ordered, {"device": device, **options}).results()


def _checked_window(max_inflight: Any) -> int:
    if isinstance(max_inflight, bool) or not isinstance(max_inflight, int):
        raise TypeError(
            f"max_inflight must be an int >= 1 (tasks submitted and not yet yielded), "
            f"got {type(max_inflight).__name__} {max_inflight!r}"
        )
    if max_inflight < 1:
        raise ValueError(
            f"max_inflight must be >= 1 (tasks submitted and not yet yielded), got {max_inflight}; "
            "leave it out for twice the device's workers"
        )
    return max_inflight


def _iterator(source: Any) -> Iterator[Any] | AsyncIterator[Any]:
    if isinstance(source, AsyncIterable):
        return aiter(source)
    if isinstance(source, Iterable):
        return iter(source)
    raise TypeError(f"eng.map() needs an iterable or an async iterable of items, got {type(source).__name__}")


def _split(items: Iterator[Any] | AsyncIterator[Any]) -> tuple[AsyncIterator[Any] | None, Iterator[Any]]:
    """``(items, empty)`` for an async source, ``(None, items)`` for a sync one."""
    if isinstance(items, AsyncIterator):
        return items, iter(())
    return None, items


class _Pipeline(Generic[T]):
    """The state the feeder and the consumer of one ``eng.map`` share (both on the event loop)."""

    def __init__(
        self,
        engine: Engine,
        fn: Callable[..., T],
        items: Iterator[Any] | AsyncIterator[Any],
        window: int,
        ordered: bool,
        options: dict[str, Any],
    ) -> None:
        self.engine = engine
        self.fn = fn
        self.items = items
        self.window = window
        self.ordered = ordered
        self.options = options
        # submitted and not yet yielded, oldest first: what is cancelled if the consumer stops
        self.live: dict[Future[T], None] = {}
        self.ended = False  # the consumer has seen _END
        self.stopping = False  # the consumer has gone: the feeder submits nothing more
        self.feeder: Job | None = None
        self.slots: anyio.Semaphore
        self.events: MemoryObjectSendStream[Future[T] | _End | _Failure]
        self.received: MemoryObjectReceiveStream[Future[T] | _End | _Failure]

    # -- the consumer ------------------------------------------------------------

    async def results(self) -> AsyncGenerator[T, None]:
        """The generator ``eng.map`` returns: results in source order, or as they complete."""
        port = self.engine._port
        port.running()
        if get_ident() != port.loop_thread:  # its feeder runs on the engine's loop, sharing state with it
            raise SchedsvcError(
                f"eng.map({name_of(self.fn)}, ...) is iterated on an event loop other than the engine's "
                "(another thread's asyncio.run or trio.run); iterate it with 'async for' on the loop "
                "that runs 'async with ss.Engine()', or from other threads use eng.executor().map(...)"
            )
        self.slots = anyio.Semaphore(self.window)
        self.events, self.received = anyio.create_memory_object_stream(math.inf)
        # interruptible: Ctrl-C in the source (the caller's code) reaches the consumer, as on asyncio
        self.feeder = port.spawn(self.feed, f"eng.map feeder of {name_of(self.fn)}", interruptible=True)
        try:
            while (fut := await self.next_future()) is not None:
                try:
                    value = await fut  # raises the task's own exception at its place in the order
                except StopAsyncIteration as exc:  # this generator cannot raise it (PEP 479): say why
                    raise stop_through_await(fut, exc) from exc
                del self.live[fut]
                self.slots.release()  # before yielding: the feeder refills while the consumer works
                yield value
        finally:
            await self.stop()

    async def next_future(self) -> Future[T] | None:
        """The next future to yield (submitted, or finished if unordered); None at the end."""
        while not (self.ended and not self.live):
            try:  # anyio's receive() yields to the loop even when an event is there: only wait for one
                event = self.received.receive_nowait()
            except anyio.WouldBlock:
                event = await self.received.receive()
            if isinstance(event, _Failure):
                raise event.error
            if isinstance(event, _End):
                self.ended = True
                continue
            return event
        return None

    async def stop(self) -> None:
        """Cancel the feeder and every task not yet yielded that has not started."""
        self.stopping = True
        self.cancel_live()  # first: queued tasks must not start while the feeder winds down
        feeder = self.feeder
        if feeder is None:
            return
        try:
            # a source that swallows this cancellation hands the feeder an item; `stopping` makes it
            # drop that item and end, rather than submit it and wait for a slot that nobody will give
            # back.  The wait is shielded: a consumer cancelled by a trio scope still stops its feeder
            feeder.cancel()
            with anyio.CancelScope(shield=True):
                await feeder.wait()
        finally:
            self.cancel_live()
            self.events.close()
            self.received.close()
        if feeder.error is not None:
            raise feeder.error  # closing the source failed

    def cancel_live(self) -> None:
        for fut in list(self.live):
            fut.cancel()

    # -- the feeder --------------------------------------------------------------

    async def feed(self) -> None:
        """Pull and submit until the source ends; the last event says how it ended."""
        try:
            await self.submit_all()
        except Exception as exc:  # the source's or submit's error, delivered at its place in the order
            self.events.send_nowait(_Failure(exc))
        except BaseException as exc:  # cancelled (by the consumer, or by whoever cancelled us)
            self.events.send_nowait(_Failure(exc))
            raise
        else:
            self.events.send_nowait(_END)
        finally:
            await self.close_source()

    async def submit_all(self) -> None:
        engine, fn, options, live, events = self.engine, self.fn, self.options, self.live, self.events
        completed = self.completed
        async_items, sync_items = _split(self.items)
        while True:
            try:  # a slot before pulling: never hold an item we cannot submit (and, as above, no yield
                self.slots.acquire_nowait()  # to the loop when one is free)
            except anyio.WouldBlock:
                await self.slots.acquire()
            # a sync source is iterated on the loop, like any code of the caller's
            item = await anext(async_items, _END) if async_items is not None else next(sync_items, _END)
            if item is _END or self.stopping:
                return
            fut: Future[T] = await engine.submit(fn, item, **options)
            live[fut] = None
            if self.ordered:
                events.send_nowait(fut)
            else:
                fut.add_done_callback(completed)

    def completed(self, fut: Future[T]) -> None:
        """An unordered task is final (its done-callback): hand it to the consumer, unless the consumer has
        gone (a task still running when the generator closed finishes after its stream is closed)."""
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.events.send_nowait(fut)

    async def close_source(self) -> None:
        """A generator source left early (an error, a break, a cancel) runs its cleanup now."""
        items = self.items  # only generators: a file or another iterator object stays the caller's
        if isinstance(items, types.AsyncGeneratorType):
            await items.aclose()
        elif isinstance(items, types.GeneratorType):
            items.close()
