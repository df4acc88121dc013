"""The engine's own keywords on ``submit``: a call never takes one that the function declares.

``eng.submit(fn, *args, device=, priority=, name=, reads=, writes=, nbytes=, **kwargs)``
keeps those six keywords for itself and passes the rest to ``fn``.  If ``fn``'s
own signature declares one of them and the call gives it, the call is
ambiguous: ``fn`` would silently run with its default.  Such a call is
refused with ``ss.InvalidTask``, whose message shows how to give the keyword
to ``fn`` (bind it with ``functools.partial``: a keyword a partial binds is
``fn``'s, and the engine's option of that name stays free for the task).
NumPy's and CuPy's own ``device=`` (``np.zeros(3, device=...)``) says where
the array is made, which is what the engine's ``device=`` says: it is not
refused (``eng.submit(np.zeros, 3, device="cuda:0")`` runs on ``cuda:0``).

Signatures are read only when a call gives an option, and cached per function.
"""

from __future__ import annotations

import functools
import inspect
import reprlib
import types
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidTask

__all__ = ["OPTIONS", "declared_options", "given", "refuse_taken"]

#: the keywords ``eng.submit`` takes for itself, and what each is to the engine
OPTIONS: Mapping[str, str] = types.MappingProxyType(
    {
        "device": "the device the task runs on",
        "priority": "the task's priority",
        "name": "the task's name",
        "reads": "memory the task reads",
        "writes": "memory the task writes",
        "nbytes": "the bytes the task's result holds",
    }
)
_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_MAX_CACHED = 1024
#: libraries whose functions' own ``device=`` (NumPy 2's ``np.zeros(..., device=)``, the array API's) is where
#: the array is made: that is the engine's ``device=``, so it is not the function's keyword to refuse
_ARRAY_LIBRARIES = frozenset({"numpy", "cupy"})
#: callable (a bound method's: its function) -> the options its signature declares; cleared when full
_declared: dict[Any, frozenset[str]] = {}


def declared_options(fn: Any) -> frozenset[str]:
    """The names of ``OPTIONS`` that ``fn`` declares as parameters it takes by keyword (a ``**kwargs`` declares
    none); a keyword that a ``functools.partial`` binds is already ``fn``'s, so it is not counted."""
    if isinstance(fn, functools.partial):  # (not cached: a partial is often made per call)
        return declared_options(fn.func) - fn.keywords.keys()
    key = _key(fn)
    try:
        return _declared[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: read each time
        return _read(fn)
    names = _read(fn)
    if len(_declared) >= _MAX_CACHED:
        _declared.clear()
    _declared[key] = names
    return names


def _key(fn: Any) -> Any:
    """``fn``, or a bound method's function (a new method object is made at every attribute access)."""
    return fn.__func__ if isinstance(fn, types.MethodType) else fn


def _read(fn: Any) -> frozenset[str]:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or ufunc without a signature: declares none
        return frozenset()
    names = frozenset(p.name for p in parameters if p.kind in _KINDS and p.name in OPTIONS)
    if "device" in names and str(getattr(fn, "__module__", None)).partition(".")[0] in _ARRAY_LIBRARIES:
        names -= {"device"}  # NumPy's (the array API's) device=: where the array goes, which the engine says
    return names


def refuse_taken(fn: Any, call: str, given: Mapping[str, Any]) -> None:
    """Raise InvalidTask if ``fn`` declares any of the engine's options that ``given`` (option -> value, as
    the call gave them) holds; else return.  ``call`` names the call for the message (``eng.submit``)."""
    taken = declared_options(fn) & given.keys()
    if taken:
        raise InvalidTask(_message(fn, call, {name: given[name] for name in sorted(taken)}))


def _message(fn: Any, call: str, taken: dict[str, Any]) -> str:
    label = _name(fn)
    names = ", ".join(f"'{name}'" for name in taken)
    meanings = "; ".join(f"{name}=: {OPTIONS[name]}" for name in taken)
    bound = ", ".join(f"{name}={reprlib.repr(value)}" for name, value in taken.items())
    return (
        f"{call}({label}, ..., {bound}): {label} declares the keyword{'s' if len(taken) > 1 else ''} {names}, "
        f"which {call} keeps for the engine ({meanings}), so {label} would run with its own default. "
        f"To give {'them' if len(taken) > 1 else 'it'} to {label}, bind {'them' if len(taken) > 1 else 'it'}: "
        f"{call}(functools.partial({label}, {bound}), ...); an engine option of the same name then goes "
        f"beside it, as usual ({call}(functools.partial({label}, {bound}), ..., {next(iter(taken))}=...))"
    )


def _name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({_name(fn.func)}, ...)"
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


def given(
    device: str | None, priority: int, name: str | None, reads: Any, writes: Any, nbytes: int | None
) -> dict[str, Any]:
    """The options a ``submit`` call gave (those not at their defaults)."""
    given = {"device": device, "name": name, "nbytes": nbytes}
    given = {key: value for key, value in given.items() if value is not None}
    if type(priority) is not int or priority:
        given["priority"] = priority
    if type(reads) is not tuple or reads:
        given["reads"] = reads
    if type(writes) is not tuple or writes:
        given["writes"] = writes
    return given
