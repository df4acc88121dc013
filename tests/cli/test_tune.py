"""``schedsvc tune``: the knee rule, each workload on a tiny sweep, the TOML, the plot, user workloads."""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import schedsvc as ss
from schedsvc.cli import main
from schedsvc.cli.tune import TuneError, knee, load_workload, recommend

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
    "knee",
}
#: Tasks each workload submits per item: the tasks/s column must be exactly this many times items/s.
TASKS_PER_ITEM = {"chain": 1, "fanout": 10, "mlp": 1, "pipeline": 3}


def tune(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> dict[str, Any]:
    """Run a tiny sweep with ``--json -``; return the parsed report."""
    out = str(tmp_path / "tune.toml")
    assert main(["tune", *argv, "--reps", "1", "--json", "-", "--out", out]) == 0
    captured = capsys.readouterr()
    report: dict[str, Any] = json.loads(captured.out)
    assert "tune" not in captured.out.split("{", 1)[0]  # nothing but JSON on stdout
    return report


# -- the knee (pure) ----------------------------------------------------------------------------


def test_knee_is_the_smallest_depth_within_five_percent_of_the_best() -> None:
    assert knee({1: 100.0, 2: 500.0, 4: 960.0, 8: 1000.0, 16: 990.0}) == 4


def test_knee_counts_exactly_five_percent_below_the_best_as_within() -> None:
    assert knee({1: 94.0, 2: 95.0, 4: 100.0}) == 2


def test_knee_of_ties_is_the_smaller_depth() -> None:
    assert knee({64: 10.0, 8: 10.0, 512: 10.0}) == 8


def test_knee_of_a_flat_curve_is_the_smallest_depth() -> None:
    assert knee({d: 1000.0 + d % 3 for d in (1, 2, 4, 8, 16)}) == 1


def test_knee_of_a_single_setting_is_that_setting() -> None:
    assert knee({32: 5.0}) == 32


def test_knee_of_a_noisy_curve_ignores_a_dip_after_it() -> None:
    # the best is at 64, but 8 is already within 5% of it; the dip at 16 does not move the knee
    assert knee({1: 300.0, 2: 600.0, 4: 900.0, 8: 980.0, 16: 700.0, 32: 990.0, 64: 1010.0}) == 8


def test_knee_with_another_tolerance() -> None:
    points = {1: 80.0, 2: 90.0, 4: 100.0}
    assert knee(points, tolerance=0.0) == 4
    assert knee(points, tolerance=0.2) == 1


@pytest.mark.parametrize(
    ("points", "tolerance", "message"),
    [
        ({}, 0.05, "at least one"),
        ({1: math.nan, 2: 1.0}, 0.05, "finite"),
        ({1: -1.0}, 0.05, "non-negative"),
        ({1: 1.0}, 1.0, "tolerance"),
    ],
)
def test_knee_rejects_what_has_no_knee(points: dict[int, float], tolerance: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        knee(points, tolerance)


def test_recommend_takes_the_fewest_workers_within_five_percent_of_the_best() -> None:
    assert recommend({1: 970.0, 2: 1000.0, 4: 1010.0}) == 1
    assert recommend({1: 500.0, 2: 1000.0, 4: 1010.0}) == 2
    assert recommend({2: 7.0}) == 2


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
    assert [r["max_pending"] for r in rows if r["knee"]] == [report["knees"]["2"]]
    assert report["recommended"] == {"cpu_workers": 2, "max_pending": report["knees"]["2"]}


def test_the_knee_row_follows_the_rule_on_the_measured_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(capsys, tmp_path, "chain", "--depths", "1,2,8", "--items", "20", "--workers", "1,2")
    for workers in (1, 2):
        rows = [r for r in report["rows"] if r["workers"] == workers]
        expected = knee({r["max_pending"]: r["items_per_s"] for r in rows})
        assert report["knees"][str(workers)] == expected
        assert [r["max_pending"] for r in rows if r["knee"]] == [expected]
    best = {w: max(r["items_per_s"] for r in report["rows"] if r["workers"] == w) for w in (1, 2)}
    chosen = recommend(best)
    assert report["recommended"] == {"cpu_workers": chosen, "max_pending": report["knees"][str(chosen)]}


def test_the_toml_round_trips_through_config_from_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(capsys, tmp_path, "mlp", "--depths", "2,8", "--items", "4", "--workers", "1")
    text = (tmp_path / "tune.toml").read_text()
    assert "# schedsvc tune mlp" in text and "CPUs" in text and "<- knee" in text
    assert f"ss.Config.from_file({str(tmp_path / 'tune.toml')!r})" in text
    config = ss.Config.from_file(tmp_path / "tune.toml")
    assert config.cpu_workers == report["recommended"]["cpu_workers"] == 1
    assert config.max_pending == report["recommended"]["max_pending"]


def test_without_rich_the_report_is_a_plain_table_and_progress_is_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    out = tmp_path / "rec.toml"
    assert main(["tune", "chain", "--depths", "1,2", "--items", "5", "--reps", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "schedsvc tune chain: 5 items, 1 run"
    headers = ["cpu workers", "max pending", "items/s", "p50 ms", "p99 ms", "peak MiB", "pending MiB"]
    assert re.split(r"\s{2,}", lines[1].strip()) == headers
    assert sum("<- knee, recommended" in line for line in lines) == 1
    assert not any(box in captured.out for box in "─━│┃")
    assert f"wrote {out}" in lines
    steps = [line for line in captured.err.splitlines() if line.startswith("  ... tune chain ")]
    assert len(steps) == 4 and steps[-1].endswith("(4/4)")  # 2 depths x (1 rep + the memory run)


def test_the_human_report_is_a_table_with_the_knee_marked(
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
                "--out",
                str(out),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "schedsvc tune chain: 5 items" in captured.out
    assert "<- knee" in captured.out and "max_pending=" in captured.out
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
        "--out",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "pip install 'schedsvc[plot]'" in captured.err
    assert not png.exists()
    assert ss.Config.from_file(out).max_pending == 1
    assert "<- knee" in captured.out


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
def test_a_user_workload_that_goes_wrong_fails_the_run_and_says_why(
    body: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_module(tmp_path, monkeypatch, "tune_user_bad", body)
    argv = ["tune", "tune_user_bad:bad", "--depths", "1", "--workers", "2", "--items", "2", "--reps", "1"]
    argv += ["--out", str(tmp_path / "x.toml")]
    assert main(argv) == 1
    assert message in capsys.readouterr().err
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
    assert main(["tune", spec, "--out", str(tmp_path / "x.toml")]) == 2
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
    assert main(["tune", "chain", *argv, "--out", str(tmp_path / "x.toml")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()
