"""``schedsvc bench dask``: each workload against plain Dask in one run; no ``--cases``."""

from __future__ import annotations

import json

import pytest

from schedsvc.cli import main


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
