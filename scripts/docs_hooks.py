"""MkDocs hooks (mkdocs.yml ``hooks:``): the configuration page's settings, and code that fits its column.

A page that holds the line ``<!-- config-settings -->`` gets, in its place, a section per ``Config`` field:
its description (the docstring under the field), its type and constraints, its default and its environment
variable, so the page can never disagree with the code.

Every rendered code block, API signatures included, must fit the content column of Material's default
layout without a scroll bar: a line longer than :func:`code_width` characters is a warning, which fails
the strict build (``mkdocs build --strict``).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import logging
import math
import textwrap
from html.parser import HTMLParser
from typing import Any

from pydantic.fields import FieldInfo

MARKER = "<!-- config-settings -->"
_PREFIX = "SCHEDSVC_"
_CONSTRAINTS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}
_log = logging.getLogger("mkdocs.hooks.docs_hooks")  # under "mkdocs": --strict counts its warnings

# Material's layout at its default (rem: the theme scales it with the window, so the count of characters
# stays the same): a 61rem grid, less the navigation and table-of-contents sidebars (12.1rem each) and the
# content's margins (1.2rem each). Any window at least 60em (960 px) wide gives a code block this much room
# or more; docs/stylesheets/extra.css only widens the grid.
COLUMN_REM = 61 - 2 * 12.1 - 2 * 1.2
COLUMN_PX = COLUMN_REM * 20  # the theme's root font: 125% of the browser's 16 px
_TEXT_REM = 0.8  # .md-typeset font size
_ADMONITION_TEXT_REM = 0.64
_CODE_EM = 0.85  # code font size, of the text's
_CODE_PADDING_EM = 1.1764705882  # each side of a code block, of the code font
_LIST_INDENT_EM = 0.625 + 1.25  # a list's margin and its items', of the text font
_ADMONITION_INSET_REM = 2 * (0.6 + 0.075)  # an admonition's padding and border, both sides
_CHAR_EM = 0.6  # the advance of Roboto Mono (and of the monospace fallbacks), of the code font


def code_width(lists: int = 0, admonitions: int = 0) -> int:
    """Characters of a code block's line that fit its column, in ``lists`` nested list items and
    ``admonitions`` nested admonitions (80 at the top of a page)."""
    text = _ADMONITION_TEXT_REM if admonitions else _TEXT_REM
    code = _CODE_EM * text
    room = COLUMN_REM - _ADMONITION_INSET_REM * admonitions - _LIST_INDENT_EM * text * lists
    return math.floor((room - 2 * _CODE_PADDING_EM * code) / (_CHAR_EM * code) + 1e-9)


def on_post_page(output: str, page: Any = None, **_: Any) -> str:
    """Warn about each line of a rendered code block (signatures included) wider than its column."""
    where = getattr(getattr(page, "file", None), "src_uri", "a page")
    for line, width in overwide_code_lines(output):
        _log.warning(
            "%s: a code line of %d characters, over the %d that fit: %s", where, len(line), width, line
        )
    return output


def overwide_code_lines(html: str) -> list[tuple[str, int]]:
    """The lines of the ``<pre>`` blocks of a page's HTML (Mermaid's diagrams aside) longer than fit, each
    with the width that fits where it is."""
    parser = _CodeBlocks()
    parser.feed(html)
    parser.close()
    return [(line, width) for text, width in parser.blocks for line in text.split("\n") if len(line) > width]


class _CodeBlocks(HTMLParser):
    """Collects each ``<pre>`` block's text and the width that fits it, from the elements around it."""

    _VOID = frozenset(
        {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, str]] = []
        self.blocks: list[tuple[str, int]] = []
        self._text: list[str] | None = None
        self._depth = 0
        self._width = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._VOID:
            return
        classes = dict(attrs).get("class") or ""
        self.open.append((tag, classes))
        if tag == "pre" and self._text is None and "mermaid" not in classes.split():
            lists = sum(t == "li" for t, _ in self.open)
            admonitions = sum(t == "details" or "admonition" in c.split() for t, c in self.open)
            self._text, self._depth, self._width = [], len(self.open), code_width(lists, admonitions)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._VOID or all(t != tag for t, _ in self.open):
            return
        while self.open and self.open.pop()[0] != tag:
            pass
        if self._text is not None and len(self.open) < self._depth:
            self.blocks.append(("".join(self._text), self._width))
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with the settings (MkDocs calls this for every page)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_settings())


def config_settings() -> str:
    """Markdown for ``schedsvc.Config``'s fields, in their order in the class: a heading per field (a link
    target), its description, and a line with its type, default and environment variable."""
    from schedsvc import Config

    descriptions = field_descriptions(Config)
    factories = default_factory_sources(Config)
    sections = []
    for name, field in Config.model_fields.items():
        description = " ".join(descriptions.get(name, "").split())
        facts = [
            f"type {_type(field)}",
            f"default {_default(field, factories.get(name))}",
            f"environment `{_PREFIX}{name.upper()}`",
        ]
        sections.append(f"### `{name}`\n\n{description}\n\n{' · '.join(facts)}\n")
    return "\n".join(sections)


def _default(field: FieldInfo, factory: str | None) -> str:
    if factory is None:
        return f"`{field.default!r}`"
    if factory.startswith("_"):  # a private helper: the page says in prose what it computes
        return "computed for this machine when a Config is built"
    return f"computed for this machine when a Config is built: `{factory}`"


def field_descriptions(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal right under its annotated assignment in the class."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        documented = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
        if documented and isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            found[statement.target.id] = inspect.cleandoc(str(following.value.value))
    return found


def default_factory_sources(cls: type) -> dict[str, str]:
    """For a field whose default is computed when a Config is built, the expression that computes it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            for keyword in getattr(node.value, "keywords", []):
                if keyword.arg == "default_factory" and isinstance(keyword.value, ast.Lambda):
                    found[node.target.id] = ast.unparse(keyword.value.body)
    return found


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    text = text or str(annotation).replace("typing.", "")
    # pydantic's ByteSize: an int of bytes, or a size with a unit
    text = text.replace("pydantic.types.ByteSize", "ByteSize")
    limits = [
        f"{symbol} {getattr(meta, key)}"
        for meta in field.metadata
        for key, symbol in _CONSTRAINTS.items()
        if getattr(meta, key, None) is not None
    ]
    text = " or ".join(
        'bytes (an `int`, or a size such as `"1GiB"`)' if part == "ByteSize" else f"`{part}`"
        for part in text.split(" | ")
    )
    return text + (f" ({', '.join(limits)})" if limits else "")
