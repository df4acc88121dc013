"""What a task becomes on the cluster, and how its outcome comes back.

A task goes out as ``client.submit(run, fn, args, kwargs)``: ``to_dask``
replaces each parent task among its arguments by the parent's Dask future
(or its value, if it lives here), so Dask moves intermediate values between
workers.  ``run`` is ``apply`` on the worker, or ``apply_writing`` for a task
with ``out=`` a NumPy array of this process: the worker writes into its copy
and sends it back with the result, error or not, and ``write_back`` copies it
into the array here -- even if the task then raised, as NumPy leaves a
partial write in place.  A task that cannot be pickled fails with an error
naming the part that cannot (``diagnosed``); a task that raised on its worker
fails with its own exception (``remote_error``).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from .._core import Task
from .._errors import InvalidTask, SchedsvcError
from .._runtime import Remote
from ._dask_cluster import DaskFuture

__all__ = ["apply", "apply_writing", "diagnosed", "remote_error", "to_dask", "write_back"]


def to_dask(obj: Any, sent: dict[Task, DaskFuture]) -> Any:
    """``obj`` with each Task replaced by its Dask future (or its value, if it lives here)."""
    if isinstance(obj, Task):
        dfut = sent.get(obj)
        if dfut is not None:
            return dfut
        value = obj.value
        return value.handle if isinstance(value, Remote) else value
    kind = type(obj)
    if kind is tuple or kind is list:
        return kind(to_dask(x, sent) for x in obj)
    if kind is dict:
        return {k: to_dask(v, sent) for k, v in obj.items()}
    if isinstance(obj, tuple):  # a namedtuple
        items = [to_dask(x, sent) for x in obj]
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    if isinstance(obj, list | dict):  # a subclass: a shallow copy keeps its class and state
        new = copy.copy(obj)
        if isinstance(obj, list):
            new[:] = [to_dask(x, sent) for x in obj]
        else:
            for key, value in obj.items():
                new[key] = to_dask(value, sent)
        return new
    return obj


def apply(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run on a worker: the task itself (options of ``client.submit`` never reach ``fn``)."""
    return fn(*args, **kwargs)


def apply_writing(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, np.ndarray, BaseException | None, bool]:
    """Run on a worker: the task, then what it wrote into its copy of ``out``, error or not.

    The last item says whether ``fn`` returned ``out`` itself (as ufuncs do):
    identity does not survive the trip back, so it is sent as a flag.
    """
    out = kwargs["out"]
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:  # the partial write must still reach the frontend's array
        return None, out, exc, False
    returned_out = value is out
    return (None if returned_out else value), out, None, returned_out


def write_back(
    out: np.ndarray, result: tuple[Any, np.ndarray, BaseException | None, bool]
) -> tuple[Any, Any]:
    """Copy the worker's ``out`` into the frontend's array; the task's (value, error)."""
    value, written, error, returned_out = result
    np.copyto(out, written)
    return (out if returned_out else value), error


def remote_error(dfut: DaskFuture) -> BaseException:
    """The exception a task raised on its worker, with the worker's traceback."""
    error = dfut._state.exception
    traceback = dfut._state.traceback
    if isinstance(error, BaseException):
        return error.with_traceback(traceback) if traceback is not None else error
    return SchedsvcError(f"the Dask task {dfut.key!r} failed: {error!r}")


def diagnosed(exc: BaseException, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException:
    """A send failure as the task's error: for a serialisation failure, which part cannot be pickled."""
    if not isinstance(exc, TypeError | pickle.PicklingError) and "serializ" not in str(exc):
        return exc  # a closed client, a cancelled send: nothing to pickle again (large arrays take long)
    try:
        return _unsendable(task, args, kwargs) or exc
    except Exception:  # the diagnosis must not lose the task's outcome
        return exc


def _unsendable(task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InvalidTask | None:
    """Which part of a task that failed to send cannot be pickled, as an error that says what to do.

    Only on that error path: each part is pickled alone, as Dask would.
    """
    import cloudpickle  # Dask's own serializer for code and objects (a dependency of distributed)

    parts = [("its function", task.fn)]
    parts += [(f"argument {i}", arg) for i, arg in enumerate(args)]
    parts += [(f"keyword argument {name!r}", arg) for name, arg in kwargs.items()]
    for what, obj in parts:
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:
            error = InvalidTask(
                f"task {task.label!r} (#{task.seq}): {what}, a {type(obj).__name__}, cannot be sent to the Dask "
                f"workers ({exc}). Pass picklable data (arrays, numbers, strings, ...) or create the object "
                "inside the task, or use backend='threads' to run tasks in this process"
            )
            error.__cause__ = exc
            return error
    return None
