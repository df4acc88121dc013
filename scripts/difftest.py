"""Long mode of the differential tester (tests/differential): thousands of random programs against NumPy.

    python scripts/difftest.py --programs 5000 --families all --seed 1
    python scripts/difftest.py --programs 400 --families batched,tensor_failures
    python scripts/difftest.py --replay 19 --families tensor_failures     # one program, minimized

``--families`` takes names of the CI feature sets (``all``: every one of them) or, with ``+``, a set of
families of its own (``tensor+failures+views``).  Programs are spread round-robin over the sets, seeds
counting up from ``--seed``.  Each mismatch is printed as it is found (seed, set, diagnosis).  At the end:
the mismatches grouped by what went wrong, each with its seed, families and a replay command, and a program
listing -- minimized for the first ``--minimize`` of each group, sliced (the statements it can depend on)
for the others; then per feature set and per family, the programs run, mismatches and hangs.  Exit status 1
when any program mismatched.  Run it from the repository root (or with it on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.differential.check import Verdict, check_seed, minimize
from tests.differential.program import EXTRA_FAMILIES, FAMILIES, KINDS
from tests.differential.test_differential import FEATURE_SETS


def feature_sets(spec: str) -> dict[str, frozenset[str]]:
    if spec == "all":
        return {name: fams for name, (fams, _) in FEATURE_SETS.items()}
    sets: dict[str, frozenset[str]] = {}
    for name in spec.split(","):
        if name in FEATURE_SETS:
            sets[name] = FEATURE_SETS[name][0]
        else:
            fams = frozenset(name.split("+"))
            unknown = fams - {*FAMILIES, *EXTRA_FAMILIES}
            if unknown:
                raise SystemExit(
                    f"unknown feature set or family {sorted(unknown)}: sets {sorted(FEATURE_SETS)}, families {(*FAMILIES, *EXTRA_FAMILIES)}"
                )
            sets[name] = fams
    return sets


def signature(verdict: Verdict) -> str:
    """What went wrong, without names and numbers: mismatches with one signature are likely one bug."""
    text = (verdict.mismatch or "").split(" || ")[0]
    if text.startswith("statement"):
        observed = re.sub(r"^statement \d+ `(.*?)`", lambda m: "`" + m.group(1) + "`", text)
        observed = re.sub(r"\b(?:f|t|c|g|x|call)\d+\b", "h", observed)
        observed = re.sub(r"value \[.*?\] \(dtype", "value [..] (dtype", observed)
        observed = re.sub(r"from statement \d+", "from", observed)
        text = re.sub(r"-?\d+", "N", observed)
    else:
        text = re.sub(r"\[[-\d, ]*\]", "[..]", text)
    return text[:220]


def used_families(verdict: Verdict) -> set[str]:
    """The families whose statements (or, for views, operands) the program has."""
    used: set[str] = set().union(*(KINDS[s.kind] for s in verdict.program.stmts))
    if any(
        f"'V', {k}, {v})" in repr(s.ops) for s in verdict.program.stmts for k in range(3) for v in range(1, 9)
    ):
        used.add("views")
    return used


def replay(seed: int, families: frozenset[str], name: str, length: int | None) -> int:
    verdict = check_seed(seed, families, length)
    print(verdict.program.listing())
    if verdict.mismatch is None:
        print("\nno mismatch")
        return 0
    print(f"\nMISMATCH: {verdict.mismatch}\n\nminimizing...")
    small = minimize(verdict, budget=80, log=print)
    print(small.report())
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--programs", type=int, default=1000, help="programs in all (default 1000)")
    parser.add_argument("--families", default="all", help="feature sets (comma separated), or all")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--length", type=int, default=None, help="statements per program (default 15-40)")
    parser.add_argument(
        "--minimize", type=int, default=2, help="mismatches minimized per group (others: sliced)"
    )
    parser.add_argument("--replay", type=int, default=None, help="run this one seed, list and minimize it")
    args = parser.parse_args()
    sets = feature_sets(args.families)
    if args.replay is not None:
        name, fams = next(iter(sets.items()))
        return replay(args.replay, fams, name, args.length)

    runs: Counter[str] = Counter()
    bad: dict[str, list[Verdict]] = defaultdict(list)
    hangs: Counter[str] = Counter()
    fam_runs: Counter[str] = Counter()
    fam_bad: Counter[str] = Counter()
    fam_hangs: Counter[str] = Counter()
    start = time.monotonic()
    names = list(sets)
    for n in range(args.programs):
        name = names[n % len(names)]
        seed = args.seed + n // len(names)
        verdict = check_seed(seed, sets[name], args.length)
        runs[name] += 1
        used = used_families(verdict)
        for fam in used:
            fam_runs[fam] += 1
        if verdict.mismatch is not None:
            bad[name].append(verdict)
            for fam in used:
                fam_bad[fam] += 1
                fam_hangs[fam] += verdict.hang
            hangs[name] += verdict.hang
            print(
                f"MISMATCH seed {seed} [{name}: {'+'.join(sorted(sets[name]))}]{' HANG' if verdict.hang else ''}: {verdict.mismatch[:400]}",
                flush=True,
            )
        if (n + 1) % 200 == 0:
            print(
                f"... {n + 1} programs, {sum(len(v) for v in bad.values())} mismatches, {time.monotonic() - start:.0f} s",
                flush=True,
            )

    print(
        f"\n{'=' * 100}\nMismatches grouped by what went wrong (the first {args.minimize} of each group minimized)"
    )
    groups: dict[str, list[tuple[str, Verdict]]] = defaultdict(list)
    for name, verdicts in bad.items():
        for v in verdicts:
            groups[signature(v)].append((name, v))
    for sig, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        sets_seen = sorted({name for name, _ in members})
        print(f"\n### {len(members)} x {sig}\n    sets: {', '.join(sets_seen)}")
        for n, (name, verdict) in enumerate(members):
            fams = "+".join(sorted(verdict.program.families))
            print(
                f"\n--- seed {verdict.program.seed}, set {name} ({fams}); replay: "
                f"python scripts/difftest.py --replay {verdict.program.seed} --families {name}"
            )
            if n < args.minimize:
                small = minimize(verdict)
                print(f"minimized, {len(verdict.program.stmts)} -> {len(small.program.stmts)} statements:")
                print(small.report())
            else:
                print(verdict.short())

    print(f"\n{'=' * 100}\n{'feature set':28s} {'programs':>9s} {'mismatches':>11s} {'hangs':>6s}  families")
    for name in names:
        print(
            f"{name:28s} {runs[name]:9d} {len(bad[name]):11d} {hangs[name]:6d}  {'+'.join(sorted(sets[name]))}"
        )
    print(f"\n{'family (programs using it)':28s} {'programs':>9s} {'mismatches':>11s} {'hangs':>6s}")
    for fam in (*FAMILIES, *EXTRA_FAMILIES):
        print(f"{fam:28s} {fam_runs[fam]:9d} {fam_bad[fam]:11d} {fam_hangs[fam]:6d}")
    total_bad = sum(len(v) for v in bad.values())
    print(
        f"\n{args.programs} programs, {total_bad} mismatches, {sum(hangs.values())} hangs, {time.monotonic() - start:.0f} s"
    )
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
