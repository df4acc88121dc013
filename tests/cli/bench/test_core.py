"""``schedsvc bench core``: the cases run are in the JSON report; an unknown case is refused."""

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


def test_the_tiny_task_cases_run_under_trio_too(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    assert main(["bench", "core", "--cases", "w3.trio,w1_w2.trio", "--reps", "1", "--json", str(path)]) == 0
    cases = json.loads(path.read_text())["cases"]
    assert cases["w3.trio"]["w3_us"] > 0
    assert cases["w1_w2.trio"]["w2_us"] > 0 and cases["w1_w2.trio"]["w1_submit_await_us"] > 0


def test_bench_w7_compares_the_executor_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "w7.json"
    assert (
        main(["bench", "core", "--cases", "w7.executor,w7.threadpool", "--reps", "1", "--json", str(path)])
        == 0
    )
    report = json.loads(path.read_text())
    for case in ("w7.executor", "w7.threadpool"):
        assert report["cases"][case]["w7_round_trip_us"] > 0
