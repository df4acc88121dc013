"""The documentation's generated parts: the settings table comes from ``ss.Config`` itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import schedsvc as ss

REPO = Path(__file__).resolve().parents[1]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_page_asks_for_the_generated_table() -> None:
    hooks = _hooks()
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page.count(hooks.MARKER) == 1
    rendered = hooks.on_page_markdown(page)
    assert hooks.MARKER not in rendered and hooks.config_table() in rendered


def test_the_table_has_a_row_per_setting_with_its_variable_and_description() -> None:
    rows = _hooks().config_table().splitlines()[2:]
    assert len(rows) == len(ss.Config.model_fields)
    for row, name in zip(rows, ss.Config.model_fields, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert cells[0] == f"`{name}`"
        assert cells[3] == f"`SCHEDSVC_{name.upper()}`"
        assert len(cells[4]) > 10, f"{name} has no description"


def test_descriptions_and_defaults_are_the_code_s() -> None:
    hooks = _hooks()
    table = hooks.config_table()
    assert "| `max_pending` | `int` (≥ 1) | `1024` |" in table
    assert "computed: `os.cpu_count() or 1`" in table  # a default computed per machine is shown as code
    descriptions = hooks.field_descriptions(ss.Config)
    assert set(descriptions) == set(ss.Config.model_fields)
    assert descriptions["sync_mode"].startswith("Debugging: run each task in the caller")
    assert " ".join(descriptions["cuda_simulator"].split()) in table
