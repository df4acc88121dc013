"""The engine's own keywords (``device``, ``priority``, ``name``, ``reads``, ``writes``, ``nbytes``) are never
silently taken from a function that declares them: such a call is refused, and ``functools.partial`` gives
the keyword to the function."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc._options import declared_options
from tests.helpers import TIMEOUT, within


def labelled(x: int, name: str = "default", priority: int = 0) -> tuple[int, str, int]:
    return x, name, priority


def sized(x: Any, *, nbytes: int = 0, device: str = "none") -> tuple[int, str]:
    return nbytes, device


def memory(x: Any, reads: Any = (), writes: Any = ()) -> Any:
    return reads, writes


def positional_only(name: str, /) -> str:
    return name


def anything(x: int, **kwargs: Any) -> dict[str, Any]:
    return kwargs


class Model:
    def predict(self, x: int, priority: int = 0) -> int:
        return x + priority


async def test_run_refuses_an_option_the_function_declares_and_shows_the_partial(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask) as caught:
        await engine.run(labelled, 1, name="mine", priority=3)
    message = str(caught.value)
    assert isinstance(caught.value, TypeError)
    assert "eng.run" in message and "'name', 'priority'" in message
    assert "functools.partial(labelled, name='mine', priority=3)" in message
    assert engine.stats().submitted == 0  # nothing ran with the defaults


async def test_submit_and_submit_nowait_refuse_it_too(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match=r"eng\.submit\(labelled, \.\.\., name='mine'\)"):
        await engine.submit(labelled, 1, name="mine")
    with pytest.raises(ss.InvalidTask, match=r"eng\.submit_nowait\(sized, \.\.\., nbytes=8\)"):
        engine.submit_nowait(sized, np.ones(1), nbytes=8)
    with pytest.raises(ss.InvalidTask, match="'device'"):
        engine.submit_nowait(sized, 1, device="cpu")
    with pytest.raises(ss.InvalidTask, match="'priority'"):
        engine.submit_nowait(Model().predict, 1, priority=2)  # a method's own parameters count
    buffer = np.zeros(2)
    with pytest.raises(ss.InvalidTask, match=r"keyword 'reads'"):
        engine.submit_nowait(memory, 1, reads=[buffer])
    with pytest.raises(ss.InvalidTask, match=r"keyword 'writes'"):
        await engine.submit(memory, 1, writes=[buffer])
    assert engine.stats().submitted == 0


async def test_reads_and_writes_given_the_same_array_are_options_given(engine: ss.Engine) -> None:
    buffer = np.zeros(2)
    with pytest.raises(ss.InvalidTask, match=r"'reads', 'writes'"):
        engine.submit_nowait(memory, 1, reads=buffer, writes=buffer)
    assert engine.stats().submitted == 0
    # and they order: a task writing the buffer waits for the one that declared it read and written
    started, release = threading.Event(), threading.Event()

    def hold(x: np.ndarray) -> None:
        started.set()
        assert release.wait(TIMEOUT)
        x += 1

    first = await engine.submit(functools.partial(hold, buffer), reads=buffer, writes=buffer)
    assert started.wait(TIMEOUT)
    second = engine.submit_nowait(np.multiply, buffer, 2, out=buffer)
    assert second.state == "waiting"  # after the write it was ordered behind
    release.set()
    await within(first)
    await within(second)
    np.testing.assert_array_equal(buffer, [2.0, 2.0])


async def test_map_refuses_it_at_the_call(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match=r"eng\.map\(labelled, \.\.\., priority=1\)"):
        engine.map(labelled, [1, 2], priority=1)
    with pytest.raises(ss.InvalidTask, match="'device'"):
        engine.map(sized, [1, 2], device="cpu")


async def test_a_partial_gives_the_keyword_to_the_function_and_the_option_stays_the_engines(
    engine: ss.Engine,
) -> None:
    fut = await engine.submit(functools.partial(labelled, name="mine", priority=3), 1, name="the task")
    assert await within(fut) == (1, "mine", 3)
    assert fut.label == "the task"
    bound = functools.partial(labelled, name="mine", priority=1)
    assert await within(engine.run(bound, 2, priority=5)) == (2, "mine", 1)  # priority=5 is the task's
    with pytest.raises(ss.InvalidTask, match=r"partial\(labelled, \.\.\.\) declares the keyword 'priority'"):
        await engine.run(functools.partial(labelled, name="mine"), 2, priority=5)  # priority is still free
    got = [v async for v in engine.map(functools.partial(labelled, priority=4), [1], priority=1)]
    assert got == [(1, "default", 4)]


async def test_calls_that_are_not_ambiguous_are_taken(engine: ss.Engine) -> None:
    assert await within(engine.run(labelled, 1)) == (1, "default", 0)  # no option given
    assert await within(engine.run(positional_only, "x", name="task")) == "x"  # `name` is not a keyword of it
    assert await within(engine.run(anything, 1, name="task", scale=2)) == {
        "scale": 2
    }  # **kwargs declares none
    assert await within(engine.run(np.add, 1, 2, priority=1, name="add")) == 3  # no signature: declares none
    # NumPy's own device= is where the array is made: the engine's device=, never refused
    assert (await within(engine.run(np.zeros, 2, device="cpu"))).tolist() == [0.0, 0.0]
    fut = await engine.submit(labelled, 1, priority=0, name=None)  # options at their defaults: nothing given
    assert await within(fut) == (1, "default", 0)


async def test_the_executor_view_gives_every_keyword_to_the_function(engine: ss.Engine) -> None:
    pool = engine.executor()
    fut = pool.submit(labelled, 1, name="mine", priority=3)
    assert isinstance(fut, concurrent.futures.Future)
    assert await within(engine.run(_result, fut)) == (1, "mine", 3)


def _result(value: Any) -> Any:
    return value  # (the executor future is a dependency: its value is passed in)


def test_declared_options_are_read_once_per_function() -> None:
    first = declared_options(labelled)
    assert first == {"name", "priority"}
    assert declared_options(labelled) is first  # cached
    model = Model()
    assert declared_options(model.predict) == {"priority"}
    assert declared_options(model.predict) is declared_options(Model().predict)  # keyed by the function
    assert declared_options(functools.partial(labelled, name="x")) == {"priority"}
    assert declared_options(anything) == frozenset()
    assert declared_options(np.add) == frozenset()
    assert declared_options(np.arange) == frozenset()  # (NumPy 2 declares device=: the engine's)


async def test_refused_calls_time_out_nothing(engine: ss.Engine) -> None:
    """The refusal comes before anything is admitted: the engine is idle and keeps serving."""
    for _ in range(3):
        with pytest.raises(ss.InvalidTask):
            engine.submit_nowait(labelled, 1, name="mine")
    await within(engine.waitall(), TIMEOUT)
    assert await within(engine.run(labelled, 7)) == (7, "default", 0)
