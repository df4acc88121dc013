"""Every ```python block of README.md and of the documentation pages runs as pasted: saved as a script and run
in a fresh interpreter.  A block followed by "It prints:" and a ```text block must print exactly that."""

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
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
_BLOCK = re.compile(
    r"^```python\n(.*?)^```\n(?:\nIt prints:\n\n```text\n(.*?)^```)?", re.MULTILINE | re.DOTALL
)
_HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.MULTILINE)
#: modules of optional extras: a block that imports one is skipped where it is not installed
_OPTIONAL = {"dask", "distributed", "prometheus_client", "matplotlib", "cupy", "trio"}
_DASK = 'backend="dask"'


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def _page_name(page: Path) -> str:
    return "README" if page == README else page.relative_to(DOCS).with_suffix("").as_posix()


def python_blocks(page: Path) -> list[str]:
    return [match.group(1) for match in _BLOCK.finditer(page.read_text(encoding="utf-8"))]


def doc_blocks() -> list[Any]:
    """Each block as a pytest param, named after its page and the heading above it (and its number under it)."""
    params = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        seen = dict[str, int]()
        for match in _BLOCK.finditer(text):
            headings = _HEADING.findall(text, 0, match.start())
            name = f"{_page_name(page)}:{_slug(headings[-1]) if headings else 'top'}"
            seen[name] = seen.get(name, 0) + 1
            marks = [pytest.mark.dask, pytest.mark.slow] if _DASK in match.group(1) else []
            params.append(
                pytest.param(match.group(1), match.group(2), id=f"{name}-{seen[name]}", marks=marks)
            )
    return params


def test_the_readme_is_a_front_page_with_the_tour() -> None:
    assert README.stat().st_size <= 12 * 1024, (
        "README.md is the front page: at most 12 KB; the manual is docs/"
    )
    assert len(python_blocks(README)) >= 1


def test_every_guide_page_shows_runnable_code() -> None:
    guides = sorted((DOCS / "guide").glob("*.md"))
    assert len(guides) >= 10
    assert [g.name for g in guides if not python_blocks(g)] == []
    assert len(doc_blocks()) >= 16


def test_the_tour_shows_what_it_prints() -> None:
    printed = [output for _, output in (param.values for param in doc_blocks()) if output is not None]
    assert len(printed) >= 2  # the README's tour and getting-started's


@pytest.mark.parametrize(("code", "printed"), doc_blocks())
def test_doc_block_runs_as_pasted(code: str, printed: str | None, tmp_path: Path) -> None:
    """The block alone, as a script in an empty directory (files it writes land there)."""
    if re.search(r"^async def main\(", code, re.MULTILINE):  # else the block would define it and run nothing
        assert "asyncio.run(main(" in code or "trio.run(main)" in code, (
            f"block defines main() but never runs it:\n{code}"
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
    assert result.returncode == 0, f"block failed:\n{code}\n--- stderr:\n{result.stderr}"
    if printed is not None:
        assert result.stdout == printed, "the output shown under the block differs from what it prints"
