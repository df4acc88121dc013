"""``schedsvc tune``: the command on made-up figures, each workload on a tiny sweep, the TOML written only where
asked, the plot, user workloads.  The choice itself is tested on its own in test_choose.py."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import schedsvc as ss
from schedsvc.cli import main
from schedsvc.cli import tune as tune_module
from schedsvc.cli._choose import Measured, TuneError, choose
from schedsvc.cli.tune import load_workload

ROW_FIELDS = {
    "workers",
    "max_pending",
    "items_per_s",
    "tasks_per_s",
    "p50_ms",
    "p99_ms",
    "peak_mib",
    "peak_pending_mib",
    "items_per_s_reps",
    "items_per_s_quartiles",
    "of_best",
    "over_budget",
    "within_noise",
    "chosen",
}
#: Tasks each workload submits per item: the tasks/s column must be exactly this many times items/s.
TASKS_PER_ITEM = {"chain": 1, "fanout": 10, "mlp": 1, "pipeline": 3}


def tune(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> dict[str, Any]:
    """Run a tiny sweep with ``--json -``; return the parsed report."""
    out = str(tmp_path / "tune.toml")
    assert main(["tune", *argv, "--reps", "1", "--json", "-", "--write", out]) == 0
    captured = capsys.readouterr()
    report: dict[str, Any] = json.loads(captured.out)
    assert "tune" not in captured.out.split("{", 1)[0]  # nothing but JSON on stdout
    return report


# -- the command on made-up figures ----------------------------------------------------------------------

#: (max_pending) -> (items/s of each run, p99 ms, peak MiB): a pipeline sweep in which 1024 is the fastest by
#: one stray run
PIPELINE = {
    4: ((2400.0, 2450.0, 2500.0, 2520.0, 2550.0), 6.0, 2.0),
    16: ((2700.0, 2800.0, 2900.0, 3050.0, 3100.0), 14.7, 5.0),
    128: ((2600.0, 2700.0, 3000.0, 3100.0, 3200.0), 90.0, 33.0),
    1024: ((2500.0, 2900.0, 3260.0, 3300.0, 3400.0), 477.0, 127.0),
}


Sweep = dict[int, tuple[tuple[float, ...], float, float]]


def fake_runs(monkeypatch: pytest.MonkeyPatch, sweep: Sweep, empty: frozenset[int] = frozenset()) -> None:
    """Every run of the sweep gives ``sweep``'s figures instead of running (1,000 items a run); the runs
    numbered in ``empty`` (from 1, in the order they run) yield no items."""
    runs: dict[int, int] = {}
    count = iter(range(1, 10**6))

    def fake(workload: Any, items: int, s: Any, traced: bool) -> Any:
        throughput, p99, mib = sweep[s.depth]
        i = runs.get(s.depth, 0) % len(throughput)
        runs[s.depth] = i + 1
        latencies = [p99 / 2e3] * 98 + [p99 / 1e3] * 2  # nearest-rank p99: the last two
        if next(count) in empty:
            latencies = []
        done = len(latencies) * 10
        return tune_module._Run(done / throughput[i], done, 3 * done, latencies, 0, int(mib * 2**20))

    monkeypatch.setattr(tune_module, "_run_setting", fake)


@pytest.fixture
def made_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of the sweep gives PIPELINE's figures instead of running (1,000 items a run)."""
    fake_runs(monkeypatch, PIPELINE)


def tune_made_up(
    capsys: pytest.CaptureFixture[str], *argv: str, sweep: Sweep = PIPELINE
) -> tuple[int, str, str]:
    depths = ",".join(map(str, sweep))
    status = main(["tune", "pipeline", "--depths", depths, "--workers", "2", "--reps", "5", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.usefixtures("made_up")
def test_the_command_chooses_for_the_latency_budget_and_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, _ = tune_made_up(capsys, "--max-latency", "50ms")
    assert status == 0
    flat = " ".join(out.split())
    assert "goal: p99 ≤ 50 ms." in flat
    assert (
        "chosen: cpu_workers=2, max_pending=16: the fastest setting within budget, 2,900 items/s; "
        "p99 14.7 ms ≤ 50 ms; peak 5 MiB." in flat
    )
    assert "over: p99 90 ms > 50 ms" in flat and "over: p99 477 ms > 50 ms" in flat
    assert "cpu_workers = 2\nmax_pending = 16\n" in out
    assert "--write PATH" in out
    assert list(tmp_path.iterdir()) == []  # nothing written unasked


@pytest.mark.usefixtures("made_up")
def test_without_a_budget_the_smallest_setting_within_noise_is_chosen(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = tune_made_up(capsys, "--json", "-")
    assert status == 0
    report = json.loads(out)
    assert report["recommended"] == {"cpu_workers": 2, "max_pending": 16}
    assert report["goal"] == {"max_latency_ms": None, "max_memory_bytes": None}
    rows = {r["max_pending"]: r for r in report["rows"]}
    assert rows[16]["of_best"] == pytest.approx(2900 / 3260)
    assert [rows[d]["within_noise"] for d in PIPELINE] == [False, True, True, True]
    assert rows[1024]["items_per_s_quartiles"] == [2900.0, 3300.0]
    assert report["why"].startswith("cpu_workers=2, max_pending=16: 89% of the items/s of the fastest")


@pytest.mark.usefixtures("made_up")
def test_when_no_setting_fits_it_says_so_names_the_closest_and_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "tune.toml"
    status, out, err = tune_made_up(
        capsys, "--max-latency", "5ms", "--max-memory", "64MiB", "--write", str(path)
    )
    assert status == tune_module.NO_SETTING_FITS == 3
    flat = " ".join(out.split())
    assert (
        "nothing chosen: no setting meets the budgets (p99 ≤ 5 ms, peak memory ≤ 64 MiB); the closest is "
        "cpu_workers=2, max_pending=4: p99 6 ms > 5 ms, 2,500 items/s." in flat
    )
    assert "cpu_workers =" not in out
    assert f"nothing written to {path}: no setting meets the budgets" in err
    assert not path.exists()


@pytest.mark.usefixtures("made_up")
def test_write_saves_the_choice_with_the_goal_and_the_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "tune.toml"
    status, out, _ = tune_made_up(capsys, "--max-memory", "64MiB", "--write", str(path))
    assert status == 0 and f"wrote {path}" in out
    text = path.read_text()
    assert "# goal: peak memory ≤ 64 MiB" in text
    assert (
        "# chosen: cpu_workers=2, max_pending=16: 97% of the items/s of the fastest setting within budget "
        "(cpu_workers=2, max_pending=128: 3,000 items/s), within noise" in text
    )
    assert "over: peak 127 MiB > 64 MiB" in text
    config = ss.Config.from_file(path)
    assert (config.cpu_workers, config.max_pending) == (2, 16)


@pytest.mark.parametrize(
    ("reps", "note"),
    [
        ("1", "note: 1 run per setting shows no spread to judge noise by, so the fastest setting wins;"),
        ("2", "note: the noise judgement rests on 2 runs per setting"),
        ("3", None),
    ],
)
@pytest.mark.usefixtures("made_up")
def test_the_summary_says_what_few_runs_can_tell_of_noise(
    reps: str, note: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run per setting has no spread, and the fastest setting wins; two runs still give quartiles, so
    the note says the judgement rests on them; from three runs there is no note."""
    status, out, _ = tune_made_up(capsys, "--reps", reps)
    flat = " ".join(out.split())
    assert status == 0
    if note is None:
        assert "note:" not in flat
    else:
        assert note in flat and f"--reps {tune_module.DEFAULT_REPS}" in flat
    assert ("no spread" in flat) is (reps == "1")


#: figures of a sweep of more than 10,000 items/s, whose middle halves print wider than the column's header
FAST: Sweep = {
    8: ((11_600.0, 11_692.0, 11_721.0, 12_526.0, 12_600.0), 1.21, 0.18),
    16: ((9_000.0, 9_100.0, 9_200.0, 9_300.0, 9_400.0), 1.82, 0.23),
    128: ((15_900.0, 15_920.0, 18_042.0, 18_289.0, 18_300.0), 9.52, 0.92),
}


def test_the_written_table_lines_up_however_wide_its_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_runs(monkeypatch, FAST)
    path = tmp_path / "tune.toml"
    status, _, _ = tune_made_up(capsys, "--max-latency", "5ms", "--write", str(path), sweep=FAST)
    assert status == 0
    comments = path.read_text().split("\n#\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert comments[0].startswith("# cpu workers  max pending") and len(comments) == 1 + len(FAST)
    assert "11,692-12,526" in comments[1]
    # where each number column ends (the headers and the figures are aligned right): the same on every line
    ends = {tuple(m.end() for m in re.finditer(r"\S+(?: \S+)*", line[2:]))[:6] for line in comments}
    assert len(ends) == 1, comments


def test_a_workload_run_that_yields_no_items_fails_the_sweep(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run must have latencies, the later ones too: a run with none fails the sweep (exit status 1)
    and names the workload and the setting, rather than counting as a run of 0 ms."""
    fake_runs(monkeypatch, PIPELINE, empty=frozenset({7}))  # rep 2 at the third depth, 128
    status, out, err = tune_made_up(capsys, "--json", "-")
    assert status == 1 and out == ""
    assert (
        "schedsvc tune pipeline: at cpu_workers=2, max_pending=128: workload 'pipeline' yielded no items "
        "(asked for 1000)" in err
    )


@pytest.mark.usefixtures("made_up")
def test_the_report_gives_the_cores_the_process_may_use_and_the_load(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import schedsvc.devices

    monkeypatch.setattr(schedsvc.devices, "engine_cores", lambda: 3)  # an affinity narrower than the machine
    monkeypatch.setattr("os.getloadavg", lambda: (1.234, 0.5, 0.25))
    status, out, _ = tune_made_up(capsys, "--json", "-")
    machine = json.loads(out)["machine"]
    assert status == 0 and machine["cpus"] == 3 and machine["load_average"] == [1.23, 1.23]


def test_tune_writes_nothing_unasked_and_says_how_to_save_the_choice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --write, no file appears in the working directory; the report says how to save the choice."""
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "chain", "--depths", "1", "--items", "3", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert "\nmax_pending = 1\n" in out
    assert "run again with --write PATH" in " ".join(out.split())


def test_out_is_still_read_as_write(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    assert main(["tune", "chain", "--depths", "1", "--items", "3", "--reps", "1", "--out", str(path)]) == 0
    assert ss.Config.from_file(path).max_pending == 1


def test_tune_help_describes_the_goals_the_rule_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    for text in (
        "--max-latency TIME",
        "--max-memory SIZE",
        "--write PATH",
        "p99 latency per item",
        "within noise",
        "upper quartile",
        "3 no setting meets the budgets",
        "schedsvc tune pipeline --max-latency 50ms",
    ):
        assert text in flat, text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-latency", "50"], "--max-latency takes a positive time with its unit"),
        (["--max-memory", "lots"], "--max-memory: 'lots' is not a byte size"),
    ],
)
def test_a_bad_budget_is_refused_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "chain", "--depths", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "..." not in err


# -- each workload, tiny -------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["chain", "fanout", "mlp", "pipeline"])
def test_each_workload_sweeps_and_its_json_has_the_promised_fields(
    workload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(capsys, tmp_path, workload, "--depths", "4,1", "--items", "6", "--workers", "2")
    assert report["workload"] == workload
    assert report["items"] == 6 and report["reps"] == 1
    assert report["machine"]["cpus"] >= 1 and report["machine"]["blas_threads"] == 1
    rows = report["rows"]
    assert [(r["workers"], r["max_pending"]) for r in rows] == [(2, 1), (2, 4)]  # sorted
    for r in rows:
        assert set(r) == ROW_FIELDS
        assert r["items_per_s"] > 0 and r["items_per_s_reps"] == [r["items_per_s"]]
        assert r["tasks_per_s"] == pytest.approx(TASKS_PER_ITEM[workload] * r["items_per_s"])
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["peak_mib"] > 0
    assert [r["max_pending"] for r in rows if r["chosen"]] == [report["per_workers"]["2"]]
    assert report["recommended"] == {"cpu_workers": 2, "max_pending": report["per_workers"]["2"]}


def test_the_chosen_row_follows_the_rule_on_the_measured_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(capsys, tmp_path, "chain", "--depths", "1,2,8", "--items", "20", "--workers", "1,2")
    measured = [
        Measured(
            r["workers"], r["max_pending"], tuple(r["items_per_s_reps"]), r["p99_ms"], r["peak_mib"] * 2**20
        )
        for r in report["rows"]
    ]
    expected = choose(measured).chosen
    assert expected is not None
    assert report["recommended"] == {
        "cpu_workers": expected.setting.workers,
        "max_pending": expected.setting.depth,
    }
    assert sum(r["chosen"] for r in report["rows"]) == 1
    for workers in (1, 2):
        alone = choose([m for m in measured if m.workers == workers]).chosen
        assert alone is not None and report["per_workers"][str(workers)] == alone.setting.depth


def test_the_toml_round_trips_through_config_from_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(capsys, tmp_path, "mlp", "--depths", "2,8", "--items", "4", "--workers", "1")
    text = (tmp_path / "tune.toml").read_text()
    assert "# schedsvc tune mlp" in text and "CPUs" in text and "<- chosen" in text
    assert f"ss.Config.from_file({str(tmp_path / 'tune.toml')!r})" in text
    config = ss.Config.from_file(tmp_path / "tune.toml")
    assert config.cpu_workers == report["recommended"]["cpu_workers"] == 1
    assert config.max_pending == report["recommended"]["max_pending"]


def test_without_rich_the_report_is_a_plain_table_and_progress_is_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    out = tmp_path / "rec.toml"
    assert main(["tune", "chain", "--depths", "1,2", "--items", "5", "--reps", "1", "--write", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "schedsvc tune chain: 5 items, 1 run"
    headers = ["cpu workers", "max pending", "items/s", "middle half", "of best", "p50 ms", "p99 ms"]
    headers += ["peak MiB", "pending MiB"]
    assert re.split(r"\s{2,}", lines[1].strip()) == headers
    assert sum(line.endswith("<- chosen") for line in lines) == 1
    assert not any(box in captured.out for box in "─━│┃")
    assert f"wrote {out}" in lines
    steps = [line for line in captured.err.splitlines() if line.startswith("  ... tune chain ")]
    assert len(steps) == 4 and steps[-1].endswith("(4/4)")  # 2 depths x (1 rep + the memory run)


def test_the_human_report_is_a_table_with_the_chosen_setting_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "report.json"
    out = tmp_path / "rec.toml"
    assert (
        main(
            [
                "tune",
                "chain",
                "--depths",
                "1,2",
                "--items",
                "5",
                "--reps",
                "1",
                "--json",
                str(path),
                "--write",
                str(out),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "schedsvc tune chain: 5 items" in captured.out
    assert "<- chosen" in captured.out and "max_pending=" in captured.out
    assert f"wrote {out}" in captured.out and f"wrote {path}" in captured.out
    assert json.loads(path.read_text())["workload"] == "chain"
    assert out.is_file()


# -- the plot ---------------------------------------------------------------------------------------


def test_plot_is_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "tune.png"
    report = tune(
        capsys, tmp_path, "chain", "--depths", "1,4", "--items", "5", "--workers", "1,2", "--plot", str(png)
    )
    assert report["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000  # three panels drawn, not an empty canvas


def test_without_matplotlib_the_plot_says_how_to_install_it_and_the_rest_is_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    png = tmp_path / "tune.png"
    out = tmp_path / "tune.toml"
    argv = [
        "tune",
        "chain",
        "--depths",
        "1",
        "--items",
        "3",
        "--reps",
        "1",
        "--write",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "pip install 'schedsvc[plot]'" in captured.err
    assert not png.exists()
    assert ss.Config.from_file(out).max_pending == 1
    assert "<- chosen" in captured.out


# -- a user's module:function --------------------------------------------------------------------------


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.setattr(sys, "path", list(sys.path))  # tune may add the working directory: undo it
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_user_async_generator_is_swept_with_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user_module(
        tmp_path,
        monkeypatch,
        "tune_user_gen",
        """
        import numpy as np

        async def scale(eng, items):
            x = np.ones(64)
            for i in range(items):
                first = await eng.submit(np.multiply, x, float(i))
                yield await eng.submit(np.sum, first)
        """,
    )
    report = tune(
        capsys, tmp_path, "tune_user_gen:scale", "--depths", "1,2", "--items", "7", "--workers", "1"
    )
    assert report["workload"] == "tune_user_gen:scale" and report["items"] == 7
    for r in report["rows"]:
        assert r["tasks_per_s"] == pytest.approx(2 * r["items_per_s"])
        assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_a_user_module_is_found_in_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tune_user_cwd.py").write_text(
        "import numpy as np\n\n"
        "async def ones(eng, items):\n"
        "    for _ in range(items):\n"
        "        yield await eng.submit(np.ones, 4)\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "tune_user_cwd", raising=False)
    monkeypatch.chdir(tmp_path)
    report = tune(capsys, tmp_path, "tune_user_cwd:ones", "--depths", "1", "--items", "3", "--workers", "1")
    assert report["rows"][0]["items_per_s"] > 0


def test_a_user_coroutine_is_swept_without_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user_module(
        tmp_path,
        monkeypatch,
        "tune_user_coro",
        """
        import numpy as np

        async def burst(eng, items):
            for i in range(items):
                await eng.submit(np.add, np.ones(8), i)
        """,
    )
    report = tune(capsys, tmp_path, "tune_user_coro:burst", "--depths", "2", "--items", "5", "--workers", "1")
    (row,) = report["rows"]
    assert row["p50_ms"] is None and row["p99_ms"] is None
    assert row["tasks_per_s"] == pytest.approx(row["items_per_s"])
    assert ss.Config.from_file(tmp_path / "tune.toml").max_pending == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            """
            async def bad(eng, items):
                for _ in range(items):
                    yield 42
            """,
            "must yield, per item, the Future",
        ),
        (
            """
            async def bad(eng, items):
                return
                yield
            """,
            "at cpu_workers=2, max_pending=1: workload 'tune_user_bad:bad' yielded no items (asked for 2)",
        ),
        (
            """
            def boom(x):
                raise RuntimeError("kaput")

            async def bad(eng, items):
                for i in range(items):
                    yield await eng.submit(boom, i)
            """,
            "failed tasks: RuntimeError: kaput",
        ),
        (
            """
            async def bad(eng, items):
                raise LookupError("no data here")
                yield
            """,
            "at cpu_workers=2, max_pending=1: the workload raised LookupError: no data here",
        ),
    ],
)
@pytest.mark.parametrize("budget", [[], ["--max-latency", "5ms"]])
def test_a_user_workload_that_goes_wrong_fails_the_run_and_says_why(
    body: str,
    message: str,
    budget: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_module(tmp_path, monkeypatch, "tune_user_bad", body)
    argv = ["tune", "tune_user_bad:bad", "--depths", "1", "--workers", "2", "--items", "2", "--reps", "1"]
    argv += ["--write", str(tmp_path / "x.toml"), *budget]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "unknown workload 'nosuch': use one of chain, fanout, mlp, pipeline"),
        ("tune_spec:", "must be 'module:function'"),
        (":fn", "must be 'module:function'"),
        ("tune_spec_missing_module:fn", "cannot import module 'tune_spec_missing_module'"),
        ("tune_spec:missing", "module 'tune_spec' has no attribute 'missing'"),
        ("tune_spec:plain", "must be an async function, got function"),
        ("tune_spec:CONSTANT", "must be an async function, got int"),
        ("tune_spec:one_arg", "must take (eng, items)"),
    ],
)
def test_a_bad_spec_names_what_is_wrong(
    spec: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_module(
        tmp_path,
        monkeypatch,
        "tune_spec",
        """
        CONSTANT = 3

        def plain(eng, items):
            pass

        async def one_arg(eng):
            pass
        """,
    )
    with pytest.raises(TuneError) as info:
        load_workload(spec)
    assert message in str(info.value)
    assert main(["tune", spec, "--write", str(tmp_path / "x.toml")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depths", "1,x"], "--depths must be comma-separated integers"),
        (["--depths", "0,4"], "--depths must be positive"),
        (["--workers", "2,-1"], "--workers must be positive"),
        (["--reps", "0"], "--reps must be at least 1"),
        (["--items", "0"], "--items must be at least 1"),
        (
            ["--plot", "/nonexistent-dir/t.png"],
            "--plot /nonexistent-dir/t.png: the directory '/nonexistent-dir'",
        ),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["tune", "chain", *argv, "--write", str(tmp_path / "x.toml")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()
