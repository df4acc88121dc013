"""Compiled equals eager, bit for bit, on random straight-line programs.

A program is a list of steps over a pool of values that starts with 1-3 arguments (small shapes that
broadcast against each other; float64, float32, int64 or bool): operators with tensors and scalars,
unary ufuncs, reductions, matmul/dot, views, concatenate/stack, where, clip, astype, in-place operators,
``out=``, item assignment and writes through views of intermediates, captured constants, arrays created
inside the function, repeated subexpressions and values nobody uses.  Each step picks its operands from
the pool by position and its variant by number; whether it applies depends only on shapes and dtypes
(a step NumPy would reject at the call is skipped), so the same program runs identically on eager
Tensors and on traced ones.  The program is run eagerly and compiled, on one set of arguments (the
tracing call) and on new values of the same signature (a replay).

Values stay small so nothing overflows; a program whose eager run still fails (a NumPy warning is an
error in the worker threads under this suite's ``filterwarnings = error``) is rejected.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import schedsvc as ss

from .helpers import assert_same_bits, values

DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.bool_)]
SCALARS: list[Any] = [2, -1, 0.5, 1.5, 0.0, True, np.float32(0.25), np.int64(3), 3, -0.0]
CONSTANTS = [
    np.linspace(-1.0, 1.0, 6).reshape(2, 3),
    np.arange(3, dtype=np.int64),
    np.array([True, False, True]),
    np.array([0.5, -0.25], dtype=np.float32),
]

# binary ops on (tensor, tensor or scalar); divisions keep their divisor >= 1
BINARY: list[Callable[[Any, Any], Any]] = [
    operator.add,
    operator.sub,
    operator.mul,
    lambda a, b: a / (abs(b) + 1),
    lambda a, b: a // (abs(b) + 1),
    lambda a, b: a % (abs(b) + 1),
    np.maximum,
    np.minimum,
    operator.lt,
    operator.eq,
    operator.and_,
    operator.or_,
    np.copysign,
    np.arctan2,
]
UNARY: list[Callable[[Any], Any]] = [
    operator.neg,
    abs,
    np.sin,
    np.tanh,
    np.square,
    np.floor,
    lambda a: np.exp(np.clip(a, -3, 3)),
    lambda a: np.log(np.abs(a) + 1),
    lambda a: np.sqrt(np.abs(a)),
    operator.invert,
    np.sign,
    np.logical_not,
    lambda a: a**2,
]
REDUCTIONS = ["sum", "mean", "max", "min", "prod", "argmax", "any", "all"]
AXES: list[Any] = [None, 0, -1, (0, 1), 1]
VIEWS: list[Callable[[Any], Any]] = [
    lambda t: t[0],
    lambda t: t[-1:],
    lambda t: t[::-1],
    lambda t: t[..., None],
    lambda t: t[None],
    lambda t: t[:, 1:],
    lambda t: t.T,
    lambda t: t.reshape(-1),
    lambda t: t.reshape(tuple(reversed(t.shape))),
    lambda t: t[..., ::2],
    lambda t: t[1:, None],
    lambda t: np.transpose(t),
]
INDICES: list[Any] = [0, -1, slice(None, None, 2), Ellipsis, (Ellipsis, 0), slice(1, None), (0, slice(None))]
IN_PLACE: list[Callable[[Any, Any], Any]] = [
    operator.iadd,
    operator.isub,
    operator.imul,
    lambda t, b: np.maximum(t, b, out=t),
    lambda t, b: np.subtract(b, t, out=t),
    lambda t, b: np.multiply(t, 2, out=t),
]
KINDS = [
    "binary",
    "unary",
    "reduce",
    "matmul",
    "view",
    "join",
    "where",
    "clip",
    "astype",
    "in_place",
    "setitem",
    "view_write",
    "view_and_op",
    "repeat",
    "create",
    "constant",
]


@dataclass(frozen=True)
class Step:
    kind: str
    a: int  # operand choices: 0 is the newest value in the pool
    b: int
    c: int
    variant: int


@dataclass(frozen=True)
class Program:
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype[Any], ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    out_kind: str  # "single", "tuple" or "list"


@dataclass
class Entry:
    value: Any
    writable: bool  # memory computed inside the function (not an argument's, not a captured array's)


class Skip(Exception):
    """NumPy rejects this step for these shapes/dtypes (raised at the call, eager and traced alike)."""


@contextmanager
def rejected() -> Iterator[None]:
    """A step NumPy rejects at the call (a TypeError, ValueError or IndexError) is skipped; a TraceError
    (which is a TypeError too) is not."""
    try:
        yield
    except ss.TraceError:
        raise
    except (TypeError, ValueError, IndexError) as e:
        raise Skip from e


class Interpreter:
    """Runs a program on Tensors (eager) or traced tensors (inside a compiled function)."""

    def __init__(self, eng: ss.Engine, args: tuple[Any, ...]) -> None:
        self.eng = eng
        self.pool = [Entry(a, writable=False) for a in args]

    def pick(self, i: int) -> Entry:
        return self.pool[len(self.pool) - 1 - i % len(self.pool)]

    def operand(self, i: int, c: int) -> Any:
        return SCALARS[c % len(SCALARS)] if c % 3 == 0 else self.pick(i).value

    def add(self, value: Any, writable: bool = True) -> None:
        self.pool.append(Entry(value, writable))

    def step(self, s: Step) -> None:
        pick, operand, add = self.pick, self.operand, self.add
        if s.kind == "binary":
            f = BINARY[s.variant % len(BINARY)]
            x, y = pick(s.a).value, operand(s.b, s.c)
            add(f(y, x) if s.c % 2 else f(x, y))
        elif s.kind == "unary":
            add(UNARY[s.variant % len(UNARY)](pick(s.a).value))
        elif s.kind == "reduce":
            name = REDUCTIONS[s.variant % len(REDUCTIONS)]
            x, axis = pick(s.a).value, AXES[s.b % len(AXES)]
            if name == "argmax" and isinstance(axis, tuple):
                raise Skip
            add(getattr(x, name)(axis=axis, keepdims=bool(s.c % 2)))
        elif s.kind == "matmul":
            x, y = pick(s.a).value, pick(s.b).value
            add(np.dot(x, y) if s.c % 2 else x @ y)
        elif s.kind == "view":
            e = pick(s.a)
            add(VIEWS[s.variant % len(VIEWS)](e.value), e.writable)
        elif s.kind == "join":
            x, y = pick(s.a).value, pick(s.b).value
            axis = s.variant % 3 - 1
            add(np.concatenate([x, y], axis=axis) if s.c % 2 else np.stack([x, y, x], axis=axis))
        elif s.kind == "where":
            x, y, z = pick(s.a).value, operand(s.b, s.c), pick(s.variant).value
            add(np.where(x > 0, y, z))
        elif s.kind == "clip":
            x = pick(s.a).value
            add(np.clip(x, -1, pick(s.b).value if s.c % 2 else 1))
        elif s.kind == "astype":
            add(pick(s.a).value.astype(DTYPES[s.variant % len(DTYPES)]))
        elif s.kind == "in_place":
            e = pick(s.a)
            if not e.writable or not e.value.shape:  # a 0-d value is a scalar: `+=` would rebind
                raise Skip
            IN_PLACE[s.variant % len(IN_PLACE)](e.value, operand(s.b, s.c))
        elif s.kind == "setitem":
            e = pick(s.a)
            if not e.writable or not e.value.shape:
                raise Skip
            index, y = INDICES[s.variant % len(INDICES)], operand(s.b, s.c)
            if not np.empty(e.value.shape)[index].shape and len(getattr(y, "shape", ())):
                raise Skip  # NumPy rejects it, but only when it runs: a bug with its own test
            e.value[index] = y
        elif s.kind == "view_write":
            e = pick(s.a)
            if not e.writable:
                raise Skip
            v = e.value[INDICES[s.variant % len(INDICES)]]
            if not v.shape:
                raise Skip
            y = operand(s.b, s.c)
            add(operator.imul(v, y) if s.c % 2 else operator.iadd(v, y))
        elif s.kind == "view_and_op":  # a view of a value, then an op on the value itself
            e = pick(s.a)
            v = VIEWS[s.variant % len(VIEWS)](e.value)
            w = UNARY[s.c % len(UNARY)](e.value)
            add(v, e.writable)
            add(w)
        elif s.kind == "repeat":  # the same expression twice: CSE merges the second
            f = BINARY[s.variant % len(BINARY)]
            x, y = pick(s.a).value, operand(s.b, s.c)
            add(f(x, y))
            add(f(x, y))
        elif s.kind == "create":
            x = pick(s.a).value
            if s.variant % 3 == 0:
                add(self.eng.ones(x.shape, x.dtype))
            elif s.variant % 3 == 1:
                add(self.eng.full(x.shape, 0.5 * (s.c % 4)))
            else:
                add(self.eng.arange(s.c % 4 + 1) * 2)
        elif s.kind == "constant":
            constant = CONSTANTS[s.variant % len(CONSTANTS)]
            if s.c % 2:
                add(self.eng.asarray(constant), writable=False)
            else:
                x = pick(s.a).value
                add(x * constant if s.b % 2 else constant - x)
        else:
            raise AssertionError(f"unknown step kind {s.kind!r}")


def interpret(
    eng: ss.Engine, program: Program, args: tuple[Any, ...], applied: list[str] | None = None
) -> Any:
    """Run ``program`` on ``args``; ``applied`` collects the kinds of the steps that applied."""
    run = Interpreter(eng, args)
    for s in program.steps:
        try:
            with rejected():
                run.step(s)
        except Skip:
            continue
        if applied is not None:
            applied.append(s.kind)
    outputs = [run.pick(i).value for i in program.outputs]
    if program.out_kind == "single":
        return outputs[0]
    return tuple(outputs) if program.out_kind == "tuple" else outputs


# -- strategies -------------------------------------------------------------------------------------------


ELEMENTS = {
    "f": st.sampled_from([-2.0, -1.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0]),
    "i": st.integers(-3, 3),
    "b": st.booleans(),
}

steps = st.builds(
    Step,
    # elementwise steps are the ones the optimiser rewrites most: they come three times as often
    kind=st.sampled_from([*KINDS, *["binary", "unary", "view_and_op"] * 2]),
    a=st.integers(0, 4),
    b=st.integers(0, 4),
    c=st.integers(0, 8),
    variant=st.integers(0, 15),
)


@st.composite
def programs(draw: st.DrawFn, max_dim: int) -> Program:
    ndim = draw(st.integers(0, 3))
    base = tuple(draw(st.integers(1, max_dim)) for _ in range(ndim))
    n_inputs = draw(st.integers(1, 3))
    shapes = []
    for _ in range(n_inputs):
        drop = draw(st.integers(0, ndim))
        shapes.append(tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in base[drop:]))
    dtypes = tuple(draw(st.sampled_from(DTYPES)) for _ in range(n_inputs))
    program_steps = tuple(draw(st.lists(steps, min_size=3, max_size=12)))
    outputs = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    kinds = ["single", "tuple", "list"] if len(outputs) == 1 else ["tuple", "list"]
    out_kind = draw(st.sampled_from(kinds))
    return Program(tuple(shapes), dtypes, program_steps, outputs, out_kind)


Case = tuple[Program, list[np.ndarray], list[np.ndarray]]


@st.composite
def cases(draw: st.DrawFn, max_dim: int = 3) -> Case:
    program = draw(programs(max_dim))

    def arguments() -> list[np.ndarray]:
        return [
            draw(hnp.arrays(dtype, shape, elements=ELEMENTS[dtype.kind]))
            for shape, dtype in zip(program.shapes, program.dtypes, strict=True)
        ]

    return program, arguments(), arguments()


# -- the check --------------------------------------------------------------------------------------------


async def eager(eng: ss.Engine, program: Program, arrays: list[np.ndarray]) -> list[Any] | None:
    """The program's outputs run on eager Tensors; None if a task of it failed (rejected)."""
    result = interpret(eng, program, tuple(eng.asarray(a.copy()) for a in arrays))
    try:
        return await values(result)
    except Exception:
        return None


async def compare(program: Program, first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    async with ss.Engine(cpu_workers=2) as eng:
        want = [await eager(eng, program, first), await eager(eng, program, second)]
        if want[0] is None or want[1] is None:
            return False
        compiled = eng.compile(lambda *args: interpret(eng, program, args))
        for call, (arrays, expected) in enumerate(zip((first, second), want, strict=True)):
            inputs = [eng.asarray(a.copy()) for a in arrays]
            result = compiled(*inputs)
            kind = {"single": ss.Tensor, "tuple": tuple, "list": list}[program.out_kind]
            assert isinstance(result, kind)
            got = await values(result)
            assert len(got) == len(expected)
            for i, (g, w) in enumerate(zip(got, expected, strict=True)):
                what = f"{'trace' if call == 0 else 'replay'} call, output {i}"
                assert_same_bits(g, w, what)
            for a, t in zip(arrays, inputs, strict=True):
                assert_same_bits(await t, a, "an argument after the call")
        stats = compiled.stats()
        assert (stats["traces"], stats["replays"]) == (1, 2), stats
    return True


def check(case: Case) -> None:
    program, first, second = case
    with np.errstate(all="ignore"):  # this thread's NumPy (tracing probes) stays quiet
        assume(asyncio.run(compare(program, first, second)))


PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)
X3 = np.linspace(-1.0, 1.0, 9).reshape(3, 3)

# Shrunk programs that once differed, kept as explicit examples (random search finds them rarely).
# A view of a ufunc result that buffer reuse moved into its operand's memory, then a ufunc of that
# result: sin(x) -> tanh reuses it -> v = t[-1:]; sin(t) must not overwrite what v reads.
STALE_VIEW: Case = (
    Program(
        ((3, 3),),
        (F64,),
        (Step("unary", 0, 0, 0, 2), Step("unary", 0, 0, 0, 3), Step("view_and_op", 0, 0, 2, 1)),
        (0, 1),
        "tuple",
    ),
    [X3],
    [X3 * 2],
)
# where(x > 0, 0.0, x) and where(x > 0, -0.0, x): CSE must not merge the two literals
NEGATIVE_ZERO: Case = (
    Program(((3,),), (F64,), (Step("where", 0, 0, 24, 0), Step("where", 1, 0, 9, 1)), (0, 1), "list"),
    [np.array([1.0, 2.0, 0.5])],
    [np.array([2.0, -1.0, 1.0])],
)
# (exp(clip(x.T)) + y).sum(axis=-1) on 8x8 float32: the sum's rounding depends on the memory layout
LAYOUT: Case = (
    Program(
        ((8, 8), (8, 8)),
        (F32, F32),
        (
            Step("view", 1, 0, 0, 6),
            Step("unary", 0, 0, 0, 6),
            Step("binary", 0, 2, 1, 0),
            Step("reduce", 0, 2, 0, 0),
        ),
        (0,),
        "single",
    ),
    [
        np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8) ** 3,
        np.linspace(1, -2, 64, dtype=np.float32).reshape(8, 8),
    ],
    [
        np.linspace(-2, 1, 64, dtype=np.float32).reshape(8, 8) ** 3,
        np.linspace(2, -2, 64, dtype=np.float32).reshape(8, 8),
    ],
)


@PROPERTY
@example(case=STALE_VIEW)
@example(case=NEGATIVE_ZERO)
@given(cases())
def test_compiled_equals_eager(case: Case) -> None:
    """Shapes up to 3 per axis: small enough that every reduction and matmul adds in one order."""
    check(case)


# Regression (a bug found while building issue 3, now fixed): buffer reuse writes a result into its
# operand's memory, whose layout (e.g. Fortran order from a transposed input) is not the layout NumPy picks
# for a fresh result, so a later reduction over it adds in another order and float results differ in the
# last bits from eager
@settings(PROPERTY, max_examples=40, derandomize=True, database=None)
@example(case=LAYOUT)
@given(cases(max_dim=9))
def test_compiled_equals_eager_on_larger_arrays(case: Case) -> None:
    check(case)


def test_interpreter_applies_every_kind_of_step() -> None:
    """Each kind of step applies (is not skipped) in a plain float program, and compiles to eager's bits."""

    async def run() -> None:
        x = np.linspace(-1, 1, 9).reshape(3, 3)
        for kind in KINDS:
            # abs(x) first: a value the in-place kinds may write
            steps = (Step("unary", 0, 0, 0, 1), Step(kind, 0, 0, 3, 1))
            program = Program(((3, 3),), (F64,), steps, (0, 1), "tuple")
            applied: list[str] = []
            async with ss.Engine(cpu_workers=2) as eng:
                await values(interpret(eng, program, (eng.asarray(x),), applied))
            assert applied == ["unary", kind]
            assert await compare(program, [x], [x * 2])

    asyncio.run(run())
