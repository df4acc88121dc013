"""``schedsvc bench tensor``: NumPy, eager and compiled figures and their ratios; no ``--cases``."""

from __future__ import annotations

import json

import pytest

from schedsvc.cli import main


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
