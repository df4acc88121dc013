"""The documentation's generated parts (the configuration page's settings come from ``ss.Config`` itself),
and its layout: code that fits the page's column, pictures near their own size, short bullets, deadlines
that raise in time, and the demo's time as measured on the benchmarks page."""

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


_FENCE = re.compile(r"^( *)(`{3,}|~{3,})(\S*)[^\n]*\n(.*?)^\1\2 *$", re.MULTILINE | re.DOTALL)


def overwide_fenced_lines(markdown: str) -> list[str]:
    """The lines of a page's fenced code blocks (Mermaid's aside) wider than the column they are shown in:
    a block indented under a list item has that much less room."""
    code_width = _hooks().code_width
    over = []
    for match in _FENCE.finditer(markdown):
        indent, _, language, body = match.groups()
        width = code_width(lists=(len(indent) + 3) // 4)
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        over += [
            f"{len(line)} > {width}: {line}" for line in lines if len(line) > width and language != "mermaid"
        ]
    return over


def test_the_code_column_of_material_s_default_layout_is_80_characters() -> None:
    hooks = _hooks()
    assert hooks.code_width() == 80  # a 61rem grid, less both sidebars and the margins, in Roboto Mono
    assert hooks.code_width(lists=1) == 76 and hooks.code_width(lists=2) == 73
    css = (REPO / "docs" / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    grid = re.search(r"\.md-grid\s*{\s*max-width:\s*([\d.]+)rem", css)
    assert grid is not None and float(grid.group(1)) >= 61, (
        "extra.css may widen the grid (in rem), never narrow it"
    )


def test_every_fenced_code_block_fits_the_column() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    over = {
        page.relative_to(REPO).as_posix(): lines
        for page in pages
        if (lines := overwide_fenced_lines(page.read_text(encoding="utf-8")))
    }
    assert over == {}, "a code line is wider than the page's column (scripts/docs_hooks.py, code_width)"


def test_the_build_warns_of_a_rendered_line_too_wide_signatures_included() -> None:
    hooks = _hooks()
    signature = '<div class="doc-signature highlight"><pre><code>submit(\n    fn: Callable[..., T],\n'
    wide = "x" * 81
    page = (
        f"{signature}    name: str | None = None,\n) -&gt; Future[T]</code></pre></div>"
        f"<pre><code>{wide}</code></pre>"
        f'<ul><li><p>a</p><div class="highlight"><pre><code>{"y" * 77}</code></pre></div></li></ul>'
        f'<pre class="mermaid"><code>{"z" * 200}</code></pre>'
    )
    assert hooks.overwide_code_lines(page) == [(wide, 80), ("y" * 77, 76)]
    assert hooks.overwide_code_lines(f"{signature}    {'n' * 90}: int,\n)</code></pre></div>") == [
        (f"    {'n' * 90}: int,", 80)
    ]


def test_signatures_are_formatted_to_the_column_by_the_docs_extra_s_ruff() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    docs_extra = re.search(r"^docs = \[(.*)\]$", pyproject, re.MULTILINE)
    assert docs_extra is not None and '"ruff' in docs_extra.group(1), (
        "mkdocstrings formats signatures with ruff"
    )
    mkdocs = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+separate_signature: true$", mkdocs, re.MULTILINE)
    assert re.search(rf"^\s+line_length: {_hooks().code_width()}\b", mkdocs, re.MULTILINE)


def test_pictures_on_a_page_are_shown_near_their_own_size() -> None:
    """A picture wider than the column is shrunk to fit it, and its text with it: one shown on a page is at
    most 1.25 times the column's width in pixels (its text at 80% or more), a larger one is only linked."""
    from PIL import Image

    widest = _hooks().COLUMN_PX * 1.25
    too_wide = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for name in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text(encoding="utf-8")):
            with Image.open(page.parent / name) as image:
                if image.width > widest:
                    too_wide.append(f"{page.relative_to(REPO)}: {name} is {image.width} px wide")
    assert too_wide == [], f"over {widest:.0f} px: crop it and link the whole picture"


_ABBREVIATION = re.compile(r"\b(?:e\.g|i\.e|etc|vs|cf)\.", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z`*(\[]|\s*$)")


def bullets(markdown: str) -> list[str]:
    """A page's list items, each as one line of text (code blocks and tables under an item left out)."""
    items: list[list[str]] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        item = re.match(r"^ {0,3}(?:[-*]|\d+\.) (.*)", line)
        if fenced or line.lstrip().startswith("|"):
            continue
        if item:
            items.append([item.group(1)])
        elif items and line.startswith("  ") and line.strip():
            items[-1].append(line.strip())
        elif line.strip() and items and items[-1]:
            items.append([])  # a paragraph after an item ends it
    return [" ".join(item) for item in items if item]


def sentences(text: str) -> int:
    """How many sentences a bullet holds (inline code, parentheses and abbreviations are not ends)."""
    text = re.sub(r"`[^`]*`", "code", text)
    text = re.sub(r"\([^()]*\)", "(...)", _ABBREVIATION.sub("abbreviation", text))
    return max(1, len(_SENTENCE_END.findall(text)))


def test_a_guide_bullet_holds_one_idea_in_three_sentences_at_most() -> None:
    long = [
        f"{page.name}: {sentences(item)} sentences, {len(item.split())} words: {item[:70]}..."
        for page in sorted((REPO / "docs" / "guide").glob("*.md"))
        for item in bullets(page.read_text(encoding="utf-8"))
        if sentences(item) > 3 or len(item.split()) > 80
    ]
    assert long == [], "split the bullet: one idea each, or a section of short bullets"


def test_bullets_and_sentences_are_counted_as_read() -> None:
    page = "- One. Two (e.g. `a. B`).\n  Three.\n\n    ```python\n    x. Y\n    ```\n\nText. More.\n- Four"
    assert bullets(page) == ["One. Two (e.g. `a. B`). Three.", "Four"]
    assert [sentences(b) for b in bullets(page)] == [3, 1]


def test_deadlines_are_asyncio_timeout_never_wait_for() -> None:
    """Python 3.11's asyncio.wait_for returns a started task's value late instead of raising, so no page
    offers it as a deadline: ``async with asyncio.timeout(t)`` (``anyio.fail_after`` under trio)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    offered = [
        f"{page.relative_to(REPO)}: {match.group(0)}"
        for page in pages
        for match in re.finditer(r"await asyncio\.wait_for\([^)]*\)?", page.read_text(encoding="utf-8"))
    ]
    assert offered == []
    batching = (REPO / "docs" / "guide" / "batching.md").read_text(encoding="utf-8")
    assert "async with asyncio.timeout(0.5): y = await mlp(x)" in batching
    assert "with anyio.fail_after(0.5): y = await mlp(x)" in batching


def test_the_demo_s_time_is_the_benchmarks_page_s() -> None:
    """The README and Getting started say how long the demo takes in figures measured on the benchmarks
    page, where its section gives the commands, the machine, the date and the commit."""
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = benchmarks.split("\n## The demo\n", 1)[1].split("\n## ", 1)[0]
    for fact in (
        "time scripts/demo.sh",
        "time .venv/bin/schedsvc demo",
        "2026-11-29",
        "2-vCPU",
        "at commit `",
    ):
        assert fact in section
    for page in (REPO / "README.md", REPO / "docs" / "getting-started.md"):
        paragraphs = page.read_text(encoding="utf-8").split("\n\n")
        citing = [p for p in paragraphs if "benchmarks.md#the-demo" in p]
        assert citing, f"{page.name} does not cite the demo's time"
        assert not [p for p in paragraphs if re.search(r"\bdemo\b.*\babout \d+ s\b", p, re.DOTALL)], page.name
        for figure in re.findall(r"\b(\d+(?:\.\d+)?) s\b", "".join(citing)):
            assert re.search(rf"\b{re.escape(figure)}(?:\.\d)? s\b", section), f"{page.name}: {figure} s"
