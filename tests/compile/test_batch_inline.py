"""Calls too cheap to hand over: a batched call whose replay is known to take less than handing it to a
worker runs inline, on the calling thread, with the same outcome -- unless the engine is at its limits or
a write is queued to its rows.  The engine says so in ``stats()`` and once in the log.  Cheapness is made
certain here by raising the hand-off cost (``HANDOFF_US``), never by timing."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc.compile import _batched

from ..helpers import started, within
from .helpers import assert_same_bits, both_backends, occupied

anyio_backend = both_backends


def double(x: Any) -> Any:
    return x * 2.0 + 1.0


def checked(x: Any) -> Any:
    return np.sqrt(x) + 0.0 * (1 / x.sum(axis=1, keepdims=True))


@pytest.fixture
def cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replay is cheap enough to run inline (up to ``inline_threshold_us``, which caps it)."""
    monkeypatch.setattr(_batched, "INLINE_US", 1e9)


async def test_a_cheap_function_runs_its_calls_inline_once_timed(
    anyio_backend: str, cheap: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="schedsvc.compile")
    async with started(cpu_workers=1, inline_threshold_us=1e6) as eng:
        f = eng.compile(double, batch_axis=0, name="double")
        x = np.arange(4.0).reshape(1, 4)
        first = f(x)
        assert not first.done()  # not timed yet: to a worker, as every call was
        assert_same_bits(await within(first), double(x))
        calls = [f(np.full((1, 4), float(i))) for i in range(5)]
        assert all(c.done() for c in calls)  # ran in the call, on this thread
        for i, c in enumerate(calls):
            assert_same_bits(await within(c), double(np.full((1, 4), float(i))))
        stats = f.stats()
        assert stats["inline_calls"] == 5 and stats["batch_sizes"] == {1: 1}  # (not batches)
        said = [r for r in caplog.records if "runs its calls of one row inline" in r.getMessage()]
        assert len(said) == 1 and "stats()['inline_calls']" in said[0].getMessage()


async def test_inline_calls_raise_their_own_errors(anyio_backend: str, cheap: None) -> None:
    async with started(cpu_workers=1, inline_threshold_us=1e6) as eng:
        f = eng.compile(checked, batch_axis=0)
        ok = np.ones((1, 3))
        assert_same_bits(await within(f(ok)), checked(ok))
        with np.errstate(divide="raise", invalid="ignore"):
            bad = f(np.zeros((1, 3)))
        assert bad.done() and bad.state == "failed"
        with pytest.raises(FloatingPointError):
            await within(bad)
        assert f.stats()["inline_calls"] == 1


async def test_zero_inline_threshold_keeps_every_call_on_the_workers(anyio_backend: str, cheap: None) -> None:
    async with started(cpu_workers=1, inline_threshold_us=0) as eng:
        f = eng.compile(double, batch_axis=0)
        for i in range(3):
            call = f(np.full((1, 4), float(i)))
            assert not call.done()
            await within(call)
        assert f.stats()["inline_calls"] == 0


async def test_a_call_at_the_limits_is_refused_not_run_inline(anyio_backend: str, cheap: None) -> None:
    async with started(cpu_workers=1, inline_threshold_us=1e6, max_pending=1) as eng:
        f = eng.compile(double, batch_axis=0)
        await within(f(np.ones((1, 4))))
        async with occupied(eng, 1):  # its held task fills max_pending=1
            with pytest.raises(ss.QueueFull):
                f(np.ones((1, 4)))
        assert f.stats()["inline_calls"] == 0


async def test_a_call_behind_a_queued_write_to_its_rows_runs_after_it(
    anyio_backend: str, cheap: None
) -> None:
    async with started(cpu_workers=1, inline_threshold_us=1e6) as eng:
        f = eng.compile(double, batch_axis=0)
        await within(f(np.ones((1, 4))))
        x = np.zeros((1, 4))
        async with occupied(eng, 1):
            write = eng.submit_nowait(np.copyto, x, 3.0, writes=[x])
            call = f(x)
            assert not call.done()  # it reads what the write leaves: after it, on a worker
        await within(write)
        assert_same_bits(await within(call), double(np.full((1, 4), 3.0)))
        assert f.stats()["inline_calls"] == 0


async def test_an_inline_call_on_a_closed_engine_is_refused(anyio_backend: str, cheap: None) -> None:
    async with started(cpu_workers=1, inline_threshold_us=1e6) as eng:
        f = eng.compile(double, batch_axis=0)
        await within(f(np.ones((1, 4))))
    with pytest.raises(ss.EngineClosed):
        f(np.ones((1, 4)))


async def test_a_function_about_as_cheap_as_a_hand_off_batches_and_says_so_once(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_batched, "INLINE_US", 0.0)  # no replay is cheap enough to run inline
    monkeypatch.setattr(_batched, "HANDOFF_US", 1e9)  # and every one is about a hand-off's cost
    caplog.set_level(logging.INFO, logger="schedsvc.compile")
    async with started(cpu_workers=1) as eng:
        f = eng.compile(double, batch_axis=0, name="double")
        assert f.stats()["row_replay_us"] is None
        for i in range(3):
            call = f(np.full((1, 4), float(i)))
            assert not call.done()
            assert_same_bits(await within(call), double(np.full((1, 4), float(i))))
        stats = f.stats()
        assert stats["inline_calls"] == 0 and stats["row_replay_us"] > 0
        said = [r for r in caplog.records if "batching it gains little" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert "<Batched double" in said[0].getMessage()


async def test_a_call_that_waits_for_room_is_admitted_once_never_run_inline(
    anyio_backend: str, cheap: None
) -> None:
    """``await fn.submit(x)`` used to run a cheap call inline and then admit it as well: run twice, its
    state going back from done to ready."""
    async with started(cpu_workers=1, inline_threshold_us=1e6) as eng:
        f = eng.compile(double, batch_axis=0)
        await within(f(np.ones((1, 4))))
        before = eng.stats().submitted
        call = await f.submit(np.full((1, 4), 3.0))
        assert_same_bits(await within(call), double(np.full((1, 4), 3.0)))
        assert f.stats()["inline_calls"] == 0 and eng.stats().submitted == before + 1
