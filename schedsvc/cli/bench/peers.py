"""``schedsvc bench gpu --peers``: the sources' workloads on schedsvc, raw CuPy, PyTorch and JAX.

Each repetition runs every system in a process of its own (``_peer.py``), in alternating order from one
repetition to the next; a system that does not import or sees no GPU is reported as such.  Figures are
medians over the repetitions, each ratio is taken within a repetition, and every system's results are
checked against a float64 NumPy reference (a system that computed something else fails the run).

The goals it reports, on one machine and in one run: P1 at most 1.2x raw CuPy, P2 at most 1.5x raw CuPy,
P3 eager at most 1.5x raw CuPy, P3 compiled at most 2x PyTorch's CUDA graph, P4 batched at least raw
CuPy's hand-written batcher (P4b) and at least 5x PyTorch through ``to_thread``, P5 p50 at most 1.2x
PyTorch through ``to_thread``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .._common import meets, target_mark
from ._peer import FULL, SYSTEMS, TINY, reference

__all__ = ["ROWS", "TARGETS", "format_report", "run"]

_TIMEOUT_S = 600.0  # one system's process, every workload (a bound, never a pause)

#: the table's rows: (label, workload, figure, unit, higher is better)
ROWS: list[tuple[str, str, str, str, bool]] = [
    ("P1 chain of y = y + 1, one wait", "p1", "us_per_op", "µs/op", False),
    ("P2 (randn, matmul) pairs: finish", "p2", "finish_ms", "ms", False),
    ("P3 MLP batch 1, eager", "p3", "eager_us_per_call", "µs/call", False),
    ("P3 MLP batch 1, compiled/graph/jit", "p3", "compiled_us_per_call", "µs/call", False),
    ("P4 coroutines, to_thread", "p4", "to_thread_calls_per_s", "calls/s", True),
    ("P4 coroutines, eng.compile", "p4", "compiled_calls_per_s", "calls/s", True),
    ("P4 coroutines, batched", "p4", "batched_calls_per_s", "calls/s", True),
    ("P4b hand-written batcher", "p4b", "batcher_calls_per_s", "calls/s", True),
    ("P5 one coroutine: p50", "p5", "p50_us", "µs", False),
]


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """schedsvc's ``figure`` of ``workload`` against ``peer``'s ``peer_figure``: their ratio ``op`` bound."""

    label: str
    workload: str
    figure: str
    peer: str
    peer_workload: str
    peer_figure: str
    op: str
    bound: float


_EAGER, _GRAPHED, _BATCHED = "eager_us_per_call", "compiled_us_per_call", "batched_calls_per_s"
TARGETS = [
    Target("P1 / raw CuPy", "p1", "us_per_op", "cupy", "p1", "us_per_op", "<=", 1.2),
    Target("P2 / raw CuPy", "p2", "finish_ms", "cupy", "p2", "finish_ms", "<=", 1.5),
    Target("P3 eager / raw CuPy", "p3", _EAGER, "cupy", "p3", _EAGER, "<=", 1.5),
    Target("P3 compiled / PyTorch CUDA graph", "p3", _GRAPHED, "torch", "p3", _GRAPHED, "<=", 2.0),
    Target(
        "P4 batched / CuPy batcher (P4b)", "p4", _BATCHED, "cupy", "p4b", "batcher_calls_per_s", ">=", 1.0
    ),
    Target(
        "P4 batched / PyTorch to_thread", "p4", _BATCHED, "torch", "p4", "to_thread_calls_per_s", ">=", 5.0
    ),
    Target("P5 p50 / PyTorch to_thread", "p5", "p50_us", "torch", "p5", "p50_us", "<=", 1.2),
]


def _measure(system: str, tiny: bool, simulate: bool) -> dict[str, Any]:
    """One system's workloads, in a process of its own."""
    argv = [sys.executable, "-m", "schedsvc.cli.bench._peer", system]
    argv += ["--tiny"] * tiny + ["--simulate"] * simulate
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"system": system, "available": False, "reason": f"did not finish within {_TIMEOUT_S:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"system": system, "available": False, "reason": f"failed (exit {done.returncode}): {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(
    reps: int = 3,
    progress: Callable[[str], None] | None = None,
    *,
    simulate: bool = False,
    systems: tuple[str, ...] = SYSTEMS,
    tiny: bool = False,
) -> dict[str, Any]:
    """Every system's workloads ``reps`` times, a process each, alternating their order; medians, ratios,
    checks and goals.  ``simulate`` (tests only): tiny sizes on the CUDA simulator; ``tiny``: tiny sizes."""
    tiny = tiny or simulate
    sizes = TINY if tiny else FULL
    rounds: list[dict[str, dict[str, Any]]] = []
    for rep in range(reps):
        order = systems if rep % 2 == 0 else tuple(reversed(systems))
        measured = {}
        for system in order:
            measured[system] = _measure(system, tiny, simulate)
            if progress is not None:
                progress(f"rep {rep + 1}/{reps} {system}")
        rounds.append(measured)
    return _report(rounds, systems, sizes, simulate)


def _report(
    rounds: list[dict[str, dict[str, Any]]], systems: tuple[str, ...], sizes: Any, simulate: bool
) -> dict[str, Any]:
    available = {s: all(r[s]["available"] for r in rounds) for s in systems}
    reasons = {
        s: next(r[s]["reason"] for r in rounds if not r[s]["available"]) for s in systems if not available[s]
    }
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for system in (s for s in systems if available[s]):
        figures[system] = {}
        for workload in rounds[0][system]["figures"]:
            names = rounds[0][system]["figures"][workload]
            figures[system][workload] = {
                name: statistics.median(r[system]["figures"][workload][name] for r in rounds)
                for name in names
            }
    return {
        "simulated": simulate,
        "reps": len(rounds),
        "sizes": dataclasses.asdict(sizes),
        "systems": {s: {"available": available[s], "reason": reasons.get(s)} for s in systems},
        "figures": figures,
        "checks": _checks(rounds, systems, available, sizes),
        "targets": [_target(t, rounds, available, simulate) for t in TARGETS],
    }


def _checks(
    rounds: list[dict[str, dict[str, Any]]], systems: tuple[str, ...], available: dict[str, bool], sizes: Any
) -> dict[str, Any]:
    """Each system's results against the float64 reference: exact for P1's count, within float32's
    rounding (relative 1e-3) for the MLP's sums; P2's random matrices by their shape."""
    want = reference(sizes)
    wrong = []
    for rnd in rounds:
        for system in (s for s in systems if available[s]):
            for workload, got in rnd[system]["checks"].items():
                expected = want[workload]
                if abs(got - expected) > 1e-3 * max(1.0, abs(expected)):
                    wrong.append(f"{system} {workload}: {got} (expected {expected})")
    return {"ok": not wrong, "wrong": wrong}


def _target(
    target: Target, rounds: list[dict[str, dict[str, Any]]], available: dict[str, bool], simulate: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"label": target.label, "goal": f"{target.op} {target.bound:g}"}
    if not available.get("schedsvc") or not available.get(target.peer):
        return out | {"ratio": None, "met": None, "reason": f"{target.peer} not measured"}
    ratios = [
        r["schedsvc"]["figures"][target.workload][target.figure]
        / r[target.peer]["figures"][target.peer_workload][target.peer_figure]
        for r in rounds
    ]
    ratio = statistics.median(ratios)
    met = None if simulate else meets(ratio, target.op, target.bound)
    return out | {"ratio": ratio, "ratio_range": [min(ratios), max(ratios)], "met": met}


def format_report(report: dict[str, Any]) -> str:
    systems = list(report["systems"])
    sim = " -- simulated: not timed as real" if report["simulated"] else ""
    lines = [f"schedsvc bench gpu --peers: median of {report['reps']} runs, a process per system{sim}"]
    for system, state in report["systems"].items():
        if not state["available"]:
            lines.append(f"  {system}: not measured: {state['reason']}")
    lines.append(f"  {'':40s}" + "".join(f"{s:>12s}" for s in systems))
    for label, workload, figure, unit, _ in ROWS:
        cells = []
        for system in systems:
            value = report["figures"].get(system, {}).get(workload, {}).get(figure)
            cells.append(f"{value:12.4g}" if value is not None else f"{'—':>12s}")
        lines.append(f"  {label:40s}" + "".join(cells) + f"  {unit}")
    checks = report["checks"]
    lines.append(
        "  results: "
        + (
            "every system agrees with the float64 reference"
            if checks["ok"]
            else "WRONG: " + "; ".join(checks["wrong"])
        )
    )
    for t in report["targets"]:
        if t["ratio"] is None:
            lines.append(f"  {t['label']:40s} {t['reason']}")
            continue
        mark = "sim " if t["met"] is None else target_mark(t["met"])
        lines.append(f"  {t['label']:40s} {t['ratio']:7.3g}x  goal {t['goal']:6s} [{mark}]")
    return "\n".join(lines)
