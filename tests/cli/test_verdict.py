"""The verdicts of ``schedsvc demo`` on its rows' targets: met or missed, printed so that a miss never reads as a
pass, what may have swayed them, and no verdict where a figure was not measured."""

from __future__ import annotations

from typing import Any

import pytest

from schedsvc.cli._verdict import FASTER, Target, judge, loaded, verdict_text
from schedsvc.cli.demo import SECTIONS, Row

ALL_ROWS = [row for _, rows in SECTIONS for row in rows]
IDLE = {"before": 0.2, "after": 1.9, "cores": 2}
LOADED = {"before": 3.1, "after": 3.4, "cores": 2}


def _row(experiment: str, label_part: str = "") -> Row:
    return next(r for r in ALL_ROWS if r.experiment == experiment and label_part in r.label)


def _verdict(
    row: Row,
    figures: dict[str, float],
    checks: dict[str, Any] | None = None,
    spread: dict[str, list[float]] | None = None,
    load: dict[str, Any] = IDLE,
) -> str:
    assert row.target is not None
    return verdict_text(row.target, judge(row.target, figures, checks or {}, spread), load)


def test_every_measured_row_has_a_verdict_on_its_claim() -> None:
    assert all(row.target is not None for row in ALL_ROWS)


def test_a_parallel_speed_up_below_the_claim_on_a_loaded_machine_is_missed_and_says_so() -> None:
    """A speed-up below the claim's is missed, and a loaded machine is named as what may have swayed it."""
    row = _row("parallel", "independent")
    figures = {"independent_speedup": 0.94}
    assert _verdict(row, figures, spread={"independent_speedup": [0.9, 0.97]}, load=LOADED) == (
        "missed: speed-up 0.94x, the claim needs ≥ 1.10x — the machine was loaded: load average 3.1 on 2 cores"
    )
    assert _verdict(row, figures, spread={"independent_speedup": [0.9, 0.97]}) == (
        "missed: speed-up 0.94x, the claim needs ≥ 1.10x"
    )


def test_a_met_claim_says_by_how_much_and_a_loaded_machine_does_not_undo_it() -> None:
    row = _row("parallel", "independent")
    assert _verdict(row, {"independent_speedup": 1.85}, load=LOADED) == "met: speed-up 1.85x ≥ 1.10x"
    assert _verdict(_row("parallel", "chain"), {"chain_speedup": 1.02}) == "met: speed-up 1.02x ≤ 1.10x"


def test_runs_on_both_sides_of_the_target_are_called_noisy() -> None:
    row = _row("parallel", "independent")
    spread = {"independent_speedup": [0.8, 1.3]}
    assert _verdict(row, {"independent_speedup": 0.94}, spread=spread) == (
        "missed: speed-up 0.94x, the claim needs ≥ 1.10x — noisy: the runs ranged 0.80x to 1.30x, on both "
        "sides of 1.10x"
    )
    assert _verdict(row, {"independent_speedup": 1.2}, spread=spread, load=LOADED) == (
        "met: speed-up 1.20x ≥ 1.10x — noisy: the runs ranged 0.80x to 1.30x, on both sides of 1.10x"
    )
    assert _verdict(row, {"independent_speedup": 0.94}, spread=spread, load=LOADED) == (
        "missed: speed-up 0.94x, the claim needs ≥ 1.10x — noisy: the runs ranged 0.80x to 1.30x, on both "
        "sides of 1.10x; the machine was loaded: load average 3.1 on 2 cores"
    )


def test_a_computed_target_is_named_and_memory_is_not_blamed_on_the_load() -> None:
    row = _row("memory", "max_pending_bytes")
    figures = {"bounded_peak_mib": 12.02, "bound_mib": 16.0, "batch_mib": 2.0}
    assert _verdict(row, figures) == "met: peak 12.0 MiB ≤ 18.0 MiB (the bound plus a batch)"
    over = figures | {"bounded_peak_mib": 40.0}
    assert _verdict(row, over, load=LOADED) == (
        "missed: peak 40 MiB, the claim needs ≤ 18 MiB (the bound plus a batch)"
    )


def test_a_failed_check_misses_the_claim_whatever_the_figures() -> None:
    row = _row("queued")
    figures = {"result_over_submit": 1200.0}
    assert _verdict(row, figures, {"equals_numpy": True}) == "met: result time / submit time 1,200x ≥ 2x"
    assert _verdict(row, figures, {"equals_numpy": False}) == "missed: the result differs from NumPy's"


def test_the_cost_model_row_checks_the_book_s_condition() -> None:
    row = _row("loop", "cost model")
    figures = {"queued_t1_us": 3.0, "queued_t2_us": 5.0}
    assert _verdict(row, figures, {"ops": 1000}) == "met: N·t2 5.00 ms ≥ 3.00 ms (N-1 times t1)"


SPEED_UP = Target("speed-up", "s", ">=", FASTER)
AT_MOST = Target("peak", "p", "<=", 18.0, unit="MiB")


@pytest.mark.parametrize(
    ("target", "value", "expected"),
    [
        (SPEED_UP, 1.0996, "missed: speed-up 1.0996x, the claim needs ≥ 1.1000x"),
        (SPEED_UP, 1.099, "missed: speed-up 1.099x, the claim needs ≥ 1.100x"),
        (SPEED_UP, 1.0951, "missed: speed-up 1.095x, the claim needs ≥ 1.100x"),
        (SPEED_UP, 1.1004, "met: speed-up 1.10x ≥ 1.10x"),
        (SPEED_UP, 0.5, "missed: speed-up 0.50x, the claim needs ≥ 1.10x"),
        (AT_MOST, 18.04, "missed: peak 18.04 MiB, the claim needs ≤ 18.00 MiB"),
        (AT_MOST, 17.96, "met: peak 18.0 MiB ≤ 18.0 MiB"),
        (AT_MOST, 250.2, "missed: peak 250 MiB, the claim needs ≤ 18 MiB"),
    ],
)
def test_a_value_and_its_target_are_printed_alike_and_a_miss_never_reads_as_a_pass(
    target: Target, value: float, expected: str
) -> None:
    """The value and the target take the same decimals, as many as the value deserves, and more where a
    missing value would otherwise print as the target itself."""
    key = str(target.value)
    assert verdict_text(target, judge(target, {key: value}, {}), IDLE) == expected


def test_runs_astride_the_target_print_apart_from_it() -> None:
    judged = judge(SPEED_UP, {"s": 1.2}, {}, {"s": [1.0996, 1.3]})
    assert verdict_text(SPEED_UP, judged, IDLE) == (
        "met: speed-up 1.2000x ≥ 1.1000x — noisy: the runs ranged 1.0996x to 1.3000x, on both sides of 1.1000x"
    )


@pytest.mark.parametrize(
    ("row", "figures", "checks", "missing"),
    [
        (_row("parallel", "independent"), {}, {}, "independent_speedup"),  # the value
        (_row("memory", "max_pending_bytes"), {"bounded_peak_mib": 12.0}, {}, "bound_mib"),  # in the target
        (_row("loop", "cost model"), {"queued_t1_us": 3.0, "queued_t2_us": 5.0}, {}, "ops"),  # a check
        (_row("queued"), {"result_over_submit": 1200.0}, {}, "equals_numpy"),  # a check it must hold
    ],
)
def test_a_figure_not_measured_leaves_no_verdict_and_names_it(
    row: Row, figures: dict[str, float], checks: dict[str, Any], missing: str
) -> None:
    assert row.target is not None
    judged = judge(row.target, figures, checks)
    assert judged["met"] is None and judged["missing"] == missing
    assert verdict_text(row.target, judged, LOADED) == f"no verdict: {missing} not measured"


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        ({"before": 0.99, "cores": 2}, False),
        ({"before": 1.0, "cores": 2}, True),
        ({"before": 3.1, "cores": 8}, False),
        ({"before": None, "cores": 2}, False),  # no load average on this platform: not called loaded
    ],
)
def test_a_machine_is_loaded_from_half_its_cores_busy(load: dict[str, Any], expected: bool) -> None:
    assert loaded(load) is expected
