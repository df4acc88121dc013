"""A submission's task description: the checks ``eng.submit`` makes at the call, and the task they build.

``build_task`` is the one builder behind ``submit``, ``submit_nowait`` and the
``concurrent.futures`` view: it refuses what must never run (a submission
while tracing, an async function, a bad option), scans the arguments for
dependencies and memory, orders the task after the pending writes of the
Tensors it touches, and builds the Future, which the caller hands to the
runtime's door (``Port.admit``), which refuses it if the engine takes no work.  It runs once per submission: plain loops, no helper calls
on the common path.
"""

from __future__ import annotations

from types import FunctionType
from typing import TYPE_CHECKING, Any

from ._errors import InvalidTask
from ._future import Future
from ._runtime import scan
from ._tracing import ACTIVE, tracing
from ._validate import ASYNC_CODE, SYNC_KINDS, async_fn, check_fn, submit_while_tracing
from .tensor import Tensor, order_after

if TYPE_CHECKING:
    from ._port import Port

__all__ = ["NO_WRITES", "PLAIN", "Options", "build_task", "plain_options"]

#: ``writes=``'s default: the empty tuple (one object in CPython), so ``writes is NO_WRITES`` says none given
NO_WRITES: tuple[()] = ()

#: a submission's options, as ``eng.submit`` takes them: ``(device, priority, name, reads, writes,
#: nbytes)`` -- one tuple, made at the call (cheaper than six arguments, or keywords, on every call)
Options = tuple[str | None, int, str | None, Any, Any, int | None]


#: the options of a submission that gives none (``build_task`` tells it by identity: the hot path)
PLAIN: Options = (None, 0, None, NO_WRITES, NO_WRITES, None)


def plain_options(device: str | None, priority: int) -> Options:
    """The options of a submission that names no reads, writes, nbytes or name (the executor view's)."""
    return PLAIN if device is None and not priority else (device, priority, None, NO_WRITES, NO_WRITES, None)


def build_task(
    port: Port,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    tid: int,
    options: Options,
) -> tuple[Future[Any], list[Tensor]]:
    """Check a submission and build its task (not admitted yet); and the Tensors it writes (claimed by
    the door when it is admitted).  ``tid``: the submitting thread; ``options``: ``eng.submit``'s."""
    if ACTIVE[0] and tracing.depth:
        raise submit_while_tracing(fn)
    kind = type(fn)
    if kind is FunctionType:  # hot path: a plain function may still be an async one
        if fn.__code__.co_flags & ASYNC_CODE:
            raise async_fn(fn)
    elif kind not in SYNC_KINDS:  # builtins, ufuncs and NumPy functions need no check
        check_fn(fn)
    if options is PLAIN:  # hot path: no option to check
        device, reads, writes = port.default_device, NO_WRITES, NO_WRITES
    else:
        device, reads, writes = _checked(port, options)
    vet = port.vet
    if vet:  # (no iterator made per submission when no executor checks tasks)
        for executor in vet:
            if executor.name == device:
                executor.check_task(fn, kwargs, writes)
    deps, buffers = scan(args, kwargs, reads, writes)
    # nothing to order after without Tensors and writes (an out= keyword, or writes=): the common case,
    # dependencies that are all this engine's Futures, is told here without a call
    unordered = not kwargs and writes is NO_WRITES
    if unordered:
        for dep in deps:
            if type(dep) is not Future or dep._port is not port:
                unordered = False
                break
    after, written = ((), []) if unordered else order_after(port, deps, buffers, kwargs, writes)
    task: Future[Any] = Future(port, fn, args, kwargs or None, device, buffers, deps)
    if options is not PLAIN:  # the fields few submissions have are stored only when given
        _, priority, name, _, _, nbytes = options
        if priority:
            task.priority = priority
        if nbytes:
            task.out_bytes = nbytes
        if name is not None:
            task.name = name
    if after:
        task.after = after
    return task, written


def _checked(port: Port, options: Options) -> tuple[str, Any, Any]:
    """A submission's options checked: its device (resolved), reads and writes."""
    device, priority, _, reads, writes, nbytes = options
    if type(priority) is not int:
        raise InvalidTask(f"priority must be an int, got {priority!r}")
    if nbytes is not None and (type(nbytes) is not int or nbytes < 0):
        raise InvalidTask(f"nbytes must be a non-negative int (bytes the result will hold), got {nbytes!r}")
    return (port.default_device if device is None else port.device(device)), reads, writes
