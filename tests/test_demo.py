"""``schedsvc demo``: the sources' experiments, a row each."""

from __future__ import annotations

import pytest

from schedsvc._cli import main


def test_demo_prints_a_row_per_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = (
        "c = a * b + 2",
        "1,000 x (y = x + 1)",
        "8 x np.dot",
        "200 batches through a matmul",
        "MLP 512-256",
    )
    for row in rows:
        assert row in out
    assert "16 MiB bound: peak" in out
