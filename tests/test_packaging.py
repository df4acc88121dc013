"""The version is defined once (pyproject.toml) and read back by ``ss.__version__`` and ``schedsvc --version``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import schedsvc as ss
from schedsvc.cli import main

REPO = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return version


def test_version_is_the_one_in_pyproject() -> None:
    assert ss.__version__ == _pyproject_version() == metadata.version("schedsvc")


def test_version_is_not_written_in_the_package_source() -> None:
    source = (REPO / "schedsvc" / "__init__.py").read_text(encoding="utf-8")
    assert f'"{_pyproject_version()}"' not in source


def test_cli_version_prints_the_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"schedsvc {ss.__version__}\n"


def test_the_installed_command_answers_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "schedsvc.cli", "--version"], capture_output=True, text=True, timeout=50
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"schedsvc {_pyproject_version()}"
