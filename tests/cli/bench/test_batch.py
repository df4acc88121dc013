"""``schedsvc bench batch``: every case measured against the loop of the same run, with correct results."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schedsvc.cli import bench_workers, main
from schedsvc.cli.bench import batch

BATCHED = ("batched", "batched.tasks", "batched.fast")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return batch.run(reps=1, quick=True)


def test_a_quick_run_measures_every_case_against_the_loop(report: dict[str, Any]) -> None:
    m = report["medians"]
    for case in batch.CASES:
        p = batch.PREFIX[case]
        assert m[f"{p}_us"] > 0
        if case != "loop":
            assert m[f"{p}_ratio"] == pytest.approx(m["loop_us"] / m[f"{p}_us"])
    for p in (
        "batched",
        "fast",
        "unbatched",
        "threadpool",
    ):  # calls made by one coroutine: making them is part
        assert 0 < m[f"{p}_call_us"] < m[f"{p}_us"]
    for p in ("tasks", "floor"):  # latencies where a task awaits each call
        assert 0 < m[f"{p}_p50_us"] <= m[f"{p}_p99_us"]
    assert report["config"] == {
        "cpu_workers": bench_workers(),
        "max_batch": batch.MAX_BATCH,
        "blas_threads": 1,
    }


def test_a_quick_run_checks_every_row_and_counts_the_batches(report: dict[str, Any]) -> None:
    assert report["checks"] == {
        "batched equal": True,
        "batched.tasks equal": True,
        "batched.fast close": True,
        "batched.fast rows bit-equal": report["checks"]["batched.fast rows bit-equal"],
        "unbatched equal": True,
        "threadpool equal": True,
    }
    sizes = report["batch_sizes"]
    assert set(sizes) == set(BATCHED)
    for case in BATCHED:
        rows = sum(int(k) * v for k, v in sizes[case].items())
        assert rows == report["rows"] * report["passes"]  # every call's row, in one batch each
        assert sum(sizes[case].values()) < rows  # the calls were batched
        assert max(int(k) for k in sizes[case]) <= batch.MAX_BATCH


def test_the_report_says_whether_the_target_was_met(report: dict[str, Any]) -> None:
    targets = report["targets"]
    assert [t["figure"] for t in targets] == ["fast_ratio", "batched_ratio", "tasks_ratio"]
    for t in targets:
        assert t["met"] == (t["value"] >= batch.TARGET)
    verdict = report["verdict"]
    assert "in the default mode" in verdict and verdict.endswith("every row the loop's to within rounding)")
    assert (": met" in verdict) == targets[0]["met"]
    text = batch.format_report(report)
    for case in batch.CASES:
        assert f"  {case} " in text
    assert "max_batch=256" in text and f"verdict: {verdict}" in text


def test_bench_batch_writes_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "batch", "--reps", "1", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert out["reps"] == 1 and out["passes"] == batch.PASSES and out["rows"] == 1797
    assert out["checks"]["batched equal"] is True
    assert out["medians"]["batched_ratio"] > 0
