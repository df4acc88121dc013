"""The types a user's program sees under ``mypy --strict``: ``user_code.py`` reveals them (each
``reveal_type`` line ends with the type it must reveal), ``user_errors.py`` holds mistakes mypy must find."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

HERE = Path(__file__).parent
_NOTE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is \"(?P<type>.*)\"$")
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")
_QUALIFIED = re.compile(r"\b(?:\w+\.)+(\w+)")  # schedsvc.tensor._tensor.Tensor -> Tensor


def _mypy(path: Path, cache: Path) -> list[str]:
    """mypy --strict on one file, in a process of its own (in this one it would raise the recursion limit
    for the tests after it); its output lines."""
    args = ["--strict", "--no-error-summary", "--show-error-codes", "--cache-dir", str(cache), str(path)]
    done = subprocess.run([sys.executable, "-m", "mypy", *args], capture_output=True, text=True, check=False)
    assert not done.stderr, done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module's runs: NumPy's stubs are read once."""
    return tmp_path_factory.mktemp("mypy-cache")


def _marked(path: Path, marker: str) -> dict[int, str]:
    """Line number -> what follows ``marker`` in that line's comment."""
    found: dict[int, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            found[number] = line.rsplit(marker, 1)[1].strip()
    return found


@pytest.mark.timeout(600)  # (mypy reads NumPy's stubs: tens of seconds on a loaded machine)
def test_user_code_sees_tensors_compiled_calls_and_futures_typed(cache: Path) -> None:
    path = HERE / "user_code.py"
    lines = _mypy(path, cache)
    errors = [line for line in lines if ": error:" in line]
    assert errors == []
    revealed = {}
    for line in lines:
        match = _NOTE.match(line)
        if match:
            revealed[int(match["line"])] = _QUALIFIED.sub(r"\1", match["type"])
    source = path.read_text().splitlines()
    expected = {n: t for n, t in _marked(path, "  # ").items() if "reveal_type(" in source[n - 1]}
    assert expected and revealed == expected


@pytest.mark.timeout(600)
def test_mypy_finds_a_users_mistakes(cache: Path) -> None:
    path = HERE / "user_errors.py"
    found: dict[int, set[str]] = {}
    for line in _mypy(path, cache):
        match = _ERROR.match(line)
        if match:
            found.setdefault(int(match["line"]), set()).add(match["code"])
    expected = {n: {code} for n, code in _marked(path, "  # error: ").items()}
    assert expected and found == expected
