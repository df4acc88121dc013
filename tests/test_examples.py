"""The examples the README shows run and print what the README says."""

from __future__ import annotations

import asyncio
import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_tour_prints_what_the_readme_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # it writes run.json
    runpy.run_path(str(EXAMPLES / "tour.py"), run_name="__main__")
    assert capsys.readouterr().out.splitlines() == ["0.05", "[5. 5.] 0.049958", "[5.0, 10.0]"]
    assert (tmp_path / "run.json").stat().st_size > 0


def test_three_stage_pipeline_equals_the_sequential_loop() -> None:
    module = runpy.run_path(str(EXAMPLES / "pipeline.py"))
    expected = [module["postprocess"](module["compute"](module["load"](i))) for i in range(6)]
    assert asyncio.run(asyncio.wait_for(module["main"](6), 60)) == expected


def test_the_readme_shows_the_tour_as_it_runs() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("## Ten-line tour", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = (EXAMPLES / "tour.py").read_text()
    main = block.split("async def main", 1)[1].split("\n\n", 1)[0]
    lines = ("async def main" + main).splitlines()
    assert len(lines) == 10  # ten lines, async def main() included (the imports and asyncio.run around them)
    assert "\n".join(lines) in source.replace(" -> None:", ":"), "README's tour differs from examples/tour.py"
    assert block.startswith("import asyncio\n") and block.endswith(
        "\nasyncio.run(main())\n"
    )  # runs as pasted
