"""The types a user's program sees under ``mypy --strict``: each ``user_*.py`` program reveals them (each
``reveal_type`` line ends with the type it must reveal), ``user_errors.py`` holds mistakes mypy must find.

mypy checks copies of the programs in a directory outside the repository, as a user's project is: it
finds ``schedsvc`` where it is installed (``scripts/test.sh`` installs it editable, as mypy can see it),
not next to the programs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

HERE = Path(__file__).parent
PROGRAMS = sorted(p.name for p in HERE.glob("user_*.py") if p.name != "user_errors.py")
_NOTE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is \"(?P<type>.*)\"$")
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")
_QUALIFIED = re.compile(r"\b(?:\w+\.)+(\w+)")  # schedsvc.tensor._tensor.Tensor -> Tensor


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """mypy --strict on every user program, in one process of its own run in a directory outside the
    repository (in this process it would raise the recursion limit for the tests after it; one run reads
    NumPy's stubs once): file name -> its output lines."""
    project = tmp_path_factory.mktemp("user-project")
    for path in HERE.glob("user_*.py"):
        shutil.copy(path, project)
    args = ["--strict", "--no-error-summary", "--show-error-codes", "--cache-dir", str(project / ".cache")]
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *args, *sorted(p.name for p in project.glob("user_*.py"))],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert not done.stderr, done.stderr
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        lines.setdefault(line.split(":", 1)[0], []).append(line)
    return lines


def _marked(path: Path, marker: str) -> dict[int, str]:
    """Line number -> what follows ``marker`` in that line's comment."""
    found: dict[int, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            found[number] = line.rsplit(marker, 1)[1].strip()
    return found


@pytest.mark.timeout(600)  # (mypy reads NumPy's stubs: tens of seconds on a loaded machine)
def test_mypy_outside_the_repository_finds_the_installed_package(checked: dict[str, list[str]]) -> None:
    missing = [line for lines in checked.values() for line in lines if "[import-not-found]" in line]
    assert missing == [], (
        "mypy cannot find schedsvc from outside the repository: install it as scripts/_venv.sh does "
        "(pip install -e . --config-settings editable_mode=strict)"
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("program", PROGRAMS)
def test_user_programs_see_their_types(checked: dict[str, list[str]], program: str) -> None:
    lines = checked.get(program, [])
    errors = [line for line in lines if ": error:" in line]
    assert errors == []
    revealed = {}
    for line in lines:
        match = _NOTE.match(line)
        if match:
            revealed[int(match["line"])] = _QUALIFIED.sub(r"\1", match["type"])
    path = HERE / program
    source = path.read_text().splitlines()
    expected = {n: t for n, t in _marked(path, "  # ").items() if "reveal_type(" in source[n - 1]}
    assert expected and revealed == expected


@pytest.mark.timeout(600)
def test_mypy_finds_a_users_mistakes(checked: dict[str, list[str]]) -> None:
    found: dict[int, set[str]] = {}
    for line in checked.get("user_errors.py", []):
        match = _ERROR.match(line)
        if match:
            found.setdefault(int(match["line"]), set()).add(match["code"])
    expected = {n: {code} for n, code in _marked(HERE / "user_errors.py", "  # error: ").items()}
    assert expected and found == expected
