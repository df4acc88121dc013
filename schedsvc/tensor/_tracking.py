"""Tensor memory tracking: which Tensor owns which memory, and the last queued write to it.

``await t`` must return what sequential NumPy would hold at that point, so a
Tensor's owner remembers its last queued write (``_last_write``), and every
task reading or writing that memory runs after it (``Task.after``: it only
orders, so a write that fails does not fail the tasks after it -- they see
the memory as the failed write left it).  ``TensorMemory``
(one per engine) maps memory to the Tensor that owns it, for arrays wrapped
by ``eng.asarray``: Tensors over one array share their writes, and
``eng.submit(..., out=array)`` counts as a write of them.  ``queue_op``
builds and queues one Tensor operation's task; the creation functions
(``asarray``, ``create``) are what ``eng.asarray``/``eng.zeros``... call.
"""

from __future__ import annotations

import concurrent.futures
import math
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._core import FINAL_STATES, Buffer, Task
from .._errors import DeviceError, InvalidTask, QueueFull
from .._future import Future
from .._runtime import BUFFER_TYPES, NOW, OVER, QUEUE, buffer_of
from .._tracing import ACTIVE, tracing
from ..devices import to_device
from ._ops import OPS, Op
from ._tensor import Tensor, check_writeable, concrete

if TYPE_CHECKING:
    from .._port import Port

__all__ = ["TensorMemory", "asarray", "create", "order_after", "queue_op", "rider", "shape_arg"]


class TensorMemory:
    """An engine's Tensors by the memory they own, and the writes to it an ``await`` has not seen.

    A write that fails leaves the memory as it was, and the tasks after it run.  Its error is
    raised by the next ``await`` (or ``wait_to_read``) of a Tensor over that memory -- once: the
    ``await`` after that gives the memory as it is, as NumPy's array is after the line that raised.
    """

    def __init__(self) -> None:
        # memory key -> the Tensor that owns it, for arrays wrapped by asarray
        self.owners: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
        # (each owner's writes an await has not seen are its ``_unseen``)
        self._lock = threading.Lock()  # the door (a thread, under the runtime's lock) and awaits

    def adopt(self, tensor: Tensor, writer: Task | None = None) -> None:
        """``tensor`` wraps an array: it owns that memory, or shares the owner already there.  ``writer``:
        a task queued before it to write that memory, still unfinished -- awaiting the Tensor waits for it
        (its error is its own future's: the Tensor did not exist when it was queued)."""
        owner = self.owners.get(tensor.memory[0])
        if owner is None:
            self.owners[tensor.memory[0]] = tensor
            if writer is not None:
                tensor._last_write = cast("Future[Any]", writer)
        else:  # another Tensor over the same memory: they share one owner, so writes are seen by both
            tensor._root = owner

    def ordered(
        self, deps: tuple[Task, ...], buffers: tuple[Buffer, ...], kwargs: dict[str, Any], writes: Any
    ) -> tuple[tuple[Task, ...], list[Tensor]]:
        """The pending writes of the Tensors a submitted task reads or writes (it runs after them:
        ``Task.after``); and the Tensors it writes (the door ``claim``s them once it is admitted)."""
        after: tuple[Task, ...] = ()
        for dep in deps:
            if type(dep) is Tensor and dep.owner._last_write is not None:
                after = with_pending_writes(after, deps)
                break
        for buffer in buffers:
            if buffer[2]:  # a write: `await t` of a Tensor over this memory must wait for this task
                written = _tensors_in((kwargs.get("out"), writes))
                for target in written:
                    check_writeable("a task's out=/writes=", target)
                written += [o for b in buffers if b[2] and (o := self.owners.get(b[0])) is not None]
                return with_pending_writes(after, written), written
        return after, []

    def claim(self, task: Task, written: list[Tensor]) -> None:
        """``task`` is now the last write of ``written`` (the runtime's door calls this once it is
        admitted or queued for admission)."""
        write = cast("Future[Any]", task)  # (every task the door takes is a Future)
        with self._lock:
            for target in written:
                owner = target.owner
                previous = owner._last_write
                # a write that failed at once (an input had failed) is not the one to wait for while the
                # write before it still runs: an await waits for that, then raises this one's error
                if write.state not in FINAL_STATES or previous is None or previous.state in FINAL_STATES:
                    owner._last_write = write
                unseen = owner._unseen
                if unseen is None:
                    owner._unseen = [write]
                    continue
                unseen.append(write)
                n = len(unseen)
                if n >= 16 and n & (n - 1) == 0:  # at each power of two: amortised O(1) per write
                    owner._unseen = _unsettled(unseen)

    def unfinished(self, owner: Tensor) -> list[Future[Any]]:
        """The writes to ``owner``'s memory queued so far that have not finished, oldest first: what an
        await of it waits for (a snapshot: writes queued later are not waited for).  Writes to one
        memory finish in order, except one that ends without running (failed or cancelled through an
        input) while those queued before it still run: so an await waits for these too, not only for
        the last write."""
        with self._lock:
            writes = [w for w in owner._unseen or () if w.state not in FINAL_STATES]
        last = owner._last_write
        if last is not None and last.state not in FINAL_STATES and not any(w is last for w in writes):
            writes.append(last)  # (seen by an await meanwhile, before it was queued)
        return cast("list[Future[Any]]", writes)  # (every task the door takes is a Future)

    def seen(self, owner: Tensor) -> BaseException | None:
        """An await of ``owner``'s memory has waited for its writes: the error of the first of them
        that failed since the last await, if any (reported once)."""
        with self._lock:
            unseen, owner._unseen = owner._unseen, None
        for write in unseen or ():
            if write.state == "failed":
                return write.error
        return None


def order_after(
    port: Port, deps: tuple[Task, ...], buffers: tuple[Buffer, ...], kwargs: dict[str, Any], writes: Any
) -> tuple[tuple[Task, ...], list[Tensor]]:
    """A new task's ordering against Tensors: its dependencies checked to be ``port``'s engine's, then
    the pending writes of the Tensors it reads or writes (it runs after them: ``Task.after``) and the
    Tensors it writes (the runtime's door claims them once it is admitted)."""
    tensors = False  # hot path: plain loops, no generator per submission
    for dep in deps:
        if getattr(dep, "_port", None) is not port:
            raise InvalidTask(f"{dep!r} belongs to another engine; await it and pass its value")
        if type(dep) is Tensor:
            tensors = True
    if tensors:
        return port.tensors.ordered(deps, buffers, kwargs, writes)
    for buffer in buffers:
        if buffer[2]:  # a write: `await t` of a Tensor over this memory must wait for this task
            return port.tensors.ordered(deps, buffers, kwargs, writes)
    return (), []


def _unsettled(writes: list[Task]) -> list[Task]:
    """The writes an await must still look at: those not final, and the first that failed."""
    kept = []
    failed = False
    for write in writes:
        state = write.state
        if state == "failed" and not failed:
            failed = True
            kept.append(write)
        elif state not in FINAL_STATES:
            kept.append(write)
    return kept


def asarray(port: Port, obj: Any, dtype: Any, device: str | None, shape: Any) -> Tensor:
    """``eng.asarray``: an ndarray is used as it is, not copied; a Future needs ``shape``/``dtype``
    unless it is done.  Without ``device`` a Tensor stays where its value lives; with one, it is
    moved there (as ``t.to(device)``)."""
    asked = device
    device = port.device(device)
    port.local("eng.asarray")
    if isinstance(obj, concurrent.futures.Future):
        obj = _engine_future(port, obj)
    if isinstance(obj, Tensor):
        tensor = obj if asked is None else to(port, obj, device)  # (itself if it is there)
        return tensor if dtype is None or np.dtype(dtype) == tensor.dtype else tensor.astype(dtype)
    if isinstance(obj, Future):
        return _future_tensor(port, obj, dtype, shape, asked)
    port.running()
    keyer = BUFFER_TYPES.get(type(obj))
    if keyer is not None:  # a device array (CuPy's, the simulator's): used as it is, on its device
        if dtype is not None and np.dtype(dtype) != obj.dtype:
            raise TypeError(
                f"eng.asarray: a device array of dtype {obj.dtype} cannot become {np.dtype(dtype)} here; use t.astype()"
            )
        tensor = _device_tensor(port, obj, _home(port, obj), keyer(obj))
        return tensor if asked is None else to(port, tensor, device)
    if type(obj) is np.ndarray and dtype is not None and np.dtype(dtype) != obj.dtype:
        # converted by a task, after the writes queued to the array (np.asarray would copy it now)
        converted: Tensor = asarray(port, obj, None, asked, shape).astype(dtype)
        return converted
    array = np.asarray(obj, dtype=dtype)
    if device in port.memory_devices:  # a device with memory of its own: copied there by a task of its own
        if shape is not None and tuple(shape) != array.shape:
            raise ValueError(f"asarray(shape={tuple(shape)}) does not match the array's shape {array.shape}")
        return queue_op(port, TO_DEVICE, [array], None, array.shape, array.dtype, None, None, device=device)
    if shape is not None and tuple(shape) != array.shape:
        raise ValueError(f"asarray(shape={tuple(shape)}) does not match the array's shape {array.shape}")
    tensor = concrete(port, array, device)
    port.tensors.adopt(tensor, port.writer_of(tensor.memory[0]))
    return tensor


def _home(port: Port, array: Any) -> str:
    """The engine's device whose memory holds ``array`` (a device array)."""
    port.running()
    name = port.holder(array)
    if name is not None:
        return name
    raise DeviceError(
        f"eng.asarray: the {type(array).__module__}.{type(array).__name__} lives on a device this engine "
        f"does not have (its devices: {port.config.devices}); add that device to Config(devices=...), "
        "or copy the array to the host first"
    )


def _engine_future(port: Port, fut: concurrent.futures.Future[Any]) -> Any:
    """A ``concurrent.futures.Future`` as ``eng.asarray`` takes it: the engine's own task for one from
    ``eng.executor()``, the value of another that is done."""
    task = getattr(fut, "_task", None)
    if isinstance(task, Future) and task._port is port:
        return task
    if fut.done():
        return fut.result()
    raise TypeError(
        f"eng.asarray: {fut!r} is not from this engine's executor and has not finished; "
        "wait for its result and pass that, or submit the work with eng.executor().submit(...)"
    )


def _device_tensor(port: Port, array: Any, device: str, memory: tuple[int, int]) -> Tensor:
    """A done Tensor over a device array (no copy)."""
    tensor = concrete(port, array, device, memory)
    port.tensors.adopt(tensor)
    return tensor


def to(port: Port, tensor: Tensor, device: str) -> Tensor:
    """``t.to(device)``: ``t`` copied to ``device`` by a task of its own (``t`` itself if it is there)."""
    device = port.device(device)
    if device == tensor.device:
        return tensor
    if not port.started:
        raise port.refusal()
    if device in port.memory_devices:  # host -> device, or device -> device: the H2D copy task
        op = TO_DEVICE
    else:  # device -> host: the D2H copy, run on the host's side
        to_host = port.to_host(tensor.device)
        op = TO_DEVICE if to_host is None else Op("to_host", to_host, TO_DEVICE.infer)
    return queue_op(port, op, [tensor], None, tensor.shape, tensor.dtype, None, None, device=device)


def create(port: Port, name: str, device: str | None, **attrs: Any) -> Tensor:
    """``eng.zeros`` and friends: a Tensor made by a task (or, inside a compiled function, a node)."""
    op = OPS[name]
    if ACTIVE[0] and tracing.depth:  # inside a compiled function: a node of its graph
        return tracing.trace.record(op, (), attrs, None)  # type: ignore[no-any-return]
    port.local(f"eng.{name}")
    shape, dtype, _ = op.infer((), attrs)
    return queue_op(port, op, [], attrs, shape, dtype, None, None, device=port.device(device))


def _future_tensor(port: Port, fut: Future[Any], dtype: Any, shape: Any, asked: str | None) -> Tensor:
    if fut.state == "done" and shape is None:
        return asarray(port, fut.value, dtype, asked, None)
    if shape is None or dtype is None:
        raise TypeError(
            f"{fut!r} has not finished, so its shape and dtype are not known yet; "
            "await it first, or pass shape= and dtype= to eng.asarray"
        )
    port.running()
    memory = port.memory_devices
    if asked is not None:
        device = port.device(asked)
    else:  # where its value will live: a device of memory of its own keeps its results there
        device = fut.device if fut.device in memory else port.default_device
    # on the host, a device array as the value is refused: the Tensor would be labelled with the wrong device
    attrs = {"shape": shape_arg(shape), "dtype": np.dtype(dtype), "host": device not in memory}
    return queue_op(port, _CHECKED, [fut], attrs, attrs["shape"], attrs["dtype"], None, None, device=device)


def queue_op(
    port: Port,
    op: Op,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    root: Tensor | None,
    target: Tensor | None,
    memory: tuple[int, int] | None = None,
    device: str | None = None,
    out_bytes: int | None = None,
    replay: Any = None,
    limits: bool = False,
    waiting: list[Any] | None = None,
    riders: Callable[[Tensor], list[Task]] | None = None,
) -> Tensor:
    """Queue one Tensor operation; it is admitted over the limits (operators cannot wait).

    ``root``: the Tensor whose memory the result lives in (a view); ``target``:
    the Tensor it writes (in place, ``out=``); ``memory``: the (key, nbytes)
    of an array the result is a view of.  ``replay``: the ``Compiled`` this
    task replays, counted under the lock.  ``limits``: admit it only within
    the limits (not nested), else raise QueueFull -- or, given ``waiting``,
    queue it for admission (FIFO) and append the token to await there.
    ``riders``: makes, from the task, the tasks that read its result (``rider``),
    admitted right after it on its slot of the limits.
    """
    tid = get_ident()
    args = tuple(args)
    deps: list[Task] = []
    after: list[Task] = []  # pending writes to the memory it reads or writes: it runs after them
    plain = True  # are the deps exactly the operands, in order? (then they share one tuple)
    buffers: list[Buffer] = []
    for arg in args:  # hot path: one pass, no helper calls for the common operand
        if type(arg) is Tensor:
            deps.append(arg)
            if device is None:
                device = arg.device
            buffers.append(arg.memory)  # (key, nbytes, False): a read of its memory
            owner = arg._root
            last = (arg if owner is None else owner)._last_write
            if last is not None and last is not arg and last.state != "done":
                after.append(last)
            continue
        plain = False
        if isinstance(arg, Task):
            deps.append(arg)
            if device is None:
                device = arg.device
            held = arg.memory
            if held is not None:
                buffers.append(held)
                pending = pending_write(arg)
                if pending is not None:
                    after.append(pending)
        elif isinstance(arg, np.ndarray):
            key, nb = buffer_of(arg)
            buffers.append((key, nb, False))
    if target is not None:
        plain = False
        deps.append(target)
        buffers.append((target.memory[0], target.memory[1], True))
        previous = pending_write(target)
        if previous is not None:
            after.append(previous)
    if len(buffers) > 1:
        buffers = _merge(buffers)
    if out_bytes is None:
        fresh = root is None and target is None and memory is None
        out_bytes = math.prod(shape) * dtype.itemsize if fresh else 0
    task = Tensor(
        port,
        op.fn,
        args,
        kwargs or None,
        device or port.default_device,
        tuple(buffers),
        args if plain else tuple(deps),
    )
    task.out_bytes, task.name = out_bytes, op.name
    task.shape, task.dtype, task._last_write, task._unseen = shape, dtype, None, None
    if after:
        task.after = tuple(after)
    if target is not None:  # a write: the owner points at it (_last_write), not back
        task.memory, task._root = target.memory, None
    elif root is not None:
        task.memory, task._root = root.memory, root
    else:
        task.memory = (id(task), out_bytes, False) if memory is None else (memory[0], memory[1], False)
        task._root = None
    counted = None if replay is None else replay.count_replay
    how = OVER if not limits else NOW if waiting is None else QUEUE
    claims = None if target is None else [target]
    if riders is None:
        admitted = port.admit(task, tid, how, claims, counted)
    else:
        admitted = port.admit(task, tid, how, claims, counted, None, riders(task))
    if admitted is True:
        return task
    if how == NOW:
        raise QueueFull(port.full_message(task, "await compiled.submit(...)"))
    waiting.append(admitted)  # type: ignore[union-attr]
    return task


Tensor._queue_op = queue_op


def rider(
    op: Op,
    source: Tensor,
    attrs: dict[str, Any],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    root: Tensor | None,
    memory: tuple[int, int] | None,
) -> Tensor:
    """A Tensor task of ``op`` on ``source``'s result alone, made before ``source`` is admitted, to be
    admitted right after it as its rider (``queue_op``'s ``riders``): one of the outputs picked from a
    call's result.  It allocates nothing (``out_bytes`` 0): its result is part of ``source``'s.  ``root``,
    ``memory``: as ``queue_op``'s."""
    args = (source,)
    read = (source.memory[0], 0, False)  # (its bytes are counted as ``source``'s result, not again here)
    task = Tensor(source._port, op.fn, args, attrs, source.device, (read,), args)
    task.out_bytes, task.name = 0, op.name
    task.shape, task.dtype, task._last_write, task._unseen = shape, dtype, None, None
    if root is not None:
        task.memory, task._root = root.memory, root
    else:
        nbytes = math.prod(shape) * dtype.itemsize if memory is None else memory[1]
        task.memory = (id(task) if memory is None else memory[0], nbytes, False)
        task._root = None
    return task


def pending_write(tensor: Any) -> Task | None:
    """The last queued write to a Tensor's memory, unless it finished (a failed one counts)."""
    last = tensor.owner._last_write if type(tensor) is Tensor else None
    return last if last is not None and last.state != "done" and last is not tensor else None


def with_pending_writes(deps: tuple[Task, ...], tensors: Sequence[Any]) -> tuple[Task, ...]:
    """``deps`` plus the pending last write of each of ``tensors``."""
    extra = [w for t in tensors if (w := pending_write(t)) is not None]
    return (*deps, *extra)


def _merge(buffers: list[Buffer]) -> list[Buffer]:
    """One entry per buffer, a write if any use writes (a read and a write of one buffer is a write)."""
    merged: dict[int, Buffer] = {}
    for buffer in buffers:
        seen = merged.get(buffer[0])
        if seen is None or (buffer[2] and not seen[2]):
            merged[buffer[0]] = buffer
    return list(merged.values())


def _tensors_in(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors_in(item)]
    return []


def shape_arg(shape: Any) -> tuple[int, ...]:
    """A shape given by a user as NumPy takes it (an int or a sequence of them), as a tuple of ints."""
    dims = (
        (operator.index(shape),)
        if isinstance(shape, int | np.integer)
        else tuple(operator.index(d) for d in shape)
    )
    for d in dims:
        if d < 0:
            raise ValueError("negative dimensions are not allowed")  # (NumPy's words)
    return dims


def _checked(value: Any, shape: tuple[int, ...], dtype: np.dtype[Any], host: bool = False) -> Any:
    """The value of a Future made a Tensor: it must have the shape and dtype declared for it (and, for a
    Tensor on the host, be in host memory)."""
    on_device = type(value) in BUFFER_TYPES
    if host and on_device:
        raise TypeError(
            f"eng.asarray(future, shape={shape}, dtype={dtype}) on the host: the future's value is a device "
            f"array ({type(value).__module__}.{type(value).__name__}); ask for the Tensor on the device the "
            "array lives on (device=...), or have the task return host memory"
        )
    array = value if on_device else np.asarray(value)  # a device array stays there
    if array.shape != shape or array.dtype != dtype:
        raise TypeError(
            f"eng.asarray(future, shape={shape}, dtype={dtype}): the future's value has "
            f"shape {array.shape} and dtype {array.dtype}"
        )
    return array


_CHECKED = Op("asarray", _checked, lambda metas, attrs: (attrs["shape"], attrs["dtype"], False))
#: a copy onto a device (``eng.asarray(a, device=...)``, ``t.to(device)``), launched on its H2D stream
TO_DEVICE = Op("to_device", to_device, lambda metas, attrs: (metas[0][0], metas[0][1], False))
