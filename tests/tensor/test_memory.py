"""Tensor memory: intermediates are dropped as a queued chain runs, byte accounting, and the throttle bound."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc.tensor import Tensor

from ..helpers import TIMEOUT, occupied, until, within

MIB = 2**20
N = MIB // 8  # float64 elements in 1 MiB


def alive(refs: list[weakref.ref[Tensor]], below: int | None = None) -> list[int]:
    """The chain steps (1-based) whose Tensor still exists, optionally only those before step ``below``."""
    steps = [i + 1 for i, ref in enumerate(refs) if ref() is not None]
    return steps if below is None else [s for s in steps if s < below]


async def collected(refs: list[weakref.ref[Tensor]], keep: list[int]) -> None:
    """Wait until, after a garbage collection, exactly the steps ``keep`` are alive.

    A worker still returning from the task it just finished may hold it for a moment after the awaited
    result arrived; this polls (bounded by TIMEOUT) instead of racing it.
    """
    await until(lambda: gc.collect() >= 0 and alive(refs) == keep)


@contextmanager
def gc_disabled() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


async def run_chain(
    eng: ss.Engine, steps: int, sample_every: int, collect: bool
) -> tuple[Tensor, list[weakref.ref[Tensor]], dict[int, list[int]]]:
    """``x = x + 1`` ``steps`` times on 1 MiB arrays, all queued behind a held first task.

    After step k (every ``sample_every``) a task that takes step k's value records which earlier steps are
    still alive (with ``collect``: after a garbage collection), while the rest of the chain is still queued.
    """
    gate = threading.Event()

    def first() -> np.ndarray:
        assert gate.wait(TIMEOUT), "the test never opened the gate"
        return np.zeros(N)

    x = eng.asarray(eng.submit_nowait(first), shape=(N,), dtype=np.float64)
    refs: list[weakref.ref[Tensor]] = []
    seen: dict[int, list[int]] = {}
    previous: ss.Future[Any] | None = None
    for step in range(1, steps + 1):
        x = x + 1
        refs.append(weakref.ref(x))
        if step % sample_every == 0:

            def sample(value: np.ndarray, _previous: Any, step: int = step) -> float:
                if collect:
                    gc.collect()
                seen[step] = alive(refs)
                return float(value[0])

            # each sample takes the previous one's result: an earlier sample, still running, would
            # rightly keep its own input alive
            previous = eng.submit_nowait(sample, x, previous)
    assert all(ref() is not None for ref in refs)  # nothing ran yet: the whole chain is queued
    gate.set()
    await within(eng.waitall())
    return x, refs, seen


async def test_chain_intermediates_are_not_held_by_the_engine() -> None:
    """While a queued chain of 200 ops runs, finished intermediates are garbage: at step k, no step < k-2
    is alive once collected, so the live set stays bounded (the not-yet-run tail, not the whole chain)."""
    async with ss.Engine(cpu_workers=2) as eng:
        final, refs, seen = await run_chain(eng, steps=200, sample_every=25, collect=True)
        assert sorted(seen) == list(range(25, 201, 25))
        for step, steps_alive in seen.items():
            assert [s for s in steps_alive if s < step - 2] == [], f"at step {step}"
            assert len(steps_alive) <= 200 - step + 3
        value = await within(final)
        assert value[0] == 200.0
        del value
        await collected(refs, [200])  # only the final tensor, held by the name `final`
        del final
        await collected(refs, [])
        assert eng.stats().pending_bytes == 0


async def test_chain_intermediates_are_freed_by_reference_counting() -> None:
    """No reference cycle keeps a Tensor: with the cycle collector off, intermediates still go at once.

    (Regression: a Tensor used to hold itself as the owner of its memory, so only gc freed it.)"""
    with gc_disabled():
        async with ss.Engine(cpu_workers=2) as eng:
            final, refs, seen = await run_chain(eng, steps=200, sample_every=50, collect=False)
            for step, steps_alive in seen.items():
                assert [s for s in steps_alive if s < step - 2] == [], f"at step {step}"
            del final
            await until(lambda: alive(refs) == [])


async def test_a_dropped_tensor_is_collectable() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        t = eng.asarray(np.ones(10)) * 2
        ref = weakref.ref(t)
        await within(t)
        del t
        await within(eng.waitall())
        await collected([ref], [])


async def test_a_pending_task_keeps_its_input_alive() -> None:
    """A tensor nobody names stays alive while a queued op still needs it, and goes once that op ran."""
    async with ss.Engine(cpu_workers=1) as eng:
        async with occupied(eng, 1):
            x = eng.asarray(np.ones(10)) + 1
            ref = weakref.ref(x)
            y = x * 3
            del x
            gc.collect()
            assert ref() is not None  # y's task, still queued, reads it
        np.testing.assert_array_equal(await within(y), np.full(10, 6.0))
        await collected([ref], [])


async def test_worker_does_not_pin_the_first_tensor_of_its_chain() -> None:
    """The worker that took a chain's first op from the ready queue does not keep it while running the rest.

    (Regression: the worker loop's local variable held that finished Tensor, and its buffer, to the end.)
    A held reader blocks the worker that ran the write, so the other worker takes ``z`` from the queue and
    runs the chain after it; a task inside that chain checks ``z`` is gone."""
    async with ss.Engine(cpu_workers=2) as eng:
        base = np.zeros(N)
        x = eng.asarray(base)
        held, release = threading.Event(), threading.Event()

        def write(out: np.ndarray) -> None:
            assert held.wait(TIMEOUT)
            out += 1

        def block(value: np.ndarray) -> None:
            assert release.wait(TIMEOUT)

        eng.submit_nowait(write, out=x)  # every task below waits for this write (RAW)
        blocker = eng.submit_nowait(block, x)  # made ready first: runs on the writer's worker, blocks it
        z = x + 1  # made ready second: queued, so the *other* worker takes it from the queue
        first_ref = weakref.ref(z)
        for _ in range(10):
            z = z + 1
        seen: list[bool] = []

        def sample(value: np.ndarray) -> float:
            gc.collect()
            seen.append(first_ref() is not None)
            return 0.0

        # the chain goes on only after the sample ran (z + c needs c), so the sample runs inside the chain
        c = eng.asarray(eng.submit_nowait(sample, z), shape=(), dtype=np.float64)
        z = z + c
        for _ in range(10):
            z = z + 1
        held.set()
        try:
            value = await within(z)
        finally:
            release.set()
        assert value[0] == 22.0
        await within(blocker)
        assert seen == [False], "the chain's first tensor was still alive in the middle of the chain"


# -- byte accounting ----------------------------------------------------------------------------------


async def test_pending_bytes_count_outputs_and_inputs_while_pending() -> None:
    """An op holds its output bytes plus its inputs' memory (each buffer once); a view has no output.

    (A result's memory is registered when a pending op first reads it, on top of its producer's output.)"""
    async with ss.Engine(cpu_workers=1) as eng:
        base = eng.stats().pending_bytes
        async with occupied(eng, 1):
            held = eng.stats().pending_bytes
            x = eng.asarray(np.ones(1000))  # already computed: no task, nothing pending
            assert eng.stats().pending_bytes == held
            y = x + 1  # 8000 out + 8000 in
            assert eng.stats().pending_bytes == held + 16_000
            z = y * y  # 8000 out + y's memory, once although read twice
            assert eng.stats().pending_bytes == held + 32_000
            v = z[1:]  # a view: no output, reads z's memory
            assert eng.stats().pending_bytes == held + 40_000
            s = v.sum()  # 8 bytes out; its input is z's memory, already held
            assert eng.stats().pending_bytes == held + 40_008
        assert await within(s) == 4.0 * 999
        await within(eng.waitall())
        assert eng.stats().pending_bytes == base == 0


async def test_pending_bytes_return_to_zero_after_every_kind_of_work() -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        a = np.arange(12.0)
        t = eng.asarray(a)
        u = (t.reshape(3, 4).T @ np.ones((3, 2))).sum(axis=0)
        t += 1
        t[0] = 5
        v = t[2:]
        v *= 2
        np.add(t, 1, out=t)
        w = eng.submit_nowait(np.multiply, t, 2)
        f = eng.asarray(w, shape=(12,), dtype=np.float64) - 1
        bad = eng.asarray(eng.submit_nowait(_boom), shape=(3,), dtype=np.float64) + 1
        lists = eng.submit_nowait(lambda xs, d: xs[0] + d["k"], [t, 1], {"k": f})
        cat = np.concatenate([t, f, eng.zeros(3)])
        await within(eng.waitall())
        assert eng.stats().pending_bytes == 0
        assert eng.stats().pending == 0
        for done in (u, t, v, f, lists, cat):
            await within(done)
        with pytest.raises(ss.DependencyError):
            await within(bad)
        assert eng.stats().pending_bytes == 0


def _boom() -> None:
    raise RuntimeError("boom")


# -- backpressure: throttle once per batch ---------------------------------------------------------------

LIMIT = 8 * MIB
BATCHES = 50
ROWS, COLS = 512, 64  # a batch is a (512, 64) float64 array: 256 KiB
BATCH = ROWS * COLS * 8
W_BYTES = COLS * COLS * 8
#: the most one batch adds to pending_bytes: each of its five ops holds its output plus its inputs' memory
ONE_BATCH = (
    (BATCH + BATCH + W_BYTES)  # x @ w
    + 3 * (BATCH + BATCH)  # np.maximum(., 0), * 2, + 1
    + (ROWS * 8 + BATCH)  # .sum(axis=1)
)


async def produce(eng: ss.Engine, throttle: bool) -> list[Tensor]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((COLS, COLS))
    outputs = []
    for _ in range(BATCHES):
        x = eng.asarray(rng.standard_normal((ROWS, COLS)))
        outputs.append((np.maximum(x @ w, 0) * 2 + 1).sum(axis=1))
        if throttle:
            await within(eng.throttle())
    return outputs


def expected_outputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((COLS, COLS))
    return [
        (np.maximum(rng.standard_normal((ROWS, COLS)) @ w, 0) * 2 + 1).sum(axis=1) for _ in range(BATCHES)
    ]


async def test_throttle_once_per_batch_bounds_the_peak_by_the_limit_plus_one_batch() -> None:
    """Ops are admitted over the limits; throttle() returns once the engine is under them. So the peak is
    at most max_pending_bytes plus what one batch adds -- and without throttle it is far above that.
    Both workers are held until the producer has had to wait (or, without throttle, has queued every
    batch): the limit is reached whatever the machine's speed."""
    assert ONE_BATCH < LIMIT // 3
    async with ss.Engine(cpu_workers=2, max_pending_bytes=LIMIT) as eng:
        async with occupied(eng, 2):
            producing = asyncio.ensure_future(produce(eng, throttle=True))
            await until(lambda: eng.stats().waiting_admission == 1)  # its throttle() waits for room
            assert not producing.done() and eng.stats().pending_bytes > LIMIT
        outputs = await within(producing)
        values = [await within(y) for y in outputs]
        await within(eng.waitall())
        throttled = eng.stats()
    for got, want in zip(values, expected_outputs(), strict=True):
        np.testing.assert_allclose(got, want)
    assert throttled.pending_bytes == 0
    assert LIMIT < throttled.peak_pending_bytes <= LIMIT + ONE_BATCH

    async with ss.Engine(cpu_workers=2, max_pending_bytes=LIMIT) as eng:
        async with occupied(eng, 2):
            outputs = await produce(eng, throttle=False)  # nothing waits: every batch is queued
        await within(eng.waitall())
        unthrottled = eng.stats()
    assert unthrottled.pending_bytes == 0
    assert unthrottled.peak_pending_bytes > 3 * LIMIT  # so the bound above is not vacuous


async def test_throttle_returns_at_once_under_the_limits() -> None:
    async with ss.Engine(cpu_workers=2, max_pending_bytes=LIMIT) as eng:
        t = eng.asarray(np.ones(10)) + 1
        await within(eng.throttle())
        np.testing.assert_array_equal(await within(t), np.full(10, 2.0))
