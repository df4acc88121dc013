"""Methods that ``inspect`` must see as async although something of theirs happens at the call.

Tools sniff ``inspect.iscoroutinefunction`` (``asyncio.iscoroutinefunction``,
``unittest.mock``, starlette's ``is_async_callable``) and
``inspect.isasyncgenfunction`` to know whether to ``await`` a call or iterate it
with ``async for``.  Two decorators keep those checks true, on every Python from
3.11, for the methods that must also act at once:

- ``refused_while_tracing(refusal)`` on an ``async def``: looking it up binds the
  ``async def`` itself (so ``inspect`` sees it as it is, signature included),
  except while this thread traces a compiled function, where it binds ``refusal``,
  which raises at the call -- the body of a coroutine that is never awaited (a
  compiled function cannot await) would never run to refuse.  The check costs one
  lookup, no more than a plain method that checks and returns a coroutine.
- ``async_generator_function`` on a plain ``def`` that checks its arguments at the
  call and returns an async generator (``eng.map``).  Python has no marker for that
  (``inspect.markcoroutinefunction``, 3.12+, marks coroutine functions only), but
  ``inspect`` takes any callable with a function's attributes as a function
  (``_signature_is_functionlike``): the method is such an object, whose ``__code__``
  is the ``def``'s own, flagged ``CO_ASYNC_GENERATOR``, and is only read, never run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import CodeType, MethodType
from typing import Any, NoReturn, TypeVar, cast

from ._tracing import ACTIVE, tracing

__all__ = ["async_generator_function", "refused_while_tracing"]

F = TypeVar("F", bound=Callable[..., Any])


def refused_while_tracing(refusal: Callable[..., NoReturn]) -> Callable[[F], F]:
    """Decorate an ``async def`` method that ``refusal`` (called with the same arguments) replaces while tracing."""

    def decorate(fn: F) -> F:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"refused_while_tracing decorates an async def, not {fn!r}")
        return cast(F, _RefusedWhileTracing(fn, refusal))

    return decorate


class _RefusedWhileTracing:
    """The descriptor of ``refused_while_tracing``: binds the ``async def``, or while tracing ``refusal``."""

    __slots__ = ("__dict__", "_fn", "_refusal")

    def __init__(self, fn: Callable[..., Any], refusal: Callable[..., NoReturn]) -> None:
        functools.update_wrapper(cast(Any, self), fn)  # name, docstring, __wrapped__ for help() and tools
        self._fn = fn
        self._refusal = refusal

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        fn = self._refusal if ACTIVE[0] and tracing.depth else self._fn
        return fn if obj is None else MethodType(fn, obj)


def async_generator_function(fn: F) -> F:
    """Decorate a ``def`` method that returns an async generator, for ``inspect.isasyncgenfunction``."""
    return cast(F, _AsyncGeneratorFunction(fn))


class _AsyncGeneratorFunction:
    """A function-like object: ``inspect`` reads its ``__code__`` (flagged), calling it calls the ``def``."""

    __code__: CodeType
    __defaults__: tuple[Any, ...] | None
    __kwdefaults__: dict[str, Any] | None
    __wrapped__: Callable[..., Any]
    __qualname__: str

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)  # also __annotations__, and __wrapped__ for inspect.signature
        code = fn.__code__
        self.__code__ = code.replace(co_flags=code.co_flags | inspect.CO_ASYNC_GENERATOR)
        self.__defaults__ = fn.__defaults__  # inspect wants these too (None or a tuple, None or a dict)
        self.__kwdefaults__ = fn.__kwdefaults__

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        return self if obj is None else MethodType(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<async generator function {self.__qualname__}>"
