"""The verdicts of ``schedsvc demo``: does an experiment's measurement bear a claim out?

A ``Target`` names the figure that bears a claim out and the value it must
reach (a claim that one way is faster needs ``FASTER``, 1.1x); ``judge`` says
met or missed (or that a figure it needs was not measured), and
``verdict_text`` says so with what may have swayed it: runs on both sides of
the target, or, for a missed timing, a machine whose load average as the runs
began was ``LOADED_SHARE`` of its cores or more.  The value and the target are
printed with the same decimals, as many as it takes for a miss never to read
as a pass.  Nothing here runs an experiment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from ._common import Figures, cores_phrase, figure, figure_digits, meets

__all__ = [
    "AT_ONCE",
    "FASTER",
    "LOADED_SHARE",
    "Checks",
    "Quantity",
    "Target",
    "judge",
    "loaded",
    "verdict_text",
]

Checks = dict[str, Any]
Quantity = Callable[[Figures, Checks], float]

#: A claim that one way is faster is met at this speed-up or more: less is within the run-to-run noise of
#: these experiments (and a claim that something cannot be made faster is met below it).
FASTER = 1.1
#: A claim that a call returns at once is met when the result takes at least this many times as long.
AT_ONCE = 2.0
#: A machine is loaded when its 1-minute load average, as the runs begin, is at least this share of the
#: cores the process may use: other work holds half of them, and timings (speed-ups most) suffer.
LOADED_SHARE = 0.5
#: Decimals enough to tell a value from its target however close they are (a float's own noise aside).
_MOST_DIGITS = 6
_SIGNS = {">=": "≥", "<=": "≤"}


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """When a row's figures bear the book's claim out: ``value op target``, and each of ``holds`` true."""

    what: str  # the value in words: "speed-up"
    value: str | Quantity  # a figure (or check) of the experiment, or how to compute the value
    op: Literal[">=", "<="]
    target: float | Quantity
    unit: str = "x"
    target_words: str = ""  # what a computed target is: "the bound plus a batch"
    timed: bool = True  # a timing, which a loaded machine or noisy runs can sway
    holds: tuple[tuple[str, str], ...] = ()  # (a check that must be true, what it means when it is not)


def judge(
    target: Target, figures: Figures, checks: Checks, spread: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    """Met or missed: the value and the target, the checks that failed, and the range of the value over the
    runs where they fall on both sides of the target (None otherwise).  A figure or check it needs that the
    experiment did not give leaves no verdict: ``met`` None, and ``missing`` names it."""
    try:
        value = _quantity(target.value, figures, checks)
        goal = float(target.target(figures, checks)) if callable(target.target) else float(target.target)
        failed = [words for check, words in target.holds if not checks[check]]
    except KeyError as exc:
        missing = str(exc.args[0])
        return {"met": None, "value": None, "target": None, "failed": [], "astride": None, "missing": missing}
    runs = (spread or {}).get(target.value) if isinstance(target.value, str) else None
    astride = runs is not None and meets(runs[0], target.op, goal) != meets(runs[1], target.op, goal)
    return {
        "met": not failed and meets(value, target.op, goal),
        "value": value,
        "target": goal,
        "failed": failed,
        "astride": list(runs) if astride and runs is not None else None,
        "missing": None,
    }


def _quantity(value: str | Quantity, figures: Figures, checks: Checks) -> float:
    if callable(value):
        return float(value(figures, checks))
    return float(figures[value] if value in figures else checks[value])


def loaded(load: dict[str, Any]) -> bool:
    """Was the machine loaded as the runs began (see ``LOADED_SHARE``)?"""
    before = load.get("before")
    return before is not None and before >= LOADED_SHARE * load["cores"]


def verdict_text(target: Target, judged: dict[str, Any], load: dict[str, Any]) -> str:
    """The verdict in words, with what may have swayed it: 'missed: speed-up 0.94x, the claim needs
    ≥ 1.10x — the machine was loaded: load average 3.1 on 2 cores'."""
    if judged.get("missing"):
        return f"no verdict: {judged['missing']} not measured"
    runs = judged["astride"] or []
    digits = _digits(target.op, judged["target"], [judged["value"], *runs])
    sign = _SIGNS[target.op]
    v, t = (_amount(x, target.unit, digits) for x in (judged["value"], judged["target"]))
    of = f" ({target.target_words})" if target.target_words else ""
    if judged["failed"]:
        text = "missed: " + "; ".join(judged["failed"])
    elif judged["met"]:
        text = f"met: {target.what} {v} {sign} {t}{of}"
    else:
        text = f"missed: {target.what} {v}, the claim needs {sign} {t}{of}"
    notes = _swayed(target, judged, load, [_amount(x, target.unit, digits) for x in runs], t)
    return text + (" — " + "; ".join(notes) if notes else "")


def _swayed(
    target: Target, judged: dict[str, Any], load: dict[str, Any], runs: list[str], t: str
) -> list[str]:
    """What may have swayed a verdict: runs (printed) on both sides of the target ``t``, a loaded machine."""
    notes = []
    if runs:
        notes.append(f"noisy: the runs ranged {runs[0]} to {runs[1]}, on both sides of {t}")
    if target.timed and not judged["met"] and loaded(load):
        notes.append(
            f"the machine was loaded: load average {load['before']:.1f} on {cores_phrase(load['cores'])}"
        )
    return notes


def _digits(op: str, target: float, values: list[float]) -> int:
    """Decimals for a target and the values shown beside it, the same for all: none where all are whole,
    else those the first value deserves, and more until each value that misses the target prints apart
    from it (so that a miss never reads as a pass)."""
    if all(float(x).is_integer() for x in (target, *values)):
        return 0
    digits = figure_digits(values[0])
    while digits < _MOST_DIGITS and any(
        not meets(x, op, target) and figure(x, digits) == figure(target, digits) for x in values
    ):
        digits += 1
    return digits


def _amount(x: float, unit: str, digits: int) -> str:
    """A value with ``digits`` decimals and its unit: '1.10x', '18.0 MiB'."""
    number = figure(x, digits)
    return f"{number}{unit}" if unit in ("x", "") else f"{number} {unit}"
