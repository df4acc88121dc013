"""Find what a task depends on in its arguments, and put values in their place.

A ``Task`` (a Future) anywhere in args/kwargs -- also inside lists, tuples and
dicts -- is a data dependency.  A NumPy array (or a Tensor, a memoryview, any
buffer exporter) is a read of the memory it exposes, keyed by the object that
owns that memory (``_memory``: a view, however it was made, counts as its
owner); ``out=`` and ``writes=`` are writes; ``reads=`` adds reads the engine
cannot see.  ``reads=``/``writes=`` take only what exposes memory (or Futures,
Tensors and containers of them): anything else could order nothing, so it is
refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._core import Buffer, Task, safe_repr
from .._errors import InvalidTask
from ._memory import exports_memory, memory_of

__all__ = [
    "SCALAR_TYPES",
    "buffer_of",
    "register_buffer_types",
    "replace_leaves",
    "scan",
    "substitute",
    "substitute_args",
    "tasks_and_scalars",
]

_ndarray = np.ndarray
#: the default of reads= and writes=: none declared
_NONE: tuple[()] = ()
# values with no dependency and no memory a task could write: NumPy scalars are immutable too (but
# np.void can be a view into a structured array, so it is walked like other objects)
_SCALARS = {kind for kind in np.sctypeDict.values() if kind not in (np.void, np.object_)}
_LEAVES = frozenset({int, float, bool, str, bytes, complex, type(None), slice, type(Ellipsis), *_SCALARS})
#: the types of arguments that hold no array and no Task: scalars (a device moves nothing in for them)
SCALAR_TYPES = _LEAVES
#: what a scan passes over: the leaves but ``bytes``, whose memory is read (counted in max_pending_bytes)
_PASSED = _LEAVES - {bytes}


#: argument types devices understand as memory (a CuPy array, say), beyond NumPy arrays and the
#: buffer protocol, with how to key them: type -> (obj -> (key, nbytes)), the same key for every view
_KEYERS: dict[type, Callable[[Any], tuple[int, int]]] = {}


def register_buffer_types(keyers: Mapping[type, Callable[[Any], tuple[int, int]]]) -> None:
    """Scan arguments of these types as memory from now on (a device's ``buffer_types``)."""
    _KEYERS.update(keyers)


def buffer_of(array: np.ndarray) -> tuple[int, int]:
    """(key, nbytes) of the memory ``array`` lives in."""
    base = array.base
    if base is None:  # the array owns its memory (hot path)
        return id(array), array.nbytes
    if type(base) is np.ndarray and base.base is None:  # a view of one that does (a reshape, a slice)
        return id(base), base.nbytes
    return memory_of(array)


class _Found:
    """Dependencies and buffers met while walking the arguments."""

    __slots__ = ("buffers", "deps")

    def __init__(self) -> None:
        self.deps: list[Task] = []
        self.buffers: dict[int, list[Any]] = {}  # key -> [nbytes, is_write]

    def array(self, array: np.ndarray, write: bool) -> None:
        self.memory(buffer_of(array), write)

    def memory(self, memory: tuple[int, ...], write: bool) -> None:
        key, nbytes = memory[0], memory[1]
        entry = self.buffers.get(key)
        if entry is None:
            self.buffers[key] = [nbytes, write]
        elif write:
            entry[1] = True

    def visit(self, obj: Any, write: bool = False, declared: str | None = None) -> None:
        """Note what ``obj`` depends on; ``declared``: the option it came from (reads=/writes=)."""
        kind = type(obj)
        if kind in _PASSED:
            if declared is not None and obj is not None:
                raise _not_memory(declared, obj)
            return
        if kind is bytes:  # immutable memory: only ever read, whatever option names it
            self.memory((id(obj), len(obj)), False)
            return
        if kind is _ndarray or isinstance(obj, _ndarray):
            self.array(obj, write)
        elif isinstance(obj, Task):
            self.deps.append(obj)
            if obj.memory is not None:  # a Tensor: its memory is read (or written) too
                self.memory(obj.memory, write)
        elif isinstance(obj, list | tuple):  # namedtuples and other subclasses too
            for item in obj:
                self.visit(item, write, declared)
        elif isinstance(obj, dict):  # OrderedDict, defaultdict, Counter, ...
            for item in obj.values():
                self.visit(item, write, declared)
        else:
            # looked up on the type, as Python looks up its own protocols: an instance's
            # __getattr__ (user code) is not asked
            hook = getattr(kind, "__schedsvc_visit__", None)
            if hook is not None:
                hook(obj, self, write)
            elif kind in _KEYERS:  # a device array a device keys (a view keys to its base)
                self.memory(_KEYERS[kind](obj), write)
            elif exports_memory(obj):  # a memoryview, bytearray, array-interface wrapper, ...
                self.memory(memory_of(obj), write)
            elif declared is not None:
                raise _not_memory(declared, obj)


def _not_memory(declared: str, obj: Any) -> InvalidTask:
    return InvalidTask(
        f"{declared}= names the memory a task reads or writes, so that tasks using it are ordered; "
        f"got {type(obj).__name__} {safe_repr(obj)}, which exposes no memory and would order nothing. "
        f"Pass the arrays themselves ({declared}=buf or {declared}=[a, b]): NumPy arrays, Tensors, "
        "Futures, memoryviews or other buffer objects"
    )


def scan(
    args: tuple[Any, ...], kwargs: dict[str, Any], reads: Any, writes: Any
) -> tuple[tuple[Task, ...], tuple[Buffer, ...]]:
    """Return (data dependencies, buffers) of a task's arguments."""
    # reads=/writes= take one array or a container of them: "none given" is the empty-tuple default,
    # told by identity (CPython has one empty tuple; an array's truth value is ambiguous)
    if not kwargs and reads is _NONE and writes is _NONE and len(args) <= 2:
        fast = _scan_small(args)
        if fast is not None:
            return fast
    found = _Found()
    for arg in args:
        found.visit(arg)
    for key, value in kwargs.items():
        found.visit(value, write=key == "out")
    found.visit(reads, False, "reads")
    found.visit(writes, True, "writes")
    buffers = tuple((key, nb, w) for key, (nb, w) in found.buffers.items())
    return tuple(found.deps), buffers


def _scan_small(args: tuple[Any, ...]) -> tuple[tuple[Task, ...], tuple[Buffer, ...]] | None:
    """Hot path for ``fn(x)`` / ``fn(x, y)`` with arrays, futures or scalars; None: use the walk."""
    deps: tuple[Task, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    for arg in args:
        kind = type(arg)
        if kind is _ndarray:
            base = arg.base
            if base is not None:
                return None
            if buffers:
                if buffers[0][0] == id(arg):
                    continue
                buffers = (buffers[0], (id(arg), arg.nbytes, False))
            else:
                buffers = ((id(arg), arg.nbytes, False),)
        elif kind in _PASSED:
            continue
        elif isinstance(arg, Task) and arg.memory is None:
            deps = (*deps, arg)
        else:  # (bytes too: the walk counts them)
            return None
    return deps, buffers


def substitute_args(args: tuple[Any, ...]) -> list[Any]:
    """The positional arguments with values in place of Tasks (hot path of dependent tasks)."""
    return [a if type(a) is _ndarray else a.value if isinstance(a, Task) else substitute(a) for a in args]


def substitute(obj: Any) -> Any:
    """``obj`` with every Task replaced by its value (containers rebuilt as needed)."""
    kind = type(obj)
    if kind in _LEAVES or kind is _ndarray:
        return obj
    if isinstance(obj, Task):
        return obj.value
    if kind is list:
        return [substitute(x) for x in obj]
    if kind is tuple:
        return tuple(substitute(x) for x in obj)
    if kind is dict:
        return {k: substitute(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        items = [substitute(x) for x in obj]
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    if isinstance(obj, list | dict):  # a shallow copy keeps the subclass and its state
        new = copy.copy(obj)
        if isinstance(obj, list):
            new[:] = [substitute(x) for x in obj]
        else:
            for key, value in obj.items():
                new[key] = substitute(value)
        return new
    hook = getattr(kind, "__schedsvc_substitute__", None)
    return obj if hook is None else hook(obj)


def tasks_and_scalars(args: tuple[Any, ...]) -> bool:
    """Is every argument a Task or a scalar (nothing a device moves in: no array, no container)?"""
    for arg in args:  # noqa: SIM110 - hot path: a loop runs no generator's frame
        if type(arg) not in _LEAVES and not isinstance(arg, Task):
            return False
    return True


def replace_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with ``leaf(x)`` in place of each ``x`` that is not a list, tuple or dict, walking
    containers as ``substitute`` does (subclasses kept); a container with nothing replaced is
    returned itself, so walking arguments that need nothing allocates nothing."""
    kind = type(obj)
    if kind is list or kind is tuple or isinstance(obj, list | tuple):
        items = [replace_leaves(x, leaf) for x in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        if kind is list or kind is tuple:
            return kind(items)
        if isinstance(obj, tuple):
            return kind._make(items) if hasattr(kind, "_make") else kind(items)
        copied = copy.copy(obj)  # a list subclass: its state kept
        copied[:] = items
        return copied
    if kind is dict or isinstance(obj, dict):
        values = {k: replace_leaves(v, leaf) for k, v in obj.items()}
        if all(values[k] is v for k, v in obj.items()):
            return obj
        if kind is dict:
            return values
        copied = copy.copy(obj)
        copied.update(values)
        return copied
    return leaf(obj)
