"""The choice of ``schedsvc tune``, a pure function of the sweep's figures, and the budgets it reads.

``choose`` judges each measured setting against a ``Goal`` (budgets on p99
latency and peak memory): of the settings that meet the budgets, the smallest
(fewest workers, then smallest depth) whose throughput is within noise of the
fastest such setting (highest median) is chosen, where within noise means that
the upper quartile of its runs reaches the fastest's lower quartile.
Quartiles rather than the runs' range, so that one stray run in five neither
widens nor narrows the band; written here rather than taken from pyperf,
which would be a dependency for a median and two quartiles.  With one run per
setting there is no spread, and the fastest setting wins; with two, the
quartiles lie a quarter of the way in from each run, so the judgement rests on
those two runs.  With no setting within budget, nothing is chosen and the
closest setting (the smallest worst ratio of figure to budget) is named.

Nothing here runs a workload or imports NumPy: the tests feed it made-up figures.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ._common import MiB, short

__all__ = [
    "Choice",
    "Goal",
    "Judged",
    "Measured",
    "TuneError",
    "choose",
    "parse_latency",
    "parse_memory",
    "quartiles",
]


class TuneError(Exception):
    """A bad argument or workload spec (the message says what to change), or a workload that failed."""


# -- the goal and the choice ------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """The budgets a chosen setting must meet; None: no budget on that figure."""

    max_latency_ms: float | None = None  # on the p99 latency per item
    max_memory_bytes: int | None = None  # on the peak memory of a run (tracemalloc)

    def words(self) -> str:
        """The budgets in words: 'p99 ≤ 50 ms, peak memory ≤ 64 MiB', or 'no budget'."""
        parts = []
        if self.max_latency_ms is not None:
            parts.append(f"p99 ≤ {_ms(self.max_latency_ms)}")
        if self.max_memory_bytes is not None:
            parts.append(f"peak memory ≤ {_mib(self.max_memory_bytes / MiB)}")
        return ", ".join(parts) or "no budget"


@dataclass(frozen=True)
class Measured:
    """What the sweep measured at one setting, as the choice sees it."""

    workers: int
    depth: int
    throughput: tuple[float, ...]  # items/s of each timed run
    p99_ms: float | None  # the median over the runs of each run's p99; None: the workload has no latency
    peak_bytes: float  # peak memory of the traced run


@dataclass(frozen=True)
class Judged:
    """One setting judged: its throughput's median and quartiles, the budgets it misses, and how it
    compares with the fastest setting that meets the budgets."""

    setting: Measured
    median: float
    low: float  # lower quartile of the runs' throughputs
    high: float  # upper quartile
    over: tuple[str, ...]  # the budgets it misses, in words ('p99 477 ms > 50 ms')
    of_best: float | None = (
        None  # its median over the best's; None when none meets the budgets or the best's is 0
    )
    within_noise: bool = False  # its upper quartile reaches the best's lower quartile

    @property
    def meets(self) -> bool:
        return not self.over


@dataclass(frozen=True)
class Choice:
    """The outcome of ``choose``: the chosen setting (None: none meets the budgets), the fastest that meets
    them, the one closest to them when none does, every setting judged, and why, in words."""

    chosen: Judged | None
    best: Judged | None
    closest: Judged | None
    judged: list[Judged]
    why: str


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``values`` (one value: that value three times)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def choose(measured: Sequence[Measured], goal: Goal = Goal()) -> Choice:
    """Among the settings that meet the goal's budgets, the smallest (fewest workers, then smallest
    max_pending) whose throughput is within noise of the best: its runs' upper quartile reaches the
    lower quartile of the runs of the fastest setting (highest median) that meets the budgets."""
    if not measured:
        raise ValueError("choose() needs at least one measured setting")
    judged = [_judge(m, goal) for m in sorted(measured, key=lambda m: (m.workers, m.depth))]
    eligible = [j for j in judged if j.meets]
    if not eligible:
        closest = min(judged, key=lambda j: (_excess(j.setting, goal), -j.median))
        return Choice(None, None, closest, judged, _why_none(closest, goal))
    best = max(eligible, key=lambda j: j.median)  # the first of equal medians: the smaller setting
    judged = [_against(j, best) for j in judged]
    chosen = next(j for j in judged if j.meets and j.within_noise)
    best = next(j for j in judged if j.setting == best.setting)
    return Choice(chosen, best, None, judged, _why(chosen, best, goal))


def _judge(m: Measured, goal: Goal) -> Judged:
    bad = [t for t in m.throughput if not (math.isfinite(t) and t >= 0)]
    if not m.throughput or bad:
        raise ValueError(f"choose(): throughputs must be finite and non-negative, got {list(m.throughput)}")
    if goal.max_latency_ms is not None and m.p99_ms is None:
        raise ValueError("choose(): a latency budget needs a p99 latency for every setting")
    low, median, high = quartiles(m.throughput)
    over = []
    if goal.max_latency_ms is not None and m.p99_ms is not None and m.p99_ms > goal.max_latency_ms:
        over.append(f"p99 {_ms(m.p99_ms)} > {_ms(goal.max_latency_ms)}")
    if goal.max_memory_bytes is not None and m.peak_bytes > goal.max_memory_bytes:
        over.append(f"peak {_mib(m.peak_bytes / MiB)} > {_mib(goal.max_memory_bytes / MiB)}")
    return Judged(m, median, low, high, tuple(over))


def _against(j: Judged, best: Judged) -> Judged:
    return replace(j, of_best=_share(j.median, best.median), within_noise=j.high >= best.low)


def _share(median: float, best: float) -> float | None:
    """A median as a share of the best's; None where the best's is 0 and this one's is not (no share of
    nothing)."""
    if best > 0:
        return median / best
    return 1.0 if median == 0 else None


def _excess(m: Measured, goal: Goal) -> float:
    """How far a setting is over its budgets: the largest of its figure-over-budget ratios."""
    ratios = [0.0]
    if goal.max_latency_ms is not None and m.p99_ms is not None:
        ratios.append(m.p99_ms / goal.max_latency_ms)
    if goal.max_memory_bytes is not None:
        ratios.append(m.peak_bytes / goal.max_memory_bytes)
    return max(ratios)


def _setting(m: Measured) -> str:
    return f"cpu_workers={m.workers}, max_pending={m.depth}"


def _budget_words(j: Judged, goal: Goal) -> str:
    """The figures a goal bounds, against their budgets: 'p99 14.7 ms ≤ 50 ms; peak 5.0 MiB'."""
    m = j.setting
    latency = "" if m.p99_ms is None else f"p99 {_ms(m.p99_ms)}"
    if latency and goal.max_latency_ms is not None:
        latency += f" ≤ {_ms(goal.max_latency_ms)}"
    memory = f"peak {_mib(m.peak_bytes / MiB)}"
    if goal.max_memory_bytes is not None:
        memory += f" ≤ {_mib(goal.max_memory_bytes / MiB)}"
    return "; ".join(p for p in (latency, memory) if p)


def _why(chosen: Judged, best: Judged, goal: Goal) -> str:
    fastest = "the fastest setting" + ("" if goal == Goal() else " within budget")
    if chosen.setting == best.setting:
        speed = f"{fastest}, {chosen.median:,.0f} items/s"
    else:
        speed = (
            f"{chosen.of_best:.0%} of the items/s of {fastest} ({_setting(best.setting)}: "
            f"{best.median:,.0f} items/s), within noise: its runs' upper quartile, {chosen.high:,.0f} "
            f"items/s, reaches the fastest's lower quartile, {best.low:,.0f}"
        )
    return f"{_setting(chosen.setting)}: {speed}; {_budget_words(chosen, goal)}"


def _why_none(closest: Judged, goal: Goal) -> str:
    return (
        f"no setting meets the budgets ({goal.words()}); the closest is {_setting(closest.setting)}: "
        f"{', '.join(closest.over)}, {closest.median:,.0f} items/s"
    )


def _ms(value: float) -> str:
    return short(value, "ms")


def _mib(value: float) -> str:
    return short(value, "MiB")


# -- budgets from the command line -----------------------------------------------------------------

_TIME_UNITS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
_LATENCY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s)\s*")


def parse_latency(text: str) -> float:
    """A latency budget such as '50ms', '0.2s' or '500us', in milliseconds."""
    match = _LATENCY.fullmatch(text)
    if match is None or float(match[1]) <= 0:
        raise TuneError(
            f"--max-latency takes a positive time with its unit, e.g. 50ms, 0.2s or 500us; got {text!r}"
        )
    return float(match[1]) * _TIME_UNITS[match[2]]


def parse_memory(text: str) -> int:
    """A memory budget such as '64MiB' or '1GB', in bytes (read as the settings read sizes)."""
    from .._config import byte_count

    try:
        size = byte_count(text)
    except ValueError as exc:
        raise TuneError(f"--max-memory: {exc}") from exc
    if size < 1:
        raise TuneError(f"--max-memory must be positive, e.g. 64MiB; got {text!r}")
    return size
