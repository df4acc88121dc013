"""``schedsvc info``: version, devices, and the settings in force."""

from __future__ import annotations

import pytest

from schedsvc._cli import main


def test_info_prints_version_and_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "schedsvc 0.1.0" in out
    assert "max_pending = 1024" in out
    assert "cuda" in out  # availability is reported either way
