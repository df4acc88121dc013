"""Every ```python block of README.md runs as pasted: saved as a script and run in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.MULTILINE)
#: modules of optional extras: a block that imports one is skipped where it is not installed
_OPTIONAL = {"dask", "distributed", "prometheus_client", "matplotlib", "cupy", "trio"}
_DASK = 'backend="dask"'


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def readme_blocks() -> list[Any]:
    """Each block as a pytest param, named after the heading above it (and its number under it)."""
    text = README.read_text(encoding="utf-8")
    params, seen = [], dict[str, int]()
    for match in _BLOCK.finditer(text):
        headings = _HEADING.findall(text, 0, match.start())
        name = _slug(headings[-1]) if headings else "top"
        seen[name] = seen.get(name, 0) + 1
        marks = [pytest.mark.dask, pytest.mark.slow] if _DASK in match.group(1) else []
        params.append(pytest.param(match.group(1), id=f"{name}-{seen[name]}", marks=marks))
    return params


def test_the_readme_has_python_blocks() -> None:
    assert len(readme_blocks()) >= 5


@pytest.mark.parametrize("code", readme_blocks())
def test_readme_block_runs_as_pasted(code: str, tmp_path: Path) -> None:
    """The block alone, as a script in an empty directory (files it writes land there)."""
    if re.search(r"^async def main\(", code, re.MULTILINE):  # else the block would define it and run nothing
        assert "asyncio.run(main(" in code or "trio.run(main)" in code, (
            f"README block defines main() but never runs it:\n{code}"
        )
    needed = set(_IMPORT.findall(code)) | ({"distributed"} if _DASK in code else set())
    for module in sorted(needed & _OPTIONAL):
        pytest.importorskip(module)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, f"README block failed:\n{code}\n--- stderr:\n{result.stderr}"
