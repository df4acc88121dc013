"""Compare a program's run on the engine with the reference; minimize a mismatching program."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .program import Outcome, Program, Rejected, Stmt, generate, run_reference, same_outcome, show
from .runner import OBSERVING, Result, run


@dataclass
class Verdict:
    program: Program
    mismatch: str | None  # None: the engine agreed with sequential NumPy
    hang: bool
    result: Result

    def report(self) -> str:
        return f"{self.mismatch}\n{self.program.listing()}"

    def short(self) -> str:
        """The mismatch and the statements that can have led to it (a backward slice of the program)."""
        return f"{self.mismatch}\n{self.program.listing(keep=relevant(self.program, self.mismatch or ''))}"


def buffers_of(s: Stmt) -> set[int]:
    found: set[int] = set()

    def walk(x: object) -> None:
        if isinstance(x, tuple) and x and x[0] in ("V", "R") and isinstance(x[1], int):
            found.add(x[1])
        if isinstance(x, tuple | list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(s.ops)
    return found


def relevant(program: Program, mismatch: str) -> set[int]:
    """The statements a mismatch can depend on: the observing statement, and going back, every statement
    that defines, uses or shares a buffer with something already kept (an over-approximation)."""
    stmts = program.stmts
    m = re.match(r"statement (\d+) ", mismatch)
    b = re.match(r"final buffer B(\d+)", mismatch)
    if m:
        last = int(m.group(1))
        handles, bufs = (
            stmts[last].uses() | ({stmts[last].out} if stmts[last].out else set()),
            buffers_of(stmts[last]),
        )
    elif b:
        last, handles, bufs = len(stmts) - 1, set(), {int(b.group(1))}
    else:
        return set(range(len(stmts)))
    keep = {last}
    grew = True
    while grew:  # to a fixed point: a buffer met early matters for the statements after it too
        grew = False
        for j in range(last - 1, -1, -1):
            s = stmts[j]
            if j not in keep and ((s.out in handles) or (s.uses() & handles) or (buffers_of(s) & bufs)):
                keep.add(j)
                handles |= s.uses() | ({s.out} if s.out else set())
                bufs |= buffers_of(s)
                grew = True
    return keep


def describe(outcome: Outcome | None) -> str:
    if outcome is None:
        return "nothing"
    if outcome[0] == "value":
        return f"value {outcome[3]} (dtype {outcome[1]})"
    if outcome[0] == "close":
        return f"value {outcome[3]} (dtype {outcome[1]}), to within rounding"
    if outcome[0] == "error":
        return f"{outcome[1]}" + (f" (cause {outcome[2]})" if outcome[2] else "")
    values = ", ".join(describe(v) for v in outcome[1])
    return f"map [{values}]" + (f" then {describe(outcome[2])}" if outcome[2] else "")


def origin(program: Program, i: int) -> str:
    """For an observation of a handle: the statement that made it."""
    s = program.stmts[i]
    if s.kind != "observe":
        return ""
    name = s.ops[0][1]
    made = next(j for j, t in enumerate(program.stmts) if t.out == name)
    return f" ({name} from statement {made}, a {program.stmts[made].kind})"


def compare(
    program: Program, expected_outcomes: list[Outcome], expected_buffers: list[np.ndarray], got: Result
) -> str | None:
    """The first difference between the engine's run and the reference, in words (None: none)."""
    observing = [i for i, s in enumerate(program.stmts) if s.kind in OBSERVING]
    for n, (got_o, want_o) in enumerate(zip(got.outcomes, expected_outcomes, strict=False)):
        if not same_outcome(got_o, want_o):
            i = observing[n]
            message = got.messages[n]
            return (
                f"statement {i} `{show(program.stmts[i])}`{origin(program, i)}: the engine gave "
                f"{describe(got_o)}; sequential NumPy gives {describe(want_o)}"
                + (f" || the engine's error: {message[:300]}" if message else "")
            )
    if got.failure is not None:
        return got.failure
    for k, (g, w) in enumerate(zip(got.buffers or [], expected_buffers, strict=True)):
        if not (g.dtype == w.dtype and np.array_equal(g, w)):
            return f"final buffer B{k}: the engine left {g.tolist()}, sequential NumPy leaves {w.tolist()}"
    return None


def check(program: Program) -> Verdict:
    model = run_reference(program.stmts)
    got = run(program)
    return Verdict(program, compare(program, model.outcomes, model.buffers, got), got.hang, got)


def key(verdict: Verdict) -> str:
    """The shape of a mismatch, kept while minimizing: what was observed (and what made it), and what the
    engine gave instead -- not which statement or which values."""
    text = verdict.mismatch or ""
    m = re.match(r"statement (\d+) .*?: the engine gave (\S+)", text)
    if m:
        s = verdict.program.stmts[int(m.group(1))]
        made = origin(verdict.program, int(m.group(1))).split(", a ")[-1].rstrip(")")
        return f"{s.kind}/{made}/{m.group(2)}"
    if text.startswith("final buffer"):
        return "final buffer"
    return text.split(":")[0]


def check_seed(seed: int, families: frozenset[str] | set[str], length: int | None = None) -> Verdict:
    return check(generate(seed, families, length))


def without(stmts: list[Stmt], drop: set[int]) -> list[Stmt]:
    """``stmts`` less the statements in ``drop`` and every statement that uses a handle they define."""
    gone: set[str] = set()
    kept = []
    for i, s in enumerate(stmts):
        if i in drop or s.uses() & gone:
            if s.out:
                gone.add(s.out)
            continue
        kept.append(s)
    return kept


def valid(stmts: list[Stmt]) -> bool:
    try:
        run_reference(stmts)
    except Rejected:
        return False
    return True


def minimize(
    verdict: Verdict, budget: int = 40, tries: int = 2, log: Callable[[str], None] | None = None
) -> Verdict:
    """A shorter program that still mismatches the same way (``key``): greedy, dropping chunks, then single
    statements, within ``budget`` engine runs; each candidate runs up to ``tries`` times (some mismatches
    depend on timing)."""
    best = verdict
    runs = 0
    wanted = key(verdict)

    def still_fails(stmts: list[Stmt]) -> Verdict | None:
        nonlocal runs
        program = replace(best.program, stmts=stmts)
        for _ in range(tries):
            if runs >= budget:
                return None
            runs += 1
            v = check(program)
            if v.mismatch is not None and key(v) == wanted:
                return v
        return None

    chunk = max(1, len(best.program.stmts) // 2)
    while chunk >= 1 and runs < budget:
        i = 0
        while i < len(best.program.stmts) and runs < budget:
            stmts = without(best.program.stmts, set(range(i, i + chunk)))
            if len(stmts) < len(best.program.stmts) and valid(stmts):
                v = still_fails(stmts)
                if v is not None:
                    best = v
                    if log:
                        log(f"  minimized to {len(stmts)} statements")
                    continue
            i += chunk
        chunk //= 2
    return best
