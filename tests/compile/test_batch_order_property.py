"""Batched calls interleaved with writes equal running the program one step at a time in NumPy.

A program is a list of steps over a few arrays (1-3 rows each, of one width) and one Tensor: batched calls of a
row-wise function on an array or on the Tensor, writes to an array (``np.copyto`` declared with ``writes=``, or
an in-place multiply with ``out=``), and in-place updates of the Tensor.  The steps are made one after another
while the engine's workers may be held (so calls queue up and fuse with whatever else is ready), then every
call's result must be bit for bit what the function gave on its argument as it was at the call, and every
array ends as the steps in order leave it (sequential consistency).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedsvc as ss

from ..helpers import started, within
from .helpers import assert_same_bits, occupied

WIDTH = 5
ARRAYS = 3


def fn(x: Any) -> Any:
    return np.tanh(x) * 2.0 + x


@dataclass(frozen=True)
class Step:
    kind: str  # "call", "call_tensor", "copyto", "scale", "tensor_add"
    target: int
    value: float


steps = st.builds(
    Step,
    kind=st.sampled_from(["call", "call", "call_tensor", "copyto", "scale", "tensor_add"]),
    target=st.integers(0, ARRAYS - 1),
    value=st.sampled_from([-1.5, 0.0, 0.25, 3.0]),
)


@dataclass(frozen=True)
class Program:
    rows: tuple[int, ...]
    steps: tuple[Step, ...]
    held: bool  # the steps are made while the worker is held: calls queue up and fuse
    workers: int
    max_batch: int


programs = st.builds(
    Program,
    rows=st.lists(st.integers(1, 3), min_size=ARRAYS, max_size=ARRAYS).map(tuple),
    steps=st.lists(steps, min_size=1, max_size=12).map(tuple),
    held=st.booleans(),
    workers=st.integers(1, 2),
    max_batch=st.integers(2, 8),
)


def start(program: Program) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(len(program.steps))
    return [rng.standard_normal((n, WIDTH)) for n in program.rows], rng.standard_normal((2, WIDTH))


def sequential(program: Program) -> tuple[list[Any], list[np.ndarray], np.ndarray]:
    """NumPy, one step at a time: each call's result, the arrays and the Tensor's value at the end."""
    arrays, tensor = start(program)
    results = []
    for step in program.steps:
        a = arrays[step.target]
        if step.kind == "call":
            results.append(fn(a.copy()))
        elif step.kind == "call_tensor":
            results.append(fn(tensor.copy()))
        elif step.kind == "copyto":
            np.copyto(a, step.value)
        elif step.kind == "scale":
            np.multiply(a, step.value, out=a)
        else:
            tensor += step.value
    return results, arrays, tensor


async def on_the_engine(program: Program) -> tuple[list[Any], list[np.ndarray], np.ndarray]:
    arrays, value = start(program)
    async with started(cpu_workers=program.workers, inline_threshold_us=0) as eng:
        f = eng.compile(fn, batch_axis=0, max_batch=program.max_batch)
        f(np.zeros((1, WIDTH)))  # traced before the program: its first call is no different
        tensor = eng.asarray(value)
        calls: list[Any] = []
        if program.held:
            async with occupied(eng, program.workers):
                tensor = run_steps(eng, f, program, arrays, tensor, calls)
        else:
            tensor = run_steps(eng, f, program, arrays, tensor, calls)
        results = [await within(c) for c in calls]
        final = await within(tensor)
        await within(eng.waitall())
    return results, arrays, final


def run_steps(
    eng: ss.Engine, f: Any, program: Program, arrays: list[np.ndarray], tensor: ss.Tensor, calls: list[Any]
) -> ss.Tensor:
    for step in program.steps:
        a = arrays[step.target]
        if step.kind == "call":
            calls.append(f(a))
        elif step.kind == "call_tensor":
            calls.append(f(tensor))
        elif step.kind == "copyto":
            eng.submit_nowait(np.copyto, a, step.value, writes=[a])
        elif step.kind == "scale":
            eng.submit_nowait(np.multiply, a, step.value, out=a)
        else:
            tensor += step.value
    return tensor


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_batched_calls_and_writes_equal_numpy_one_step_at_a_time(program: Program) -> None:
    want_results, want_arrays, want_tensor = sequential(program)
    got_results, got_arrays, got_tensor = asyncio.run(on_the_engine(program))
    for i, (g, w) in enumerate(zip(got_results, want_results, strict=True)):
        assert_same_bits(g, w, f"call {i}")
    for i, (g, w) in enumerate(zip(got_arrays, want_arrays, strict=True)):
        assert_same_bits(g, w, f"array {i}")
    assert_same_bits(got_tensor, want_tensor, "tensor")
