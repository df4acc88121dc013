"""Which memory an object exposes, keyed by the object that owns that memory.

Two tasks conflict when they touch the same memory, however each reaches it:
the array itself, a slice or ``as_strided`` window of it, ``np.frombuffer`` or
``np.asarray(memoryview(x))`` over it, a ``memoryview``.  So a key is never the
view object: it is the *owner*, found by following what each view keeps
alive -- ``ndarray.base``, ``memoryview.obj``, a ctypes object's ``_b_base_``,
and the ``base`` of array-interface wrappers such as NumPy's own
``DummyArray`` -- to the object at the end of the chain.  Memory that no
Python object owns (a ctypes object made with ``from_address``, an array
interface with a bare pointer) is keyed by its address instead, so two views
made from the same pointer still meet.

An exporter that exposes another object's memory without a link back to it
(no ``base``, ``obj`` or ctypes link) cannot be told apart from an owner, so it
is keyed as one: that is the documented limit (declare the owner as well).

The owner stays alive while a task holds the view in its arguments, so its
``id`` cannot be reused as a key while the task is unfinished.  An address key
cannot collide with an ``id``: that memory is not a live Python object.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["exports_memory", "memory_of", "owner_of"]

_ndarray = np.ndarray
_CData: type[Any] = ctypes.c_char.__mro__[-2]  # ctypes' _CData: the base of every ctypes type
_MAX_CHAIN = 64  # a cycle of ``base`` attributes (a user object) must not loop for ever
_MAX_KINDS = 1024
_exporters: dict[type, bool] = {}  # type -> do its instances expose memory? (learned once per type)


def memory_of(obj: Any) -> tuple[int, int]:
    """(key, nbytes) of the whole memory ``obj`` exposes; ``obj`` must expose memory."""
    owner = owner_of(obj)
    if type(owner) is _ndarray or isinstance(owner, _ndarray):
        return id(owner), owner.nbytes
    if isinstance(owner, _CData):
        key = id(owner) if owner._b_needsfree_ else ctypes.addressof(owner)
        return key, ctypes.sizeof(owner)
    nbytes = _nbytes(owner)
    if nbytes is not None:
        return id(owner), nbytes
    address = _interface_address(owner)  # an array interface with no owner behind it
    return (id(owner) if address is None else address), _nbytes_of_view(obj)


def owner_of(obj: Any) -> Any:
    """The object at the end of the chain of views that ends at ``obj``'s memory."""
    base: Any
    for _ in range(_MAX_CHAIN):
        if type(obj) is _ndarray or isinstance(obj, _ndarray):
            base = obj.base
        elif type(obj) is memoryview:
            base = obj.obj
        elif isinstance(obj, _CData):
            base = _ctypes_base(obj)
        else:
            base = _attribute(obj, "base")
            if base is not None and not exports_memory(base):
                base = None  # a ``base`` that is not memory (some unrelated attribute)
        if base is None:
            return obj
        obj = base
    return obj


def _ctypes_base(obj: Any) -> Any:
    """The ctypes object whose memory ``obj`` is part of (a field, an element), or the buffer
    ``from_buffer`` made it over; None if none.

    ``_b_base_`` is also set on a pointer's ``contents``, to the pointer: that keeps the
    pointer alive, but the memory is elsewhere, so it is followed only when it holds ``obj``.
    """
    base = obj._b_base_
    if base is None:  # made by from_buffer(x)? then it keeps x's memoryview in _objects
        objects = obj._objects
        views = [v for v in objects.values() if type(v) is memoryview] if type(objects) is dict else ()
        return views[0] if len(views) == 1 else None
    start, at = ctypes.addressof(base), ctypes.addressof(obj)
    return base if start <= at < start + ctypes.sizeof(base) else None


def exports_memory(obj: Any) -> bool:
    """Does ``obj`` expose memory: an ndarray, the buffer protocol or the array interface?"""
    kind = type(obj)
    if kind is _ndarray or isinstance(obj, _ndarray) or kind is memoryview:
        return True
    known = _exporters.get(kind)
    if known is None:
        exported = _buffer(obj)
        if exported is None:  # this one could not export now (a closed mmap): no answer for its type
            return False
        known = exported or _attribute(obj, "__array_interface__") is not None
        if len(_exporters) >= _MAX_KINDS:  # classes made at run time must not grow this for ever
            _exporters.clear()
        _exporters[kind] = known
    return known


def _buffer(obj: Any) -> bool | None:
    """Does ``obj``'s type export buffers?  None: it does, but this object could not export one."""
    try:
        memoryview(obj).release()
    except TypeError:  # not a buffer exporter
        return False
    except Exception:  # an exporter whose export failed (closed, released): no memory to key now
        return None
    return True


def _nbytes(owner: Any) -> int | None:
    """Bytes of a buffer exporter's memory; None if it exports no buffer."""
    try:
        with memoryview(owner) as view:
            return view.nbytes
    except Exception:
        return None


def _nbytes_of_view(obj: Any) -> int:
    try:
        return int(np.asarray(obj).nbytes)
    except Exception:
        return 0


def _interface_address(obj: Any) -> int | None:
    interface = _attribute(obj, "__array_interface__")
    try:
        return int(interface["data"][0])
    except Exception:
        return None


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` or None; user code may raise anything from ``__getattr__``."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None
