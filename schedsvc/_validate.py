"""Checks of what users submit: a task's function must be a synchronous callable."""

from __future__ import annotations

import functools
from inspect import (
    CO_ASYNC_GENERATOR,
    CO_COROUTINE,
    CO_ITERABLE_COROUTINE,
    isasyncgenfunction,
    iscoroutinefunction,
)
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Any, NoReturn

import numpy as np

from ._core import name_of, safe_repr
from ._errors import InvalidTask, TraceError

__all__ = [
    "ASYNC_CODE",
    "SYNC_KINDS",
    "async_fn",
    "check_fn",
    "check_map_order",
    "refuse_submit_while_tracing",
    "submit_while_tracing",
]

ASYNC_CODE = CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE
SYNC_KINDS = frozenset({BuiltinFunctionType, np.ufunc, type(np.sum)})  # type(np.sum): NumPy's dispatcher
_ASYNC_CALLS: dict[type, bool] = {}  # a callable's type -> is calling it async (its __call__ is)


def check_fn(fn: Any) -> None:
    """Raise InvalidTask unless ``fn`` is a synchronous callable (a task's function)."""
    if not callable(fn):
        raise InvalidTask(f"submit() needs a callable first, got {type(fn).__name__} {safe_repr(fn)}")
    if _is_async(fn):
        raise async_fn(fn)


def check_map_order(fn: object, source: object) -> None:
    """Refuse ``eng.map(items, fn)``, the arguments swapped, naming the order (the builtin map's)."""
    if callable(source) and not callable(fn):
        raise InvalidTask(
            f"eng.map() takes the function first, then the items: eng.map(fn, items), got {fn!r}"
        )


def _is_async(fn: Any) -> bool:
    """Is ``fn`` (or what a method or partial wraps, or a callable object's ``__call__``) ``async def``?"""
    kind = type(fn)
    while kind is MethodType or kind is functools.partial:  # hot for bound methods and partials: no inspect
        fn = fn.__func__ if kind is MethodType else fn.func
        kind = type(fn)
    if kind is FunctionType:
        return bool(fn.__code__.co_flags & ASYNC_CODE)
    if kind in SYNC_KINDS:
        return False
    known = _ASYNC_CALLS.get(kind)  # other callables: their type's __call__ decides, once per type
    if known is None:
        try:
            call = kind.__call__
            known = any(iscoroutinefunction(f) or isasyncgenfunction(f) for f in (fn, call))
        except Exception:  # user objects run code in these look-ups: a callable we cannot see into is sync
            known = False
        if len(_ASYNC_CALLS) >= 1024:  # classes made at run time must not grow this for ever
            _ASYNC_CALLS.clear()
        _ASYNC_CALLS[kind] = known
    return known


def async_fn(fn: Any) -> InvalidTask:
    label = name_of(fn) or safe_repr(fn)
    return InvalidTask(
        f"{label} is an async function: a task runs on a worker thread, where calling it would only "
        "create a coroutine (or async generator) and never run it. Await it in your async code "
        f"(await {label}(...)); submit synchronous functions (def, not async def) to the engine"
    )


def submit_while_tracing(fn: Any) -> TraceError:
    return TraceError(
        f"eng.submit({name_of(fn) or 'fn'}, ...) inside a compiled function: it would run once, "
        "while tracing, and never on replay; submit outside the compiled function"
    )


def refuse_submit_while_tracing(engine: Any, fn: Any, /, *args: Any, **options: Any) -> NoReturn:
    """``eng.submit`` while this thread traces a compiled function (``_asyncdef.refused_while_tracing``)."""
    raise submit_while_tracing(fn)
