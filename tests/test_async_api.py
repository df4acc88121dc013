"""``inspect`` tells the truth about the public API: what returns a coroutine is a coroutine function.

Tools sniff ``inspect.iscoroutinefunction`` (``asyncio``'s, ``unittest.mock``, starlette's
``is_async_callable``) and ``inspect.isasyncgenfunction`` to decide whether to await a call or iterate
it.  The walk covers every public method of every public class: one that is declared to return a
``Coroutine``/``Awaitable`` must be a coroutine function, one that returns an ``AsyncGenerator``/
``AsyncIterator`` an async generator function -- on the class and bound -- so a new method cannot
regress it (mypy strict makes every method declare what it returns).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
import types
import unittest.mock
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import TIMEOUT, within

_COROUTINE = re.compile(r"^(collections\.abc\.|typing\.)?(Coroutine|Awaitable)\[")
_ASYNC_GEN = re.compile(r"^(collections\.abc\.|typing\.)?(AsyncGenerator|AsyncIterator)\[")
_DUNDERS = ("__call__", "__aenter__", "__aexit__", "__aiter__", "__anext__")


def public_methods() -> Iterator[tuple[type, str, Callable[..., Any]]]:
    for name in ss.__all__:
        cls = getattr(ss, name)
        if not isinstance(cls, type) or issubclass(cls, BaseException):
            continue
        for attr in sorted(set(dir(cls))):
            if attr.startswith("_") and attr not in _DUNDERS:
                continue
            raw = inspect.getattr_static(cls, attr)
            if isinstance(raw, property | types.MemberDescriptorType | staticmethod | classmethod):
                continue
            method = getattr(cls, attr)
            if callable(method) and not isinstance(method, type) and hasattr(method, "__code__"):
                yield cls, attr, method


def declared(method: Callable[..., Any]) -> str:
    """What ``method`` is declared to return: 'coroutine', 'asyncgen' or 'other' (an async def's await)."""
    returns = inspect.signature(method).return_annotation
    if inspect.iscoroutinefunction(method) or (isinstance(returns, str) and _COROUTINE.match(returns)):
        return "coroutine"
    if inspect.isasyncgenfunction(method) or (isinstance(returns, str) and _ASYNC_GEN.match(returns)):
        return "asyncgen"
    return "other"


def checks(fn: Callable[..., Any]) -> tuple[bool, bool]:
    coroutine = inspect.iscoroutinefunction(fn)
    if sys.version_info < (3, 14):  # asyncio's is deprecated from 3.14 (it is inspect's there)
        assert asyncio.iscoroutinefunction(fn) == coroutine, fn
    return coroutine, inspect.isasyncgenfunction(fn)


WALK = list(public_methods())


@pytest.mark.parametrize(("cls", "attr", "method"), WALK, ids=[f"{c.__name__}.{a}" for c, a, _ in WALK])
def test_inspect_sees_what_a_public_method_returns(cls: type, attr: str, method: Callable[..., Any]) -> None:
    kind = declared(method)
    assert checks(method) == (kind == "coroutine", kind == "asyncgen"), f"{cls.__name__}.{attr}"


def test_the_walk_finds_the_async_api() -> None:
    found = {f"{cls.__name__}.{attr}": declared(method) for cls, attr, method in WALK}
    for name in ["Engine.submit", "Engine.run", "Engine.waitall", "Engine.start", "Engine.aclose"]:
        assert found[name] == "coroutine", name
    assert found["Engine.__aenter__"] == found["Compiled.submit"] == found["Future.wait"] == "coroutine"
    assert found["Engine.map"] == "asyncgen"
    assert found["Engine.submit_nowait"] == found["Compiled.__call__"] == found["Tensor.to"] == "other"


async def test_bound_methods_say_what_their_call_gives(engine: ss.Engine) -> None:
    x = engine.asarray(np.arange(3.0))
    compiled = engine.compile(lambda a: a + 1)
    submitted = engine.submit(abs, -1)
    mapped = engine.map(abs, [-1])
    replayed = compiled.submit(x)
    waited = (await submitted).wait()
    assert [inspect.iscoroutine(c) for c in (submitted, replayed, waited)] == [True] * 3
    assert inspect.isasyncgen(mapped)
    for bound in (engine.submit, compiled.submit, engine.run, (await within(waited)).wait):
        assert checks(bound) == (True, False), bound
    assert checks(engine.map) == (False, True)
    # a compiled function's call queues at once and gives a Tensor (awaitable, not a coroutine)
    called = compiled(x)
    assert isinstance(called, ss.Tensor) and checks(compiled) == (False, False)
    assert [v async for v in mapped] == [1]
    assert (await within(await within(replayed))).tolist() == (await within(called)).tolist() == [1, 2, 3]


def test_signatures_are_the_methods_own() -> None:
    eng = ss.Engine()
    submit = inspect.signature(eng.submit)
    assert list(submit.parameters)[:2] == ["fn", "args"] and "device" in submit.parameters
    assert submit.return_annotation == "Future[T]"
    assert next(iter(inspect.signature(ss.Engine.submit).parameters)) == "self"
    assert list(inspect.signature(eng.map).parameters)[:3] == ["fn", "source", "max_inflight"]
    assert next(iter(inspect.signature(ss.Engine.map).parameters)) == "self"
    assert ss.Engine.submit.__name__ == "submit" and ss.Engine.submit.__doc__
    assert ss.Engine.map.__name__ == "map" and ss.Engine.map.__doc__


def test_tools_that_sniff_see_coroutines() -> None:
    mock = unittest.mock.create_autospec(ss.Engine, instance=True)
    assert isinstance(mock.submit, unittest.mock.AsyncMock)
    assert not isinstance(mock.submit_nowait, unittest.mock.AsyncMock)
    concurrency = pytest.importorskip("starlette._utils")
    assert concurrency.is_async_callable(ss.Engine().submit)


async def test_map_checks_its_arguments_at_the_call(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match="async function"):
        engine.map(asyncio.sleep, [1])
    with pytest.raises(TypeError, match="max_inflight"):
        engine.map(abs, [1], max_inflight=0.5)


async def test_submit_refuses_while_tracing_at_the_call(engine: ss.Engine) -> None:
    """Looked up inside a compiled function, ``eng.submit`` refuses when called (naming the function)."""
    looked_up: list[Any] = []

    def inside(x: Any) -> Any:
        submit = engine.submit  # a look-up alone does not raise
        looked_up.append(submit)
        submit(np.sum, x)
        return x + 1

    with pytest.raises(ss.TraceError, match=r"eng.submit\(sum, ...\) inside a compiled function"):
        engine.compile(inside)(engine.asarray(np.ones(2)))
    assert len(looked_up) == 1
    assert checks(engine.submit) == (True, False)  # outside a trace again
    assert (await within(await within(engine.submit(abs, -2)), TIMEOUT)) == 2


async def test_compiled_submit_refuses_while_tracing(engine: ss.Engine) -> None:
    inner = engine.compile(lambda a: a * 2)

    def outer(x: Any) -> Any:
        inner.submit(x)
        return x

    with pytest.raises(ss.TraceError, match=r"\.submit\(\) inside a compiled function: call it"):
        engine.compile(outer)(engine.asarray(np.ones(2)))
