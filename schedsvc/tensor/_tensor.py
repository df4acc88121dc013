"""``Tensor``: an array whose every operation is queued as an engine task at once.

A Tensor is the Future of the task that computes it, plus what is known
before that task runs: ``shape``, ``dtype``, ``nbytes`` and ``device``.
Its array surface -- operators, NumPy ufuncs (``__array_ufunc__``) and a
documented set of NumPy functions (``__array_function__``) -- is ``ArrayOps``
(``_arrayops``), shared with compile's traced tensors; each builds a new
Tensor without waiting, through ``Tensor._run_op`` here.

Memory and ordering: every Tensor lives in some memory -- its own, or, for a
view (indexing, reshape, transpose), its base's.  Operations read that
memory; in-place operators, ``out=`` and item assignment write it.  The
engine orders these accesses like any other buffer hazard, and ``await t``
also waits for the last write to ``t``'s memory, so what it returns is what
sequential NumPy would hold at that point of the program.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeAlias

import numpy as np

from .._core import FINAL_STATES, Buffer, Task
from .._errors import InvalidTask, stop_through_await
from .._future import Future, blocks_the_loop
from .._runtime import buffer_of
from ._arrayops import SCALARS, ArrayOps
from ._meta import Shape, broadcast
from ._ops import Op

if TYPE_CHECKING:
    from .._port import Port

__all__ = ["Array", "Tensor", "check_out", "check_writeable", "concrete"]

#: what awaiting a Tensor gives, for type checkers (on a CUDA device: a ``cupy.ndarray``)
Array: TypeAlias = "np.ndarray[Any, Any]"


def check_out(op: Op, shape: Shape, dtype: np.dtype[Any], target: Any) -> None:
    """NumPy's checks on an ``out=`` operand, in NumPy's order: cast by 'same_kind', then broadcast."""
    if op.name == "setitem":
        return
    if not np.can_cast(dtype, target.dtype, "same_kind"):
        ufunc = "power" if op.name == "ipow" else op.name
        raise TypeError(  # NumPy raises UFuncTypeError, a TypeError, with this message
            f"Cannot cast ufunc '{ufunc}' output from {dtype!r} to {target.dtype!r} "
            "with casting rule 'same_kind'"
        )
    if broadcast(shape, target.shape) != target.shape:
        raise ValueError(
            f"non-broadcastable output operand with shape {target.shape} doesn't match "
            f"the broadcast shape {broadcast(shape, target.shape)}"
        )


def check_writeable(what: str, target: Tensor) -> None:
    """Refuse a write to a Tensor over read-only memory at the call, as NumPy refuses it (the task would
    only fail later, at an await)."""
    if getattr(target, "_readonly", False):  # (set only on such Tensors: the others never pay for it)
        raise ValueError(  # NumPy's ValueError, with its words
            f"{what}: assignment destination is read-only: the Tensor (shape {target.shape}, dtype "
            f"{target.dtype}) lives in a NumPy array whose flags.writeable is False; write to a copy "
            "(t = t.copy()), or wrap a writeable array (eng.asarray(a.copy()))"
        )


class Tensor(ArrayOps, Future[Array]):  # type: ignore[misc]  # (iterating gives rows, not asyncio's __iter__)
    """A lazily computed array on an engine device; ``await t`` gives the array.

    ``shape``, ``dtype``, ``nbytes`` and ``device`` are known at once.
    ``t.wait_to_read()`` blocks a thread that is not the event loop's;
    ``repr(t)`` never waits.  For type checkers, its operators and methods
    give Tensors and ``await t`` an ``np.ndarray`` (at run time a
    ``cupy.ndarray`` for a CUDA tensor); NumPy functions on it are typed by
    NumPy's stubs.
    """

    __slots__ = ("__weakref__", "_last_write", "_readonly", "_root", "_unseen", "dtype", "memory", "shape")
    _op_priority = 1
    __hash__ = Task.__hash__  # elementwise __eq__ must not make tasks unhashable

    shape: Shape
    dtype: np.dtype[Any]
    memory: Buffer  # (buffer key, bytes, False): a read of the memory the value lives in
    _root: Tensor | None  # the tensor that owns that memory; None: itself (no reference cycle)
    _last_write: Future[Any] | None  # on the root: the last queued write to its memory
    #: on the root: the writes to its memory an await has not seen yet (those not final, and the first
    #: that failed: the next await raises its error), kept by ``TensorMemory``
    _unseen: list[Task] | None
    #: set (True) only on a Tensor over read-only memory -- a NumPy array whose ``flags.writeable`` is False,
    #: or a view of one -- which refuses writes at the call (``check_writeable``); unset on the others
    _readonly: bool
    #: what queues an op's task and gives its Tensor (``_tracking.queue_op``, which makes Tensors: it sets
    #: this when it is imported, so that this module does not import it back)
    _queue_op: ClassVar[Callable[..., Tensor]]

    @property  # type: ignore[override]  # (None: not an asyncio future at run time)
    def _asyncio_future_blocking(self) -> bool | None:
        """None: not an asyncio future (``asyncio.isfuture`` says), for ``await t`` also waits for the writes
        to its memory queued after it, which ``result()`` does not; asyncio's functions await it in a task."""
        return None

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value: bool | None) -> None:
        pass  # (asyncio sets it only on a future whose value is not None)

    @property
    def owner(self) -> Tensor:
        """The Tensor whose memory this one lives in: itself, or the base of a view."""
        root = self._root
        return self if root is None else root

    # -- running an op -----------------------------------------------------------

    @classmethod
    def _run_op(cls, op: Op, operands: tuple[Any, ...], attrs: dict[str, Any], target: Any) -> Any:
        engine: Port | None = None
        metas: list[Any] = []
        args: list[Any] = []
        for operand in operands:
            value, meta, owner = _operand(operand, op)
            if owner is not None:
                if engine is None:
                    engine = owner
                elif owner is not engine:
                    raise InvalidTask(
                        f"{op.name}(): operands belong to different engines; await one and pass its value"
                    )
            args.append(value)
            metas.append(meta)
        if target is not None and not isinstance(target, Tensor):
            raise TypeError(f"out= must be a Tensor of the same engine, got {type(target).__name__}")
        if target is not None and engine is None:  # np.add(2, 1, out=t): t is the only Tensor
            engine = target._port
        if target is not None and target._port is not engine:
            raise InvalidTask(f"{op.name}(): out= belongs to another engine")
        assert engine is not None
        shape, dtype, view = op.infer(metas, attrs)
        if target is not None:
            check_writeable(f"{op.name}()", target)
            check_out(op, shape, dtype, target)
            kwargs = attrs if op.name == "setitem" else {**attrs, "out": target}
            cls._queue_op(engine, op, args, kwargs, target.shape, target.dtype, target.owner, target)
            return target
        if not view:
            return cls._queue_op(engine, op, args, attrs, shape, dtype, None, None)
        source = args[0]
        if isinstance(source, Tensor):
            result = cls._queue_op(engine, op, args, attrs, shape, dtype, source.owner, None)
            readonly = getattr(source, "_readonly", False)
        else:  # a view of a plain ndarray operand: that array's memory
            result = cls._queue_op(
                engine, op, args, attrs, shape, dtype, None, None, memory=buffer_of(source)
            )
            readonly = not source.flags.writeable
        if readonly:  # a view of read-only memory is read-only, as NumPy's
            result._readonly = True
        return result

    # -- sync points -------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Array]:
        owner = self.owner
        last = owner._last_write
        if last is None:
            return (yield from Future.__await__(self))
        if last.state != "done":  # the writes queued so far: the last, and any before it still running
            for write in self._port.tensors.unfinished(owner):
                yield from write.wait().__await__()
        try:
            value = yield from Future.__await__(self)
        finally:  # its writes are seen now, whatever this await raises (its own error first)
            error = self._port.tensors.seen(owner) if self.state in FINAL_STATES else None
        if error is not None:  # a write to its memory failed since the last await: raised once
            if isinstance(error, StopIteration):  # PEP 479 would make it a bare RuntimeError
                raise stop_through_await(last, error) from error
            raise error
        return value

    def to(self, device: str) -> Tensor:
        """This Tensor on ``device`` (``"cpu"``, ``"cuda:0"``): copied there by a task of its own, on the
        device's copy streams; itself if it is there already.  ``await t.to("cpu")`` gives NumPy."""
        from ._tracking import to

        return to(self._port, self, device)

    def wait_to_read(self, timeout: float | None = None) -> Array:
        """Block this thread until the value (and every queued write to it) is there; return it."""
        owner = self.owner
        last = owner._last_write
        writes = self._unfinished_writes()
        if (self.state not in FINAL_STATES or writes) and self._port.on_loop_thread():
            raise blocks_the_loop(self, "wait_to_read()", "t")
        if last is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            for write in writes:  # the writes queued so far, in order
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if not self._port.wait_blocking(write, left):
                    raise TimeoutError(f"the writes to {self!r} did not finish within {timeout} s")
            if deadline is not None:
                timeout = max(deadline - time.monotonic(), 0.0)
            try:
                value = self.result(timeout)  # its own error first, as await does
            finally:  # its writes are seen now, whatever this raises
                error = self._port.tensors.seen(owner) if self.state in FINAL_STATES else None
            if error is not None:  # a write to its memory failed since the last await: raised once
                raise error
            return value
        return self.result(timeout)

    def asnumpy(self, timeout: float | None = None) -> Array:
        """Same as ``wait_to_read()`` (MXNet's name)."""
        return self.wait_to_read(timeout)

    def _unfinished_writes(self) -> list[Any]:
        """The writes queued to its memory that have not finished."""
        owner = self.owner
        last = owner._last_write
        return self._port.tensors.unfinished(owner) if last is not None and last.state != "done" else []

    def _value_now(self, what: str) -> Any:
        """The value for ``what`` (a conversion): waited for off the event loop; on it, only if it is there
        (its task final, no write to its memory unfinished), else TypeError -- waiting would stall the loop."""
        if self._port.on_loop_thread() and (self.state not in FINAL_STATES or self._unfinished_writes()):
            raise TypeError(
                f"{what} of a Tensor needs its value, and waiting here would block the event loop; "
                f"use 'await t' (then {what} of the array)"
            )
        return self.wait_to_read()

    def __bool__(self) -> bool:
        return bool(self._value_now("bool()"))

    def __float__(self) -> float:
        return float(self._value_now("float()"))

    def __int__(self) -> int:
        return int(self._value_now("int()"))

    def __index__(self) -> int:
        return operator.index(self._value_now("index()"))

    def __complex__(self) -> complex:
        return complex(self._value_now("complex()"))

    def item(self) -> Any:
        return np.asarray(self._value_now("item()")).item()

    def tolist(self) -> Any:
        return np.asarray(self._value_now("tolist()")).tolist()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = np.asarray(self._value_now("np.asarray()"), dtype=dtype)
        return value.copy() if copy else value

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        head = f"Tensor(shape=({dims}{',' if len(self.shape) == 1 else ''}), dtype={self.dtype}, device={self.device!r}"
        last = self.owner._last_write
        settled = last is None or last.state in FINAL_STATES
        if self.state == "done" and settled:
            if not isinstance(self.value, np.ndarray):  # a device array: showing it would wait for the device
                return f"{head}, done)"
            return f"{head},\n       {np.asarray(self.value)!r})"
        if self.state == "failed" and self.error is not None:
            return f"{head}, failed: {type(self.error).__name__})"
        return f"{head}, {self.state if settled else 'writing'})"

    __str__ = __repr__


#: the names other array libraries give what a Tensor does its own way, and the way
_ELSEWHERE = {
    "numpy": "'await t' gives the NumPy array (t.wait_to_read() on a thread that is not the event loop's)",
    "cpu": "t.to('cpu') is the Tensor on the host; 'await t' gives the NumPy array",
    "cuda": "t.to('cuda:0') is the Tensor on that GPU",
    "get": "'await t' gives the array (CuPy's .get(): await t.to('cpu') for NumPy from a GPU)",
    "block_until_ready": "'await t' waits for it (t.wait_to_read() on a thread that is not the event loop's)",
    "detach": "a Tensor has no gradient to detach from; use it as it is",
}


def _no_attribute(name: str, hint: str) -> property:
    """A name Tensor lacks that another library has: AttributeError with the way to do it here
    (``hasattr`` stays False; a property, not ``__getattr__``, so other failed lookups cost nothing more)."""

    def refuse(self: Tensor) -> NoReturn:
        raise AttributeError(f"'Tensor' object has no attribute {name!r}: {hint}")

    return property(refuse)


for _name, _hint in _ELSEWHERE.items():
    setattr(Tensor, _name, _no_attribute(_name, _hint))


def _operand(obj: Any, op: Op) -> tuple[Any, Any, Port | None]:
    """(argument, meta, engine's port) of one operand of a Tensor operation."""
    if isinstance(obj, Tensor):
        return obj, (obj.shape, obj.dtype), obj._port
    if isinstance(obj, np.ndarray):
        return obj, (obj.shape, obj.dtype), None
    if obj is None or isinstance(obj, SCALARS):
        return obj, obj, None
    if isinstance(obj, Future):
        if obj.state == "done" and isinstance(obj.value, np.ndarray):
            return obj.value, (obj.value.shape, obj.value.dtype), obj._port
        raise TypeError(
            f"{op.name}(): {obj!r} is a Future whose shape is not known yet; "
            "await it first, or wrap it with eng.asarray(fut, shape=..., dtype=...)"
        )
    if isinstance(obj, ArrayOps):
        raise TypeError(f"{op.name}(): cannot mix {type(obj).__name__} with engine Tensors")
    array = np.asarray(obj)
    return array, (array.shape, array.dtype), None


def concrete(port: Port, array: Any, device: str, memory: tuple[int, int] | None = None) -> Tensor:
    """A Tensor that is already computed: ``array`` itself (no copy); ``memory``: its (key, nbytes)
    when it is not a NumPy array."""
    t = Tensor(port, None, (), None, device)
    t.out_bytes, t.name = array.nbytes, "asarray"
    t.state, t.value = "done", array
    t.shape, t.dtype = array.shape, array.dtype
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        t._readonly = True
    key, nbytes = buffer_of(array) if memory is None else memory
    t.memory = (key, nbytes, False)
    t._root = None
    t._last_write = t._unseen = None
    return t
