"""Batched equals unbatched, bit for bit, on random row-wise programs; row-mixing programs are refused.

A program is a list of steps over a pool of values that starts with the batched argument ``x`` (its rows
along ``batch_axis``, 0 or 1; float64 or float32; 0-2 more axes of 1-4 elements, the last sometimes 8-33
long).  Every step keeps each value's batch axis where it is and its rows apart: elementwise ufuncs with
constants (closure arrays whose batch axis is 1, or that stop short of it, and scalars) or with other
values, ``@ w`` / ``np.dot`` with a closure weight or the unbatched argument ``w``, reductions over other
axes (with and without keepdims), reshapes that keep the batch axis (its length written as ``-1`` or as
the traced length), transposes of other axes, basic slicing and indexing of other axes, concatenate/stack
along other axes, where, clip, astype, and writes into a copy (in-place operators, ``out=``, item
assignment of other axes).  Whether a step applies depends only on the other axes, never on the number of
rows, so every caller's rows run the same program; a step that does not apply is skipped.

The calls (1-5 of them, 1-4 rows each) are made while the engine's only worker is held, so they batch;
each caller's result must be exactly ``program(its rows)`` run by NumPy: dtype, shape and bits.  A
row-mixing program is a row-wise one whose newest value then goes through one op that pairs or mixes rows
(a reduction over the batch axis, a matmul over it from either side, concatenation along it, picking or
reversing rows, a constant with the batch's rows, flattening): its first call raises ``ss.BatchError``
naming that op and the axis.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import schedsvc as ss

from ..helpers import started, within
from .helpers import assert_same_bits, occupied

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)
MAX_DIM = 33  # no axis other than the batch grows past this
MAX_SIZE = 66  # nor does a row
MAX_NDIM = 4

UNARY: list[Callable[[Any], Any]] = [
    operator.neg,
    abs,
    np.sin,
    np.tanh,
    np.floor,
    lambda a: np.exp(np.clip(a, -3, 3)),
    lambda a: np.log(np.abs(a) + 1),
    lambda a: np.sqrt(np.abs(a)),
    lambda a: np.square(np.clip(a, -4, 4)),
    np.sign,
    lambda a: a * 0.5,
]
BINARY: list[Callable[[Any, Any], Any]] = [
    operator.add,
    operator.sub,
    operator.mul,
    lambda a, b: a / (abs(b) + 1),
    np.maximum,
    np.minimum,
    np.arctan2,
    np.copysign,
]
REDUCTIONS = ["sum", "mean", "max", "min"]
KINDS = [
    "unary",
    "binary_constant",
    "binary_value",
    "matmul",
    "reduce",
    "reshape",
    "transpose",
    "slice",
    "join",
    "where",
    "clip",
    "astype",
    "write",
]


@dataclass(frozen=True)
class Step:
    kind: str
    a: int  # which value of the pool (0: the newest)
    b: int  # a second value, an axis, a shape choice
    c: int  # the variant
    seed: int  # the values of any constant the step makes


@dataclass(frozen=True)
class Program:
    batch_axis: int
    other_axes: tuple[int, ...]  # the input's axes besides the batch axis, in order
    dtype: np.dtype[Any]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # pool positions (0: newest); more than one: a tuple
    weight: tuple[int, int] | None  # the unbatched argument's shape, if the function takes one


class Skip(Exception):
    """The step does not apply to this value (decided from its other axes only)."""


def constant(shape: tuple[int, ...], seed: int, dtype: np.dtype[Any] = F64) -> np.ndarray:
    values = np.random.default_rng(seed).uniform(-1.5, 1.5, shape)
    return values.astype(dtype)


class Interpreter:
    """Runs a program on a NumPy array (the reference, one caller's rows) or on a traced tensor."""

    def __init__(self, x: Any, w: Any, batch_axis: int) -> None:
        self.pool = [x]
        self.w = w
        self.bax = batch_axis

    def pick(self, i: int) -> Any:
        return self.pool[len(self.pool) - 1 - i % len(self.pool)]

    def others(self, v: Any) -> list[int]:
        """The axes of ``v`` besides its batch axis."""
        return [i for i in range(v.ndim) if i != self.bax]

    def after(self, v: Any) -> list[int]:
        """The axes after the batch axis: dropping or adding one there leaves the batch axis in place."""
        return list(range(self.bax + 1, v.ndim))

    def row_shape(self, v: Any, shape: tuple[int, ...], c: int) -> tuple[int, ...]:
        """``shape`` (of ``v``'s size) with the batch axis's length written as -1 or as the traced length."""
        return tuple(
            (-1 if c % 2 else v.shape[self.bax]) if i == self.bax else d for i, d in enumerate(shape)
        )

    def step(self, s: Step) -> Any:
        v = self.pick(s.a)
        kind = s.kind
        if kind == "unary":
            return UNARY[s.c % len(UNARY)](v)
        if kind == "binary_constant":
            f = BINARY[s.c % len(BINARY)]
            k = s.b % (v.ndim + 1)  # the trailing axes the constant covers
            if k == 0:
                const: Any = float(constant((), s.seed))
            else:
                bits = np.random.default_rng(s.seed).integers(0, 2, k)
                shape = tuple(
                    1 if i == self.bax or bits[j] else v.shape[i]
                    for j, i in enumerate(range(v.ndim - k, v.ndim))
                )
                const = constant(shape, s.seed, v.dtype if s.seed % 2 else F64)
            return f(const, v) if (s.c // len(BINARY)) % 2 else f(v, const)
        if kind == "binary_value":
            u = self.pick(s.b)
            if u.ndim != v.ndim:
                raise Skip
            if any(
                p != q and 1 not in (p, q)
                for i, (p, q) in enumerate(zip(v.shape, u.shape, strict=True))
                if i != self.bax
            ):
                raise Skip
            return BINARY[s.c % len(BINARY)](v, u)
        if kind == "matmul":
            if v.ndim < 2 or self.bax == v.ndim - 1:
                raise Skip  # the batch axis would be summed over
            if self.w is not None and self.w.shape[0] == v.shape[-1] and s.b % 2:
                weight = self.w
            else:
                weight = constant((v.shape[-1], 1 + s.seed % 4), s.seed, v.dtype if s.b % 3 else F64)
            return np.dot(v, weight) if s.c % 2 else v @ weight
        if kind == "reduce":
            others = self.others(v)
            if not others:
                raise Skip
            axes = [others[s.b % len(others)]]
            if s.seed % 3 == 0 and len(others) > 1:
                axes.append(others[(s.b + 1) % len(others)])
            keepdims = bool(s.c % 2) or min(axes) < self.bax  # the batch axis stays where it is
            axis: Any = tuple(sorted({a - v.ndim if s.seed % 2 else a for a in axes}))
            if len(axis) == 1 and s.c % 4 < 2:
                axis = axis[0]
            return getattr(v, REDUCTIONS[s.c % len(REDUCTIONS)])(axis=axis, keepdims=keepdims)
        if kind == "reshape":
            return self.reshape(v, s)
        if kind == "transpose":
            others = self.others(v)
            if len(others) < 2:
                raise Skip
            order = list(np.random.default_rng(s.seed).permutation(others))
            perm = [self.bax if i == self.bax else int(order.pop(0)) for i in range(v.ndim)]
            return np.transpose(v, perm) if s.c % 2 else v.transpose(perm)
        if kind == "slice":
            others = self.others(v)
            if not others:
                raise Skip
            i = others[s.b % len(others)]
            d = v.shape[i]
            choices: list[Any] = [slice(None, None, 2), slice(None, None, -1)]
            if d >= 2:
                choices += [slice(1, None), slice(None, -1)]
            if i > self.bax:
                choices += [0, -1]
            if i == v.ndim - 1 and v.ndim < MAX_NDIM:
                choices.append(None)  # a new axis after the last
            index = choices[s.c % len(choices)]
            if s.seed % 2 and i == v.ndim - 1:
                return v[(Ellipsis, index)]
            return v[(slice(None),) * i + (index,)]
        if kind == "join":
            return self.join(v, s)
        if kind == "where":
            u = self.pick(s.b)
            other = u if u.shape == v.shape and s.c % 2 else constant(v.shape[self.bax + 1 :], s.seed)
            return np.where(v > 0.25, v, other)
        if kind == "clip":
            return np.clip(v, -0.5 - s.c % 3, 0.25 + s.b % 2)
        if kind == "astype":
            return v.astype(F32 if s.c % 2 else F64)
        if kind == "write":
            return self.write(v, s)
        raise AssertionError(f"unknown step {kind!r}")

    def reshape(self, v: Any, s: Step) -> Any:
        after = self.after(v)
        shape = list(v.shape)
        variant = s.c % 4
        if variant == 0:  # a new axis of 1 after the batch axis
            if v.ndim >= MAX_NDIM:
                raise Skip
            p = self.bax + 1 + s.b % (len(after) + 1)
            shape.insert(p, 1)
        elif variant == 1:  # two adjacent axes after the batch axis merged
            if len(after) < 2:
                raise Skip
            i = after[s.b % (len(after) - 1)]
            shape[i : i + 2] = [shape[i] * shape[i + 1]]
        elif variant == 2:  # an axis after the batch axis split
            if not after or v.ndim >= MAX_NDIM:
                raise Skip
            i = after[s.b % len(after)]
            d = shape[i]
            parts = [(2, d // 2)] if d % 2 == 0 and d >= 2 else []
            parts += [(1, d), (d, 1)]
            shape[i : i + 1] = parts[s.seed % len(parts)]
        else:  # everything after the batch axis flattened (an axis of 1 when there is none)
            shape[self.bax + 1 :] = [int(np.prod(shape[self.bax + 1 :]))]
        new = self.row_shape(v, tuple(shape), s.seed)
        return np.reshape(v, new) if s.c // 4 % 2 else v.reshape(new)

    def write(self, v: Any, s: Step) -> Any:
        """Writes into a copy (memory of the function's own): in-place operators, ``out=``, item assignment
        of other axes with a scalar or with rows of the same batch."""
        u = np.copy(v)
        variant = s.c % 4
        if variant == 0:
            u += constant(v.shape[self.bax + 1 :], s.seed, v.dtype)
        elif variant == 1:
            np.multiply(u, 0.5 + s.b % 3, out=u)
        else:
            others = self.others(v)
            if not others:
                raise Skip
            i = others[s.b % len(others)]
            index = (slice(None),) * i + ([0, -1, slice(None, None, 2), slice(1, None)][s.seed % 4],)
            if variant == 2:
                u[index] = float(constant((), s.seed))
            else:
                u[index] = np.sin(u[index])  # rows of the batch, written back to the same rows
        return u

    def join(self, v: Any, s: Step) -> Any:
        u = self.pick(s.b)
        if u.shape != v.shape or u.dtype != v.dtype:
            u = np.sin(v) if s.seed % 2 else v
        if s.c % 2:  # concatenate along another axis
            others = self.others(v)
            if not others:
                raise Skip
            axis = others[s.seed % len(others)]
            if v.shape[axis] * 2 > MAX_DIM:
                raise Skip
            return np.concatenate([v, u], axis=axis - v.ndim if s.c % 4 == 1 else axis)
        if v.ndim >= MAX_NDIM:
            raise Skip
        axis = self.bax + 1 + s.seed % (v.ndim - self.bax)  # the new axis comes after the batch axis
        return np.stack([v, u, v][: 2 + s.b % 2], axis=axis)

    def run(self, program: Program, applied: list[str] | None = None) -> Any:
        for s in program.steps:
            try:
                value = self.step(s)
            except Skip:
                continue
            others = [d for i, d in enumerate(value.shape) if i != self.bax]
            if max(others, default=1) > MAX_DIM or int(np.prod(others)) > MAX_SIZE:
                continue  # too big to keep growing
            self.pool.append(value)
            if applied is not None:
                applied.append(s.kind)
        outputs = [self.pick(i) for i in program.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def interpret(program: Program, x: Any, w: Any = None, applied: list[str] | None = None) -> Any:
    return Interpreter(x, w, program.batch_axis).run(program, applied)


def function(program: Program) -> Callable[..., Any]:
    if program.weight is None:
        return lambda x: interpret(program, x)
    return lambda x, w: interpret(program, x, w)


def rows_of(program: Program, n: int, seed: int) -> np.ndarray:
    shape = list(program.other_axes)
    shape.insert(program.batch_axis, n)
    return constant(tuple(shape), seed, program.dtype)


# -- strategies -------------------------------------------------------------------------------------------

steps = st.builds(
    Step,
    kind=st.sampled_from(KINDS),
    a=st.integers(0, 3),
    b=st.integers(0, 5),
    c=st.integers(0, 15),
    seed=st.integers(0, 2**16),
)


@st.composite
def programs(draw: st.DrawFn, max_steps: int = 8) -> Program:
    batch_axis = draw(st.integers(0, 1))
    other_axes: tuple[int, ...] = tuple(
        draw(st.lists(st.integers(1, 4), min_size=batch_axis, max_size=batch_axis + 2))
    )
    if other_axes and draw(st.booleans()):  # a long last axis: matmuls whose rounding depends on the rows
        other_axes = (*other_axes[:-1], draw(st.sampled_from([8, 16, 33])))
    dtype: np.dtype[Any] = draw(st.sampled_from([F64, F32]))
    program_steps = tuple(draw(st.lists(steps, min_size=1, max_size=max_steps)))
    outputs = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
    weight = (other_axes[-1], draw(st.integers(1, 3))) if other_axes and draw(st.booleans()) else None
    return Program(batch_axis, other_axes, dtype, program_steps, outputs, weight)


@dataclass(frozen=True)
class Calls:
    counts: tuple[int, ...]  # rows per call, in call order
    max_batch: int
    seed: int


calls = st.builds(
    Calls,
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=5).map(tuple),
    max_batch=st.integers(4, 16),
    seed=st.integers(0, 2**16),
)


# -- the check --------------------------------------------------------------------------------------------


async def batched_equals_unbatched(program: Program, plan: Calls) -> None:
    fn = function(program)
    xs = [rows_of(program, n, plan.seed + i) for i, n in enumerate(plan.counts)]
    w = None if program.weight is None else constant(program.weight, plan.seed + 99)
    args = [(x,) if w is None else (x, w) for x in xs]
    want = [fn(*a) for a in args]  # NumPy, one caller's rows at a time
    async with started(cpu_workers=1, inline_threshold_us=0) as eng:
        f = eng.compile(
            fn,
            batch_axis=program.batch_axis,
            batched=[0],
            max_batch=plan.max_batch,
            exact=True,
        )
        async with occupied(eng, 1):  # the engine is busy: the calls batch
            pending = [f(*a) for a in args]
        got = [await within(call) for call in pending]
        stats = f.stats()
    for i, (g, expected) in enumerate(zip(got, want, strict=True)):
        if isinstance(expected, tuple):
            assert isinstance(g, tuple) and len(g) == len(expected)
            for j, (gj, ej) in enumerate(zip(g, expected, strict=True)):
                assert_same_bits(gj, ej, f"call {i} ({plan.counts[i]} rows), output {j}")
        else:
            assert_same_bits(g, expected, f"call {i} ({plan.counts[i]} rows)")
    assert stats["rows"] == sum(plan.counts), stats
    if sum(plan.counts) <= plan.max_batch:  # made while the worker was held, without a pause: one batch
        assert stats["batch_sizes"] == {sum(plan.counts): 1}, stats


PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Cases random search finds rarely, kept as explicit examples.  A matmul whose inner axis is long enough
# that BLAS rounds a row of a many-row product differently from a one-row product: exact mode's per-caller
# products (each fails with exact=False).
LONG_MATMUL = (Program(0, (16,), F64, (Step("matmul", 0, 0, 0, 0),), (0,), None), Calls((1, 2), 16, 0))
LONG_MATMUL_F32 = (Program(0, (33,), F32, (Step("matmul", 0, 0, 0, 0),), (0,), None), Calls((1, 2, 4), 16, 3))
STACKED_MATMUL = (
    Program(1, (4, 8), F32, (Step("matmul", 0, 1, 2, 300),), (0,), (8, 1)),
    Calls((4, 4, 2, 2, 2), 16, 0),
)
# Two cases this property found where exact=True gives a one-row caller other last bits than its own call
# (bugs, not fixed yet; also test_batching.py's test_exact_holds_where_numpy_rounds_a_one_row_array_differently):
# x.sum(axis=0) on float32 rows along axis 1 (the caller's (16, 1) column is summed in another order than
# the same column of the batch), and np.arctan2(x[..., ::-1], x) on float32 (another loop).
SUM_BEFORE_THE_BATCH_AXIS = (
    Program(1, (16,), F32, (Step("reduce", 0, 0, 0, 0),), (0,), None),
    Calls((1, 3), 4, 0),
)
ARCTAN2_OF_A_REVERSED_VIEW = (
    Program(0, (8,), F32, (Step("slice", 0, 0, 1, 1), Step("binary_value", 0, 1, 6, 0)), (0,), None),
    Calls((1, 3), 4, 0),
)


@PROPERTY
@example(*LONG_MATMUL)
@example(*LONG_MATMUL_F32)
@example(*STACKED_MATMUL)
@example(*SUM_BEFORE_THE_BATCH_AXIS)
@example(*ARCTAN2_OF_A_REVERSED_VIEW)
@given(programs(), calls)
def test_batched_calls_equal_unbatched_calls_bit_for_bit(program: Program, plan: Calls) -> None:
    asyncio.run(batched_equals_unbatched(program, plan))


def test_every_kind_of_step_applies() -> None:
    """Each kind of step applies (is not skipped) to a 4-D value, on either batch axis, and batches exactly."""
    for batch_axis in (0, 1):
        for kind in KINDS:
            program = Program(batch_axis, (3, 4, 2), F64, (Step(kind, 0, 1, 1, 7),), (0,), (2, 2))
            applied: list[str] = []
            x = rows_of(program, 2, 0)
            interpret(program, x, constant((2, 2), 1), applied)
            assert applied == [kind], (batch_axis, kind)
            asyncio.run(batched_equals_unbatched(program, Calls((1, 2, 3), 6, 5)))


# -- row-mixing programs ------------------------------------------------------------------------------------

MIXING = [
    "reduce_batch",
    "reduce_all",
    "transposed_matmul",
    "matmul_on_the_right",
    "concatenate_batch",
    "one_row",
    "reversed_rows",
    "constant_rows",
    "flatten",
]


def mix(program: Program, v: Any, kind: int, variant: int) -> tuple[Any, set[str], int]:
    """``v`` through one op that mixes or pairs its rows; the names its BatchError may give the op, and the
    axis it must name (where the batch lies in the op's operand)."""
    bax = program.batch_axis
    name = MIXING[kind % len(MIXING)]
    n = v.shape[bax]
    if name == "matmul_on_the_right" and not (v.ndim == 1 or bax == v.ndim - 2):
        name = "reduce_batch"  # w @ v sums over the batch only when it is v's second-last axis
    if name == "flatten" and int(np.prod(v.shape)) == n:
        name = "reduce_batch"  # nothing besides the rows: flattening keeps them apart
    if name == "reduce_batch":
        reduction = REDUCTIONS[variant % len(REDUCTIONS)]
        return getattr(v, reduction)(axis=bax, keepdims=bool(variant % 2)), {reduction}, bax
    if name == "reduce_all":
        reduction = REDUCTIONS[variant % len(REDUCTIONS)]
        return getattr(v, reduction)(), {reduction}, bax
    if name == "transposed_matmul":  # the batch axis moved last, then summed over by a matmul
        perm = [i for i in range(v.ndim) if i != bax] + [bax]
        return v.transpose(perm) @ constant((n, 2), variant), {"matmul"}, v.ndim - 1
    if name == "matmul_on_the_right":
        return constant((2, n), variant) @ v, {"matmul"}, bax
    if name == "concatenate_batch":
        return np.concatenate([v, np.tanh(v)], axis=bax), {"concatenate"}, bax
    if name == "one_row":
        return v[(slice(None),) * bax + (variant % n,)], {"getitem"}, bax
    if name == "reversed_rows":
        return v[(slice(None),) * bax + (slice(None, None, -1),)], {"getitem"}, bax
    if name == "constant_rows":
        shape = tuple(n if i == bax else (d if variant % 2 else 1) for i, d in enumerate(v.shape))
        if variant % 3:
            return v * constant(shape, variant), {"multiply"}, bax
        return v + constant(shape, variant), {"add"}, bax
    return v.reshape(-1), {"reshape"}, bax


@dataclass(frozen=True)
class Mixing:
    program: Program
    kind: int
    variant: int
    rows: int  # of the first call, which traces: more than one, so that rows can mix


mixing = st.builds(
    Mixing,
    program=programs(max_steps=5),
    kind=st.integers(0, len(MIXING) - 1),
    variant=st.integers(0, 7),
    rows=st.integers(2, 4),
)


async def refused(case: Mixing) -> None:
    program = case.program
    names: set[str] = set()
    axes: set[int] = set()

    def fn(x: Any, w: Any = None) -> Any:
        v = Interpreter(x, w, program.batch_axis).run(program)
        v = v[0] if isinstance(v, tuple) else v
        out, said, axis = mix(program, v, case.kind, case.variant)
        names.update(said)
        axes.add(axis)
        return out

    x = rows_of(program, case.rows, case.variant)
    args = (x,) if program.weight is None else (x, constant(program.weight, 1))
    async with started(cpu_workers=1) as eng:
        f = eng.compile(fn, batch_axis=program.batch_axis, batched=[0])
        try:
            call = f(*args)
            await within(call)
        except ss.BatchError as e:
            message = str(e)
            assert isinstance(e, ss.TraceError)
            assert any(f"{name}()" in message for name in names), f"none of {sorted(names)} in: {message}"
            assert any(f"axis {axis}" in message for axis in axes), f"no axis {axes} in: {message}"
        else:
            raise AssertionError(f"a row-mixing function ({sorted(names)}) was not refused")
        assert eng.stats().submitted == 0


@settings(PROPERTY, max_examples=300)
@given(mixing)
def test_row_mixing_programs_raise_batch_error(case: Mixing) -> None:
    asyncio.run(refused(case))


def test_every_mixing_op_is_refused() -> None:
    """Each mixing op, applied straight to the input (2-D and 3-D, both batch axes), is refused."""
    for batch_axis, other_axes in [(0, (3,)), (0, (3, 2)), (1, (2, 3))]:
        program = Program(batch_axis, other_axes, F64, (), (0,), None)
        for kind in range(len(MIXING)):
            asyncio.run(refused(Mixing(program, kind, 1, 3)))
