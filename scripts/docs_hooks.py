"""MkDocs hook (mkdocs.yml ``hooks:``): the configuration page's list of settings, from ``schedsvc.Config``.

A page that holds the line ``<!-- config-settings -->`` gets, in its place, a section per ``Config`` field:
its description (the docstring under the field), its type and constraints, its default and its environment
variable, so the page can never disagree with the code.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from typing import Any

from pydantic.fields import FieldInfo

MARKER = "<!-- config-settings -->"
_PREFIX = "SCHEDSVC_"
_CONSTRAINTS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}


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
