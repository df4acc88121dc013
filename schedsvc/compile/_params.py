"""A compiled function's parameters, as its messages name them and ``batched=`` must match them."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .._core import name_of

__all__ = ["argument_name", "check_batched"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def argument_name(fn: Any, slot: Any) -> str:
    """How a message names argument ``slot`` of ``fn``: its position and parameter name, or its keyword."""
    if isinstance(slot, str):
        return f"argument {slot!r}"
    with contextlib.suppress(TypeError, ValueError):  # (no signature to read: the position says it)
        named = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in _POSITIONAL]
        if slot < len(named):
            return f"argument {slot} ({named[slot]!r})"
    return f"argument {slot}"


def check_batched(fn: Callable[..., Any], batched: Sequence[int | str]) -> None:
    """Refuse ``batched=`` naming a position or keyword ``fn`` has no parameter for: no call could pass
    it, so each would fail (with no batched argument) instead of this one at compile."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): the calls tell
        return
    kinds = {p.kind for p in parameters}
    positional = [p.name for p in parameters if p.kind in _POSITIONAL]
    keywords = [p.name for p in parameters if p.kind in _KEYWORD]
    for slot in batched:
        if isinstance(slot, int) and (
            slot < 0 or (slot >= len(positional) and inspect.Parameter.VAR_POSITIONAL not in kinds)
        ):
            raise ValueError(
                f"eng.compile({name_of(fn)}, batched={list(batched)!r}): position {slot} names no parameter: "
                f"{name_of(fn)} takes {len(positional)} positional ({', '.join(positional) or 'none'}); name "
                "the batched arguments by their positions from 0, or by keyword"
            )
        if isinstance(slot, str) and slot not in keywords and inspect.Parameter.VAR_KEYWORD not in kinds:
            raise ValueError(
                f"eng.compile({name_of(fn)}, batched={list(batched)!r}): {slot!r} is not a parameter of "
                f"{name_of(fn)} (its keywords: {', '.join(keywords) or 'none'}); name the batched arguments "
                "by keyword, or by their positions from 0"
            )
