"""Backpressure, instrumented: admitted work never exceeds max_pending / max_pending_bytes, waiters are
served in FIFO order, memory stays bounded under a fast producer, and nothing deadlocks at the limits."""

from __future__ import annotations

import asyncio
import operator
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import TIMEOUT, Gate, occupied, started, state, within

MiB = 2**20


async def test_pending_never_exceeds_max_pending() -> None:
    limit = 4
    async with ss.Engine(cpu_workers=2, max_pending=limit) as eng:
        seen_in_tasks: list[int] = []
        seen_by_producer: list[int] = []
        lock = threading.Lock()
        inside = 0
        most_inside = 0
        release = threading.Event()

        def work(x: np.ndarray) -> float:
            nonlocal inside, most_inside
            assert release.wait(TIMEOUT)
            with lock:
                inside += 1
                most_inside = max(most_inside, inside)
            seen_in_tasks.append(eng.stats().pending)
            value = float(np.sqrt(x).sum())
            with lock:
                inside -= 1
            return value

        async def open_when_the_producer_blocks() -> None:
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            release.set()

        opener = asyncio.create_task(open_when_the_producer_blocks())
        futures = []
        for i in range(300):
            futures.append(await within(eng.submit(work, np.full(64, float(i)))))
            seen_by_producer.append(eng.stats().pending)
        await within(eng.waitall())
        await within(opener)
        assert max(seen_in_tasks) <= limit
        assert max(seen_by_producer) <= limit
        assert max(seen_by_producer) == limit  # the producer really ran into the limit
        assert most_inside <= 2
        assert all(f.done() and f.exception() is None for f in futures)
        assert eng.stats().completed == 300


async def test_submit_waits_while_full_and_resumes_when_room_appears() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2) as eng:
        async with occupied(eng, 2) as (gate, held):
            third = asyncio.create_task(eng.submit(operator.add, 1, 2))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            assert not third.done()
            assert eng.stats().pending == 2
            gate.open()
            fut = await within(third)
        assert await within(fut) == 3
        await within(asyncio.gather(*held))


async def test_submit_nowait_raises_queue_full_at_max_pending() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2) as eng:
        async with occupied(eng, 2):
            with pytest.raises(ss.QueueFull) as info:
                eng.submit_nowait(operator.add, 1, 1)
            assert isinstance(info.value, ss.SchedsvcError)
        assert await within(eng.run(operator.add, 1, 1)) == 2
        assert eng.stats().submitted == 3


async def test_submit_nowait_raises_queue_full_at_max_pending_bytes() -> None:
    async with ss.Engine(cpu_workers=1, max_pending_bytes=MiB) as eng:
        held_array = np.ones(MiB // 16)  # half the budget
        gate = Gate()
        held = eng.submit_nowait(lambda x: gate.hold()(), held_array)
        await gate.wait_started(1)
        eng.submit_nowait(np.sum, held_array)  # the same buffer again: no new bytes
        with pytest.raises(ss.QueueFull):
            eng.submit_nowait(np.sum, np.ones(MiB // 8 - 1))  # would exceed: 0.5 MiB + ~1 MiB
        with pytest.raises(ss.QueueFull):
            eng.submit_nowait(operator.add, 1, 1, nbytes=MiB // 2 + 1)  # a declared output counts too
        small = eng.submit_nowait(operator.add, 1, 1, nbytes=MiB // 4)
        gate.open()
        await within(asyncio.gather(held, small))


@pytest.mark.parametrize(
    "make",
    [bytes, bytearray, lambda n: memoryview(bytes(n)), lambda n: [bytes(n)]],
    ids=["bytes", "bytearray", "memoryview", "bytes in a list"],
)
async def test_byte_buffers_count_in_max_pending_bytes(make: Any) -> None:
    """Regression: a bytes argument was taken for a scalar and its size never counted, so a producer of
    bytes payloads held unbounded memory (bytearray and memoryview were counted)."""
    async with ss.Engine(cpu_workers=1, max_pending_bytes=1000) as eng:
        async with occupied(eng, 1):
            first = eng.submit_nowait(len, make(600))
            assert eng.stats().pending_bytes == 600
            with pytest.raises(ss.QueueFull):
                eng.submit_nowait(len, make(600))  # would exceed: 600 + 600
            with pytest.raises(ss.MemoryLimitError):
                eng.submit_nowait(len, make(1001))  # could never fit
        assert await within(first) == (1 if isinstance(make(0), list) else 600)


async def test_submit_nowait_from_another_thread_raises_queue_full() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng, occupied(eng, 1):
        with pytest.raises(ss.QueueFull):
            await within(asyncio.to_thread(eng.submit_nowait, operator.add, 1, 1))


async def test_waiting_submitters_are_admitted_in_fifo_order() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        admitted: list[int] = []
        executed: list[int] = []

        async def submitter(i: int) -> ss.Future[None]:
            fut = await eng.submit(executed.append, i)
            admitted.append(i)
            return fut

        async with occupied(eng, 1):
            tasks = []
            for i in range(6):
                tasks.append(asyncio.create_task(submitter(i)))
                await state(eng, lambda n=i + 1: eng.stats().waiting_admission == n)  # type: ignore[misc]
        futures = await within(asyncio.gather(*tasks))
        await within(asyncio.gather(*futures))
        assert admitted == list(range(6))
        assert executed == list(range(6))


async def test_fifo_holds_across_a_small_task_behind_a_big_one() -> None:
    """A waiter that would fit is not admitted ahead of an earlier one that does not yet."""
    async with ss.Engine(cpu_workers=1, max_pending_bytes=MiB) as eng:
        admitted: list[str] = []

        async def submitter(label: str, nbytes: int) -> ss.Future[Any]:
            fut = await eng.submit(operator.add, 1, 1, nbytes=nbytes)
            admitted.append(label)
            return fut

        async with occupied(eng, 1, nbytes=MiB // 2):
            big = asyncio.create_task(submitter("big", MiB // 2 + MiB // 4))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            small = asyncio.create_task(submitter("small", 1))
            await state(eng, lambda: eng.stats().waiting_admission == 2)
            with pytest.raises(ss.QueueFull):
                eng.submit_nowait(operator.add, 1, 1, nbytes=1)  # no jumping the queue either
            assert admitted == []
        await within(asyncio.gather(big, small))
        assert admitted == ["big", "small"]
        await within(eng.waitall())


async def test_task_larger_than_the_byte_limit_fails_with_memory_limit_error() -> None:
    async with ss.Engine(cpu_workers=1, max_pending_bytes=MiB) as eng:
        huge = np.ones(MiB // 4)  # 2 MiB
        with pytest.raises(ss.MemoryLimitError) as info:
            await within(eng.submit(np.sum, huge))
        message = str(info.value)
        assert str(huge.nbytes) in message
        assert str(MiB) in message
        assert isinstance(info.value, ss.SchedsvcError)
        with pytest.raises(ss.MemoryLimitError):
            eng.submit_nowait(np.sum, huge)
        with pytest.raises(ss.MemoryLimitError) as info:
            await within(eng.submit(operator.add, 1, 1, nbytes=3 * MiB))
        assert str(3 * MiB) in str(info.value)
        assert await within(eng.run(np.sum, np.ones(10))) == 10  # the engine keeps serving
        assert eng.stats().pending == 0


async def test_memory_limit_error_does_not_wait_even_when_the_engine_is_busy() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1, max_pending_bytes=MiB) as eng, occupied(eng, 1):
        with pytest.raises(ss.MemoryLimitError):
            await within(eng.submit(np.sum, np.ones(MiB // 4)))


async def test_bytes_stay_bounded_under_a_fast_producer() -> None:
    """40 batches of 1 MiB through max_pending_bytes=4 MiB: traced memory stays near the bound."""
    bound, batch_bytes, batches = 4 * MiB, MiB, 40
    async with ss.Engine(cpu_workers=2, max_pending_bytes=bound) as eng:
        release = threading.Event()

        def consume(batch: np.ndarray) -> float:
            assert release.wait(TIMEOUT)
            return float(batch[0])

        async def open_when_the_producer_blocks() -> None:
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            release.set()  # the producer is held at the limit: now let the consumers go

        opener = asyncio.create_task(open_when_the_producer_blocks())
        futures = []
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            for i in range(batches):
                batch = np.full(batch_bytes // 8, float(i))
                futures.append(await within(eng.submit(consume, batch)))
            del batch
            await within(eng.waitall())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await within(opener)
        assert [f.result() for f in futures] == [float(i) for i in range(batches)]
        stats = eng.stats()
        assert stats.peak_pending_bytes <= bound
        assert stats.peak_pending_bytes >= bound - batch_bytes  # the limit was reached
        slack = MiB // 2
        assert peak - base <= bound + batch_bytes + slack, f"peak {(peak - base) / MiB:.1f} MiB"


async def test_unbounded_producer_holds_more_than_the_bound() -> None:
    """The control for the test above: without a byte limit the same producer holds every batch."""
    async with ss.Engine(cpu_workers=1) as eng:
        async with occupied(eng, 1):
            futures = [eng.submit_nowait(np.sum, np.ones(MiB // 8)) for _ in range(8)]
            assert eng.stats().pending_bytes == 8 * MiB
        await within(asyncio.gather(*futures))


async def test_nested_submits_are_admitted_over_the_limit() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2) as eng:

        def outer(i: int) -> int:
            inner = [eng.submit_nowait(operator.mul, i, k) for k in range(3)]
            return sum(f.result(TIMEOUT) for f in inner)

        first = await within(eng.submit(outer, 1))
        second = await within(eng.submit(outer, 2))
        assert await within(asyncio.gather(first, second)) == [3, 6]


async def test_nested_submit_while_outside_submitters_wait() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        inner_submitted = threading.Event()
        go = threading.Event()

        def outer() -> int:
            assert go.wait(TIMEOUT)
            inner = eng.submit_nowait(operator.add, 20, 1)  # the engine is full and has a waiter
            inner_submitted.set()
            return inner.result(TIMEOUT) * 2

        first = await within(eng.submit(outer))
        waiting = asyncio.create_task(eng.submit(operator.add, 1, 1))
        await state(eng, lambda: eng.stats().waiting_admission == 1)
        go.set()
        assert await within(first) == 42
        assert inner_submitted.is_set()
        assert await within(await within(waiting)) == 2


async def test_cancelling_a_blocked_submitter_removes_it_from_the_queue() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        ran: list[str] = []
        async with occupied(eng, 1):
            doomed = asyncio.create_task(eng.submit(ran.append, "doomed"))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            behind = asyncio.create_task(eng.submit(ran.append, "behind"))
            await state(eng, lambda: eng.stats().waiting_admission == 2)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await within(doomed)
            assert eng.stats().waiting_admission == 1
        fut = await within(behind)
        await within(fut)
        await within(eng.waitall())
        assert ran == ["behind"]
        assert eng.stats().waiting_admission == 0


async def test_cancelling_a_blocked_throttle_removes_it_from_the_queue() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        async with occupied(eng, 1):
            waiter = asyncio.create_task(eng.throttle())
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await within(waiter)
            assert eng.stats().waiting_admission == 0
            behind = asyncio.create_task(eng.submit(operator.add, 2, 2))
            await state(eng, lambda: eng.stats().waiting_admission >= 1)
        fut = await within(behind)
        assert await within(fut) == 4
        await within(eng.waitall())
        assert eng.stats().waiting_admission == 0


async def test_throttle_keeps_a_producer_in_step() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=3) as eng:
        futures = []
        for i in range(100):
            await within(eng.throttle())
            assert eng.stats().pending < 3
            futures.append(eng.submit_nowait(operator.add, i, 1))  # throttle made room: no QueueFull
        assert await within(asyncio.gather(*futures)) == [i + 1 for i in range(100)]


# -- a cheap room check for load shedding ------------------------------------------------------------------


async def test_pending_and_has_room_follow_the_limits() -> None:
    eng = ss.Engine(cpu_workers=1, max_pending=2, max_pending_bytes=1000)
    assert eng.pending == 0 and eng.has_room() is False  # not started
    async with eng:
        assert eng.pending == 0 and eng.has_room() and eng.has_room(1000)
        assert eng.has_room(1001) is False  # could not fit with nothing pending either
        async with occupied(eng, 1):
            assert eng.pending == 1 and eng.has_room()
            held = eng.submit_nowait(np.copy, np.zeros(100, dtype=np.uint8))  # 100 bytes: 2 of 2 tasks
            assert eng.pending == 2 and eng.has_room() is False
            with pytest.raises(ss.QueueFull):
                eng.submit_nowait(operator.add, 1, 1)  # what has_room() said
        await within(held)
        await within(eng.waitall())
        assert eng.pending == 0 and eng.has_room(1000)
    assert eng.has_room() is False  # closed


async def test_has_room_is_false_while_a_submission_waits_ahead() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        async with occupied(eng, 1):
            waiter = asyncio.create_task(eng.submit(operator.add, 1, 1))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            assert eng.has_room() is False
        assert await within(await within(waiter)) == 2


@pytest.mark.parametrize("nbytes", [-1, 1.5, True, "10"])
async def test_has_room_refuses_a_size_that_is_not_bytes(nbytes: Any) -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        with pytest.raises(ss.InvalidTask, match="non-negative int"):
            eng.has_room(nbytes)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_closing_while_coroutines_wait_in_throttle_ends(anyio_backend: str) -> None:
    """Leaving ``async with`` while two or more coroutines waited in ``await eng.throttle()`` spun the loop
    for ever: the close looped on a barrier that returned without yielding, while the slot of a waiter let
    through is given back only once the loop runs (it now always yields)."""
    import anyio

    eng = await ss.Engine(cpu_workers=1, max_pending=1).start()
    passed = []

    async def waiter() -> None:
        await eng.throttle()
        passed.append(1)

    async with anyio.create_task_group() as group:
        gate = Gate()
        held = eng.submit_nowait(gate.hold())
        await gate.wait_started(1)
        for _ in range(3):
            group.start_soon(waiter)
        await state(eng, lambda: eng.stats().waiting_admission == 3)
        gate.open()
        with anyio.fail_after(TIMEOUT):
            await eng.aclose()
    assert held.done() and len(passed) == 3


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_waitall_given_up_leaves_no_barrier_behind(how: str) -> None:
    """Each cancelled or timed-out ``await eng.waitall()`` kept its barrier while an older task ran: 20,000 of
    them held 4.4 MiB."""
    async with started(cpu_workers=1) as eng, occupied(eng, 1):
        for _ in range(50):
            if how == "timeout":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0):
                        await eng.waitall()
            else:
                waiting = asyncio.ensure_future(eng.waitall())
                await asyncio.sleep(0)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
        assert eng._rt.core.waiting_barriers == 0
