"""CI budget of the differential tester: random programs per feature family, against sequential NumPy.

Each test runs ``BUDGET`` seeds of one feature set; a failure prints the first mismatch, the seed and the
program (``python scripts/difftest.py --replay SEED --families ...`` runs it again and minimizes it).
Feature sets that mismatch today are strict xfails whose reason names the broken rule: once the fix lands
they fail, and the mark goes.  ``SEEDS`` are regression programs that always run.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from .check import Verdict, check, check_seed, compare
from .program import EXTRA_FAMILIES, FAMILIES, INJ, Config, Model, Program, Stmt, dep, generate, run_reference
from .runner import Result

#: Seeds per feature set in CI (programs of 15-40 statements, plus a final observation of every handle).
BUDGET = 25


#: name -> (families, xfail reason or None).  A broken combination of families is split off, so that the
#: other sets keep guarding what works today.
FEATURE_SETS: dict[str, tuple[frozenset[str], str | None]] = {
    name: (frozenset(families), reason)
    for name, families, reason in [
        ("submit", {"submit"}, None),
        ("views", {"submit", "views"}, None),
        ("failures", {"submit", "views", "failures"}, None),
        ("tensor", {"tensor", "views"}, None),
        ("tensor_submit", {"tensor", "submit", "views"}, None),
        ("tensor_failures", {"tensor", "failures"}, None),
        ("compile", {"compile", "tensor", "views"}, None),
        ("compile_submit", {"compile", "submit", "views"}, None),
        ("batched", {"batched", "submit", "views"}, None),
        ("executor", {"executor", "submit", "views", "failures"}, None),
        ("map", {"map", "submit", "views", "failures"}, None),
        ("cuda", {"cuda", "tensor"}, None),
        ("cuda_compile", {"cuda", "tensor", "compile"}, None),
        ("cuda_batched", {"cuda", "batched", "submit", "views"}, None),
        # large mixes: every family, and two subsets of them
        ("mixed_tensor", set(FAMILIES) - {"batched", "failures", "submit"}, None),
        ("mixed_no_tensor", set(FAMILIES) - {"batched", "tensor", "cuda"}, None),
        ("mixed", set(FAMILIES), None),
        # compiled functions of two outputs under small limits, saved and loaded ones, cancelled awaits
        ("outputs", {"compile", "outputs", "submit", "views"}, None),
        ("saved", {"compile", "saved", "outputs", "tensor", "views"}, None),
        ("cancel", {"cancel", "submit", "compile", "outputs", "views", "failures"}, None),
        ("cancel_tensor", {"cancel", "compile", "tensor", "views"}, None),
        ("cancel_cuda", {"cancel", "compile", "cuda", "tensor"}, None),
        ("mixed_extra", {*FAMILIES, *EXTRA_FAMILIES}, None),
    ]
}


class Mismatch(AssertionError):
    """The engine and sequential NumPy disagree (an error of the tester itself is not one)."""


def xfail(reason: str) -> pytest.MarkDecorator:
    """Strict, and only for a mismatch: a crash of the tester still fails."""
    return pytest.mark.xfail(strict=True, raises=Mismatch, reason=reason)


def expect_agreement(verdicts: list[Verdict]) -> None:
    if any(v.mismatch is not None for v in verdicts):
        raise Mismatch(fail_message(verdicts))


def fail_message(verdicts: list[Verdict]) -> str:
    bad = [v for v in verdicts if v.mismatch is not None]
    first = bad[0]
    seeds = ", ".join(str(v.program.seed) for v in bad)
    fams = "+".join(sorted(first.program.families))
    return (
        f"{len(bad)}/{len(verdicts)} programs mismatched (seeds {seeds}); the first (seed {first.program.seed}, "
        f"families {fams}; the statements it can depend on):\n{first.short()}\n"
        f"(the whole program, minimized: python scripts/difftest.py --replay {first.program.seed} "
        f"--families {'+'.join(sorted(first.program.families))})"
    )


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=xfail(reason) if reason else ()) for name, (_, reason) in FEATURE_SETS.items()],
)
def test_feature_set_equals_sequential_numpy(name: str) -> None:
    families, _ = FEATURE_SETS[name]
    expect_agreement([check_seed(seed, families) for seed in range(BUDGET)])


#: Regression programs: (seed, feature set, what it shows, xfail reason or None).  Each mismatching one was
#: found by this tester and mismatched 6 runs out of 6; ``python scripts/difftest.py --replay SEED --families
#: SET`` lists it and minimizes it.  Seeds are tied to the generator: a change to ``program.py`` that draws
#: differently makes new programs of them (the minimal programs below do not move).
SEEDS: list[tuple[int, str, str, str | None]] = [
    (
        2,
        "outputs",
        "t21 = c13(B1[5:6])[1] at max_pending=2: each output picked from a call's result took a slot of its "
        "own (3 tasks pending)",
        None,
    ),
    (
        1,
        "cancel",
        "t2 = (await c1.submit(B1[::2]))[0], its await cancelled: the call's outputs took slots of their own",
        None,
    ),
    (
        1106,
        "mixed",
        "a Tensor write failing at admission (its input had failed) became the owner's last write: await t "
        "stopped waiting for the write before it, np.add(t3, ..., out=t3), still queued",
        None,
    ),
    (
        9665,
        "mixed",
        "t5[0:1] = eng.asarray(<a task that fails later>) queued behind add_into(t5, 23, out=t5) on cuda:0 "
        "failed through its input and, as the last write, let await t5 read while add_into still ran",
        None,
    ),
    (
        3,
        "batched",
        "call = g(B0.reshape(2, 4)[1:2]) with x @ W, then mix(..., out=as_strided(B1)) and an add of B0[5:6]: the call sees the add",
        None,
    ),
    (
        10,
        "batched",
        "call = g(B2.reshape(2, 4)[1:2]); add(B2[5:6], 1, out=B2[5:6]); await call sees the add",
        None,
    ),
    (
        13,
        "batched",
        "two calls of one batched function, then hidden_write(B1[2:6]): the second call sees it",
        None,
    ),
    (0, "batched", "batched calls and later writes the engine gets right today (a guard)", None),
    (1, "batched", "(a guard)", None),
    (
        1,
        "tensor_failures",
        "t = eng.asarray(B1); eng.submit(fail_add, B1, 1, out=B1) fails; np.add(t, B1, out=t) is lost",
        None,
    ),
    (
        2,
        "tensor_failures",
        "t = eng.asarray(B2); a failed hidden write of B2; t.min() gives DependencyError instead of B2's minimum",
        None,
    ),
    (
        3,
        "tensor_failures",
        "t4 += <failed>; np.add(t6, 0, out=t4) (a later successful write) is failed too: await t4 raises",
        None,
    ),
    (0, "tensor_failures", "failed in-place writes the engine handles right today (a guard)", None),
    (9, "tensor_failures", "(a guard)", None),
    (
        11,
        "tensor_submit",
        "add_value(B2, f, out=B2) queued; await eng.asarray(B2) returns B2 before the write",
        None,
    ),
    (24, "tensor_submit", "the same through add(B2.reshape(2, 4)[1], 19, out=...)", None),
    (0, "tensor_submit", "Tensors and task writes the engine gets right today (a guard)", None),
    (1, "tensor_submit", "(a guard)", None),
    (
        0,
        "mixed",
        "call = g(B1.reshape(2, 4)[0:1]); mix(B0[::2], out=B1[1::2]); the call sees the mix",
        None,
    ),
    (
        1,
        "mixed",
        "add(B1.reshape(2, 4)[0:1], 30, out=...) awaited into the queue; await eng.asarray(B1) returns B1 before it",
        None,
    ),
    (
        3,
        "mixed",
        "t2[1:2] = <failed>; t2.max() gives DependencyError instead of t2's maximum",
        None,
    ),
    (2, "mixed", "every family at once, right today (a guard)", None),
    (4, "mixed", "(a guard)", None),
]


@pytest.mark.parametrize(
    ("seed", "feature_set"),
    [
        pytest.param(seed, fs, marks=xfail(reason) if reason else (), id=f"{fs}-{seed}")
        for seed, fs, _, reason in SEEDS
    ],
)
def test_regression_seed(seed: int, feature_set: str) -> None:
    expect_agreement([check_seed(seed, FEATURE_SETS[feature_set][0])])


# -- minimal programs: the mismatches above, minimized, written out (they do not move with the generator) --

B = [("V", k, 0) for k in range(3)]  # whole buffers
FAILED8 = ("FAILED", None, (8,))
ASYNCIO_1 = Config(workers=1, max_pending=1024, max_pending_bytes=2**30, backend="asyncio", cuda=False)
TRIO_4 = Config(workers=4, max_pending=4, max_pending_bytes=2**30, backend="trio", cuda=False)
CUDA_1 = Config(workers=1, max_pending=4, max_pending_bytes=2**30, backend="trio", cuda=True)


def S(kind: str, out: str | None, *ops: Any, nowait: bool = False) -> Stmt:
    return Stmt(kind, out, ops, nowait)


def obs(name: str) -> Stmt:
    return S("observe", None, ("H", name))


#: name -> (config, statements, xfail reason or None)
MINIMAL: dict[str, tuple[Config, list[Stmt], str | None]] = {
    "asarray_after_a_task_write": (
        ASYNCIO_1,
        [S("add", "f", B[0], 15), S("t_asarray_await", "t", B[0])],
        None,
    ),
    "asarray_before_a_task_write": (  # the control: the Tensor exists before the write
        ASYNCIO_1,
        [S("t_asarray", "t", B[0]), S("add", "f", B[0], 15), obs("t")],
        None,
    ),
    "tensor_read_after_a_failed_inplace_write": (
        TRIO_4,
        [
            S("t_asarray", "t", B[0]),
            S("t_iop", None, ("T", "t"), "+=", FAILED8),
            S("t_binop", "u", ("T", "t"), "+", 1),
            obs("u"),
        ],
        None,
    ),
    "task_write_after_a_failed_inplace_write": (
        TRIO_4,
        [
            S("t_asarray", "t", B[2]),
            S("t_iop", None, ("T", "t"), "-=", FAILED8),
            S("add", "f", B[2], 5),
            obs("f"),
        ],
        None,
    ),
    "task_write_after_a_failed_task_write_under_a_tensor": (
        ASYNCIO_1,
        [S("t_asarray", "t", ("V", 2, 3)), S("fail_hidden", "f", ("V", 2, 3)), S("add", "g", B[2], 37)],
        None,
    ),
    "task_write_after_a_failed_task_write_no_tensor": (  # the control: no Tensor over the buffer
        ASYNCIO_1,
        [S("fail_hidden", "f", ("V", 2, 3)), S("add", "g", B[2], 37)],
        None,
    ),
    "tensor_write_after_a_failed_task_write": (
        TRIO_4,
        [S("t_asarray", "t", B[1]), S("fail_out", "f", B[1]), S("t_setitem", None, ("T", "t"), 6, 8, 47)],
        None,
    ),
    "to_device_after_a_failed_inplace_write": (
        CUDA_1,
        [
            S("t_arange", "t", 8),
            S("t_iop", None, ("T", "t"), "+=", FAILED8),
            S("k_to", "d", ("T", "t"), "cuda:0"),
            obs("d"),
        ],
        None,
    ),
    "batched_call_then_a_write_of_its_rows": (
        Config(workers=1, max_pending=4, max_pending_bytes=320, backend="trio", cuda=False),
        [
            S("g_def", "g", 0),
            S("g_call", "c1", ("H", "g"), ("R", 1, 0, 2)),
            S("g_call", "c2", ("H", "g"), ("R", 1, 1, 2)),
            S("hidden_write", "f", ("V", 1, 3), nowait=True),
            obs("c2"),
        ],
        None,
    ),
    "batched_float_rows_fast_and_exact": (
        Config(workers=1, max_pending=16, max_pending_bytes=10_000, backend="asyncio", cuda=False),
        [
            S("g_def", "g", 3),  # the default mode: compared within rounding
            S("g_def", "e", 3, True),  # exact=True: compared bit for bit
            S("g_call", "c1", ("H", "g"), ("R", 1, 0, 2)),
            S("g_call", "c2", ("H", "g"), ("R", 2, 1, 2)),
            S("g_call", "c3", ("H", "e"), ("R", 1, 0, 1)),
            S("g_call", "c4", ("H", "e"), ("R", 2, 0, 2)),
            obs("c1"),
            obs("c2"),
            obs("c3"),
            obs("c4"),
        ],
        None,
    ),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=xfail(reason) if reason else ()) for name, (_, _, reason) in MINIMAL.items()],
)
def test_minimal_program(name: str) -> None:
    config, stmts, _ = MINIMAL[name]
    program = Program(seed=-1, families=frozenset(FAMILIES), config=config, stmts=stmts)
    run_reference(stmts)  # a program the contract fixes
    expect_agreement([check(program)])


# -- the tester itself -----------------------------------------------------------------------------------


def test_a_fast_batched_float_result_is_compared_within_rounding_and_an_exact_one_bit_for_bit() -> None:
    from .program import close_outcome, same_outcome, value_outcome

    want = np.array([[0.1, 0.2]])
    off = np.nextafter(want, 1.0)  # one unit in the last place away
    assert same_outcome(value_outcome(off), close_outcome(want))
    assert not same_outcome(value_outcome(off), value_outcome(want))
    assert not same_outcome(value_outcome(want * 1.001), close_outcome(want))
    assert not same_outcome(value_outcome(want.astype(np.float32)), close_outcome(want))  # dtype kept
    assert close_outcome(np.array([1, 2])) == value_outcome(np.array([1, 2]))  # integers: exactly


def test_same_seed_same_program() -> None:
    a = generate(7, set(FAMILIES))
    b = generate(7, set(FAMILIES))
    assert a.listing() == b.listing()
    assert generate(8, set(FAMILIES)).listing() != a.listing()


def test_every_statement_kind_is_generated() -> None:
    """Over a few seeds of all families, every kind of statement appears (so no family is silently empty)."""
    from .program import KINDS

    every = {*FAMILIES, *EXTRA_FAMILIES}
    seen = {s.kind for seed in range(40) for s in generate(seed, every).stmts}
    assert seen == set(KINDS), f"never generated: {sorted(set(KINDS) - seen)}"


def _stmts(*specs: tuple[Any, ...]) -> list[Stmt]:
    return [Stmt(kind, out, ops) for kind, out, ops in specs]


def test_reference_encodes_the_failure_rules() -> None:
    """Hand-checked: a failed in-place Tensor write keeps memory as it was, ``await t`` raises the write's
    error until a later successful write, Tensor reads after it still run, and value-takers fail."""
    t = ("T", "t")
    failed = ("FAILED", None, (8,))
    model = run_reference(
        _stmts(
            ("t_asarray", "t", (("V", 0, 0),)),
            ("t_iop", None, (t, "+=", failed)),  # fails: DependencyError(Injected)
            ("observe", None, (("H", "t"),)),  # raises the write's error
            ("t_binop", "u", (t, "+", 1)),  # a Tensor read: runs on the memory as it was
            ("observe", None, (("H", "u"),)),
            ("t_iop", None, (t, "+=", 2)),  # a later successful write clears the failure
            ("observe", None, (("H", "t"),)),
            ("fail", "f", ()),
            ("value", "g", (("H", "f"), 1)),  # takes a failed value
            ("observe", None, (("H", "g"),)),
        )
    )
    b0 = np.arange(8)
    assert model.outcomes == [
        dep(INJ),
        ("value", "<i8", (8,), ((b0 + 1) % 1009).tolist()),
        ("value", "<i8", (8,), (b0 + 2).tolist()),
        ("error", "DependencyError", "Injected"),
    ]
    assert np.array_equal(model.buffers[0], b0 + 2)


def test_reference_raises_a_failed_write_at_the_next_await_of_its_memory_once() -> None:
    """A failed task write to memory a Tensor lives in: the next ``await t`` raises its error, the one after
    gives the memory as the failed write left it."""
    model = run_reference(
        _stmts(
            ("t_asarray", "t", (("V", 0, 0),)),
            ("fail_out", "f", (("V", 0, 0),)),
            ("observe", None, (("H", "t"),)),
            ("observe", None, (("H", "t"),)),
        )
    )
    assert model.outcomes[-2] == ("error", "Injected", None)
    assert model.outcomes[-1] == ("value", "<i8", (8,), list(range(8)))


def test_compare_reports_a_wrong_value_and_a_wrong_buffer() -> None:
    """The checker is not blind: a tampered engine result is a mismatch."""
    program: Program = generate(3, {"submit"})
    verdict = check(program)
    expect_agreement([verdict])
    model: Model = run_reference(program.stmts)
    tampered = Result(
        outcomes=list(verdict.result.outcomes), buffers=[b.copy() for b in verdict.result.buffers or []]
    )
    tampered.messages = list(verdict.result.messages)
    tampered.outcomes[0] = ("value", "<i8", (), -1)
    assert compare(program, model.outcomes, model.buffers, tampered) is not None
    tampered.outcomes = list(verdict.result.outcomes)
    tampered.buffers[1][0] += 1  # type: ignore[index]
    assert "B1" in (compare(program, model.outcomes, model.buffers, tampered) or "")


def test_a_hang_fails_fast_and_names_the_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement that never finishes is reported as a hang at that statement, within the step timeout."""
    from . import runner

    async def wedged(self: runner.Interpreter, s: Stmt) -> None:
        await anyio.Event().wait()  # never set

    monkeypatch.setattr(runner, "STEP_TIMEOUT", 0.2)
    monkeypatch.setattr(runner.Interpreter, "step", wedged)
    program = generate(5, {"submit"})
    result = runner.run(program)
    assert result.hang
    assert result.failure is not None and result.failure.startswith("hung at statement 0:"), result.failure
