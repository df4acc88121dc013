"""The documentation's generated parts: the configuration page's settings come from ``ss.Config`` itself."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import schedsvc as ss
from tests.examples import load_script

REPO = Path(__file__).resolve().parents[1]


def _hooks() -> ModuleType:
    return load_script(REPO / "scripts" / "docs_hooks.py", "docs_hooks")


def test_the_configuration_page_asks_for_the_generated_settings() -> None:
    hooks = _hooks()
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page.count(hooks.MARKER) == 1
    rendered = hooks.on_page_markdown(page)
    assert hooks.MARKER not in rendered and hooks.config_settings() in rendered


def test_a_section_per_setting_in_the_class_order_with_its_variable_and_description() -> None:
    hooks = _hooks()
    text = hooks.config_settings()
    assert re.findall(r"^### `(\w+)`$", text, re.MULTILINE) == list(ss.Config.model_fields)
    descriptions = hooks.field_descriptions(ss.Config)
    assert set(descriptions) == set(ss.Config.model_fields)
    for name in ss.Config.model_fields:
        section = text.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        assert " ".join(descriptions[name].split()) in section
        assert f"environment `SCHEDSVC_{name.upper()}`" in section


def test_types_limits_and_defaults_are_the_code_s() -> None:
    hooks = _hooks()
    text = hooks.config_settings()
    assert "type `int` (≥ 1) · default `1024` · environment `SCHEDSVC_MAX_PENDING`" in text
    assert (
        'type bytes (an `int`, or a size such as `"1GiB"`) or `None` (≥ 1) · default `None`' in text
    )  # max_device_bytes
    assert "computed for this machine when a Config is built: `engine_cores()`" in text
    assert hooks.field_descriptions(ss.Config)["sync_mode"].startswith(
        "Debugging: run each task in the caller"
    )


def test_the_errors_page_says_when_each_error_is_raised() -> None:
    page = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)`", page, re.MULTILINE)}
    exported = [getattr(ss, name) for name in ss.__all__]
    errors = {e.__name__ for e in exported if isinstance(e, type) and issubclass(e, ss.SchedsvcError)}
    assert len(errors) >= 10
    assert errors - {"SchedsvcError"} <= rows, "an error class has no row on docs/errors.md"
    assert "`ss.ConfigWarning`" in page and "`ss.SchedsvcError` itself is raised" in page
