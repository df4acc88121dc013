"""MkDocs hook (mkdocs.yml ``hooks:``): the configuration page's table of settings, from ``schedsvc.Config``.

A page that holds the line ``<!-- config-table -->`` gets, in its place, a table of every ``Config`` field:
its type and constraints, its default, its environment variable and its description (the docstring under
the field), so the page can never disagree with the code.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from typing import Any

from pydantic.fields import FieldInfo

MARKER = "<!-- config-table -->"
_PREFIX = "SCHEDSVC_"
_CONSTRAINTS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with the table (MkDocs calls this for every page)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_table())


def config_table() -> str:
    """The Markdown table of ``schedsvc.Config``'s fields, in their order in the class."""
    from schedsvc import Config

    descriptions = field_descriptions(Config)
    factories = default_factory_sources(Config)
    rows = ["| setting | type | default | environment variable | description |", "|---|---|---|---|---|"]
    for name, field in Config.model_fields.items():
        default = f"computed: `{factories[name]}`" if name in factories else f"`{field.default!r}`"
        description = " ".join(descriptions.get(name, "").split())
        cells = [f"`{name}`", _type(field), default, f"`{_PREFIX}{name.upper()}`", description]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


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
    limits = [
        f"{symbol} {getattr(meta, key)}"
        for meta in field.metadata
        for key, symbol in _CONSTRAINTS.items()
        if getattr(meta, key, None) is not None
    ]
    return f"`{text}`" + (f" ({', '.join(limits)})" if limits else "")
