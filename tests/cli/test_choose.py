"""The choice of ``schedsvc tune`` for a goal, a pure function fed made-up figures, and the budgets it reads."""

from __future__ import annotations

import math

import pytest

from schedsvc.cli._choose import Goal, Measured, TuneError, choose, parse_latency, parse_memory, quartiles


def at(depth: int, *throughput: float, p99: float = 1.0, mib: float = 1.0, workers: int = 2) -> Measured:
    """A setting's made-up figures: the items/s of each run, its p99 in ms and its peak in MiB."""
    return Measured(workers, depth, throughput, p99, mib * 2**20)


def chosen_depth(*measured: Measured, goal: Goal | None = None) -> int | None:
    choice = choose(measured, goal or Goal())
    return None if choice.chosen is None else choice.chosen.setting.depth


def test_quartiles_are_those_of_the_runs() -> None:
    assert quartiles([5.0]) == (5.0, 5.0, 5.0)
    assert quartiles([3.0, 1.0, 2.0, 5.0, 4.0]) == (2.0, 3.0, 4.0)
    assert quartiles([100.0, 200.0]) == (125.0, 150.0, 175.0)  # two runs: a quarter of the way in from each


def test_with_two_runs_each_noise_is_judged_on_those_two() -> None:
    # 16's upper quartile, 1,000 + 0.75 x 80 = 1,060, reaches 1024's lower one, 1,050 + 0.25 x 20 = 1,055
    assert chosen_depth(at(16, 1000, 1080), at(1024, 1050, 1070)) == 16
    assert chosen_depth(at(16, 1000, 1040), at(1024, 1050, 1070)) == 1024


def test_a_smaller_setting_within_noise_of_a_noisy_best_is_chosen() -> None:
    """A deeper setting that is fastest by one stray run does not win: 16 gives 89% of 1024's median, and its
    runs' upper quartile reaches 1024's lower quartile, so the smaller setting is chosen."""
    sweep = [
        at(4, 2400, 2450, 2500, 2520, 2550),  # clearly slower: its runs stay below the best's
        at(16, 2700, 2800, 2900, 3050, 3100, p99=14.7, mib=5),
        at(1024, 2500, 2900, 3260, 3300, 3400, p99=477, mib=127),
    ]
    choice = choose(sweep)
    assert choice.chosen is not None and choice.best is not None
    assert (choice.chosen.setting.depth, choice.best.setting.depth) == (16, 1024)
    assert choice.chosen.of_best == pytest.approx(2900 / 3260)
    assert choice.why == (
        "cpu_workers=2, max_pending=16: 89% of the items/s of the fastest setting (cpu_workers=2, "
        "max_pending=1024: 3,260 items/s), within noise: its runs' upper quartile, 3,050 items/s, reaches "
        "the fastest's lower quartile, 2,900; p99 14.7 ms; peak 5 MiB"
    )


def test_a_setting_whose_runs_stay_below_the_best_s_is_not_within_noise() -> None:
    choice = choose([at(1, 900, 910, 920), at(2, 1000, 1001, 1002)])
    assert choice.chosen is not None and choice.chosen.setting.depth == 2
    assert [j.within_noise for j in choice.judged] == [False, True]


def test_budgets_exclude_settings_and_the_best_is_the_fastest_within_them() -> None:
    sweep = [
        at(8, 500, 510, 520, p99=5, mib=2),
        at(16, 890, 900, 910, p99=14.7, mib=5),
        at(64, 980, 1000, 1020, p99=40, mib=80),  # within the latency budget, over the memory one
        at(1024, 1000, 1010, 1020, p99=477, mib=127),  # over both
    ]
    goal = Goal(max_latency_ms=50, max_memory_bytes=64 * 2**20)
    choice = choose(sweep, goal)
    assert choice.chosen is not None and choice.best is not None
    assert choice.chosen.setting.depth == choice.best.setting.depth == 16
    assert [j.over for j in choice.judged] == [
        (),
        (),
        ("peak 80 MiB > 64 MiB",),
        ("p99 477 ms > 50 ms", "peak 127 MiB > 64 MiB"),
    ]
    assert choice.why == (
        "cpu_workers=2, max_pending=16: the fastest setting within budget, 900 items/s; "
        "p99 14.7 ms ≤ 50 ms; peak 5 MiB ≤ 64 MiB"
    )
    assert chosen_depth(*sweep, goal=Goal(max_latency_ms=50)) == 64  # memory no longer counts
    assert chosen_depth(*sweep) == 64  # no budget: 64's runs reach 1024's lower quartile


def test_a_budget_is_met_at_exactly_the_budget() -> None:
    assert chosen_depth(at(4, 10, p99=50.0), at(8, 20, p99=50.1), goal=Goal(max_latency_ms=50)) == 4


def test_when_nothing_meets_the_budgets_nothing_is_chosen_and_the_closest_is_named() -> None:
    sweep = [at(1, 100, p99=80, mib=1), at(4, 300, p99=60, mib=1), at(16, 400, p99=70, mib=1)]
    choice = choose(sweep, Goal(max_latency_ms=50))
    assert choice.chosen is None and choice.best is None
    assert choice.closest is not None and choice.closest.setting.depth == 4  # 1.2x its budget, the least
    assert choice.why == (
        "no setting meets the budgets (p99 ≤ 50 ms); the closest is cpu_workers=2, max_pending=4: "
        "p99 60 ms > 50 ms, 300 items/s"
    )
    assert all(j.of_best is None and not j.within_noise for j in choice.judged)


def test_the_closest_is_the_one_least_over_its_worst_budget() -> None:
    goal = Goal(max_latency_ms=10, max_memory_bytes=10 * 2**20)
    # 4: latency 1.5x over; 8: memory 3x over; 1: both 2x over
    sweep = [at(1, 9, p99=20, mib=20), at(4, 10, p99=15, mib=5), at(8, 11, p99=5, mib=30)]
    choice = choose(sweep, goal)
    assert choice.closest is not None and choice.closest.setting.depth == 4


def test_ties_go_to_the_smaller_setting() -> None:
    assert chosen_depth(at(64, 10.0), at(8, 10.0), at(512, 10.0)) == 8
    # a tie between the best two: the smaller is the best, and nothing smaller reaches it
    assert chosen_depth(at(2, 5.0), at(32, 10.0), at(16, 10.0)) == 16
    # equally close to the budgets: the smaller one is named
    choice = choose([at(8, 10.0, p99=99), at(4, 10.0, p99=99)], Goal(max_latency_ms=1))
    assert choice.closest is not None and choice.closest.setting.depth == 4


def test_fewer_workers_count_as_smaller_than_a_smaller_depth() -> None:
    sweep = [at(4, 1000, workers=2), at(64, 990, 1000, 1010, workers=1), at(128, 995, workers=1)]
    choice = choose(sweep)
    assert choice.chosen is not None
    assert (choice.chosen.setting.workers, choice.chosen.setting.depth) == (1, 64)


def test_with_one_run_each_there_is_no_noise_and_the_fastest_wins() -> None:
    assert chosen_depth(at(16, 999.0), at(1024, 1000.0)) == 1024


def test_no_share_of_the_best_is_given_when_the_best_finished_nothing() -> None:
    """Where the fastest setting within budget has a median of 0 items/s, a setting over budget that did
    finish items is no percentage of it; one that also finished none is all of it."""
    sweep = [at(1, 0.0, p99=1), at(2, 0.0, p99=2), at(4, 500.0, p99=100)]
    choice = choose(sweep, Goal(max_latency_ms=10))
    assert [j.of_best for j in choice.judged] == [1.0, 1.0, None]


@pytest.mark.parametrize(
    ("measured", "goal", "message"),
    [
        ([], Goal(), "at least one"),
        ([at(1, math.nan)], Goal(), "finite"),
        ([at(1, -1.0)], Goal(), "non-negative"),
        ([at(1)], Goal(), "non-negative"),
        ([Measured(1, 1, (5.0,), None, 0.0)], Goal(max_latency_ms=5), "needs a p99 latency"),
    ],
)
def test_choose_refuses_what_it_cannot_judge(measured: list[Measured], goal: Goal, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        choose(measured, goal)


@pytest.mark.parametrize(
    ("text", "ms"), [("50ms", 50.0), ("0.2s", 200.0), ("500us", 0.5), ("250 µs", 0.25), (" 1.5 ms ", 1.5)]
)
def test_a_latency_budget_is_a_time_with_its_unit(text: str, ms: float) -> None:
    assert parse_latency(text) == pytest.approx(ms)


@pytest.mark.parametrize("text", ["50", "ms", "-5ms", "0ms", "5 minutes", "5ms!"])
def test_a_latency_budget_without_a_unit_or_not_positive_is_refused(text: str) -> None:
    with pytest.raises(TuneError, match="--max-latency takes a positive time with its unit"):
        parse_latency(text)


def test_a_memory_budget_is_read_as_the_settings_read_sizes() -> None:
    assert parse_memory("64MiB") == 64 * 2**20
    assert parse_memory("1GB") == 10**9
    assert parse_memory("4096") == 4096
    with pytest.raises(TuneError, match="--max-memory: '64parsecs' is not a byte size"):
        parse_memory("64parsecs")
    with pytest.raises(TuneError, match="--max-memory must be positive"):
        parse_memory("0")
