"""The ``schedsvc`` command: the bench suites run and write JSON reports; every subcommand checks its output path first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedsvc.cli import main


def test_bench_writes_json_with_the_cases_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.json"
    assert (
        main(["bench", "core", "--cases", "w5.schedsvc,w3.threadpool", "--reps", "1", "--json", str(path)])
        == 0
    )
    report = json.loads(path.read_text())
    assert report["reps"] == 1
    assert set(report["cases"]) == {"w5.schedsvc", "w3.threadpool"}
    w5 = report["cases"]["w5.schedsvc"]
    assert w5["w5_1worker_s"] > 0 and w5["w5_nworkers_s"] > 0
    assert w5["w5_speedup"] == pytest.approx(w5["w5_1worker_s"] / w5["w5_nworkers_s"])
    assert "targets" not in report  # ratios need every case; none are made up
    assert "w5.schedsvc" in capsys.readouterr().out


def test_bench_rejects_unknown_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "core", "--cases", "w9.nothing"]) == 2
    assert "unknown cases" in capsys.readouterr().err


def test_bench_tensor_json_has_the_three_variants_and_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tensor", "--reps", "1", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    m = report["medians"]
    for prefix in ("mlp", "fancy"):
        for variant in ("numpy", "eager", "compiled"):
            assert m[f"{prefix}_{variant}_us"] > 0
        assert m[f"{prefix}_eager_over_compiled"] == pytest.approx(
            m[f"{prefix}_eager_us"] / m[f"{prefix}_compiled_us"]
        )
    assert {t["figure"] for t in report["targets"]} == {"mlp_eager_over_compiled", "mlp_compiled_over_numpy"}


def test_bench_tensor_rejects_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tensor", "--cases", "x"]) == 2
    assert "core suite only" in capsys.readouterr().err


@pytest.mark.dask
def test_bench_dask_reports_each_workload_against_plain_dask(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed")
    from schedsvc.cli.bench import dask

    # the same cases, small: this checks the report, not the figures
    for name, value in {"N_W2": 20, "N_W3": 10, "N_W5": 2, "W5_SIZE": 50, "N_G": 20}.items():
        monkeypatch.setattr(dask, name, value)
    assert main(["bench", "dask", "--reps", "1", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["cases"]) == set(dask.CASES)
    for w, unit in (("w2", "us"), ("w3", "us"), ("w5", "s"), ("g", "us")):
        mine, plain = (
            report["cases"][f"{w}.schedsvc"][f"{w}_{unit}"],
            report["cases"][f"{w}.dask"][f"{w}_{unit}"],
        )
        assert mine > 0 and plain > 0
        assert report["ratios"][f"{w}_vs_dask"] == pytest.approx(mine / plain)  # one rep: its own ratio
    assert [t["figure"] for t in report["targets"]] == ["w2_vs_dask", "w3_vs_dask", "w5_vs_dask", "g_vs_dask"]


def test_bench_dask_rejects_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "dask", "--cases", "x"]) == 2
    assert "core suite only" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "core", "--reps", "1"],
        ["bench", "tensor", "--reps", "1"],
        ["demo", "--quick"],
        ["info"],
        ["tune", "chain", "--depths", "1", "--reps", "1"],
    ],
)
@pytest.mark.parametrize("where", ["missing directory", "a directory"])
def test_an_output_path_that_cannot_be_written_fails_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], where: str
) -> None:
    """Said at once with exit status 2, not after a run of minutes ended in a traceback."""
    path = tmp_path / "no such dir" / "out.json" if where == "missing directory" else tmp_path
    assert main([*command, "--json", str(path)]) == 2
    captured = capsys.readouterr()
    expected = "does not exist" if where == "missing directory" else "is a directory"
    assert f"--json {path}: " in captured.err and expected in captured.err
    assert "..." not in captured.err  # no progress line: nothing ran
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command", [["demo", "--quick", "--reps", "1"], ["tune", "chain", "--depths", "1", "--reps", "1"]]
)
def test_a_bad_setting_in_the_environment_exits_2_with_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """It used to end the run in a ConfigError traceback."""
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING_BYTES", "1.7")
    assert main(command) == 2
    err = capsys.readouterr().err
    assert (
        f"schedsvc {command[0]}: invalid schedsvc configuration: max_pending_bytes: 1.7 is not a whole number"
        in err
    )
