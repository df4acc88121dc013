"""The ``schedsvc`` command: every subcommand checks its output path first, and a bad setting exits 2; a
bare ``schedsvc`` prints its help, every subcommand describes itself, and ``python -m schedsvc`` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from schedsvc.cli import main


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
    """The configuration's message, said on stderr with exit status 2 before anything runs (no traceback)."""
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING_BYTES", "1.7")
    assert main(command) == 2
    err = capsys.readouterr().err
    assert (
        f"schedsvc {command[0]}: invalid schedsvc configuration: max_pending_bytes: 1.7 is not a whole number"
        in err
    )


def test_a_bare_schedsvc_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """With no subcommand, the help: every subcommand with its one-line help, and exit status 0."""
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: schedsvc") and "{demo,bench,tune,info}" in out
    for command in ("demo", "bench", "tune", "info"):
        assert f"\n    {command} " in out  # each listed with its one-line help


@pytest.mark.parametrize(
    "command",
    [
        "demo",
        "bench",
        "tune",
        "info",
        *(f"bench {suite}" for suite in ("core", "tensor", "batch", "dask", "gpu", "serve")),
    ],
)
def test_every_subcommand_describes_itself(capsys: pytest.CaptureFixture[str], command: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command.split(), "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]  # argparse: usage, a blank line, the description
    assert not description.startswith(("positional arguments", "options")), out
    assert len(description.split()) >= 12, description


def test_python_m_schedsvc_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "schedsvc", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("schedsvc ")
