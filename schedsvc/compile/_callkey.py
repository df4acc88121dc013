"""The batch key of a call of a batched function: which arguments are its rows (their shapes but the batch
axis, their dtypes, whether they live in a device's memory), which are arrays shared by the batch (by
identity), and which are other values (static: part of the key, as the signature cache keys them)."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import numpy as np

from .._errors import BatchError, DependencyError
from .._future import Future
from .._runtime import BUFFER_TYPES
from ..tensor import Tensor
from ._compiled import static_part

__all__ = ["parse_call"]


def parse_call(
    owner: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    statics: dict[Any, Any],
    slots: Container[Any] | None,
    batch_axis: int,
    memory_devices: Container[str],
) -> tuple[Any, list[Any], int]:
    """(key, batched values then unbatched arrays, rows along the batch axis) of one call of ``owner`` (a
    batched function, as its messages name it), whose batched arguments are ``slots`` (None: every array);
    its other arguments go into ``statics``.  An argument in ``memory_devices``' memory keys a device batch."""
    key: list[Any] = []
    batched: list[Any] = []
    shared: list[Any] = []
    rows = -1
    for slot, value in (*enumerate(args), *sorted(kwargs.items())):
        if isinstance(value, Future) and not isinstance(value, Tensor):
            if value.state != "done":
                raise DependencyError(f"{value!r}, an argument of {owner!r}, did not finish") from (
                    value.error
                )
            value = value.value
        if isinstance(value, list | tuple) and slots is not None and slot in slots:
            value = np.asarray(value)
        device_array = type(value) in BUFFER_TYPES
        array = device_array or isinstance(value, np.ndarray | Tensor)
        if array and (slots is None or slot in slots):
            shape, axis = value.shape, batch_axis
            ndim = len(shape)
            if not -ndim <= axis < ndim:
                raise BatchError(
                    f"{owner!r}: argument {slot!r} has shape {shape}, which has no batch axis {axis}"
                )
            axis %= ndim
            n = shape[axis]
            if rows not in (-1, n):
                raise BatchError(
                    f"{owner!r}: the batched arguments of one call disagree on their rows along axis "
                    f"{axis} ({rows} and {n})"
                )
            rows = n
            part: tuple[Any, ...] = (slot, "rows", shape[:axis] + shape[axis + 1 :], value.dtype)
            if device_array or (isinstance(value, Tensor) and value.device in memory_devices):
                part = (*part, "device")  # rows in a device's memory: its callers get device rows
            key.append(part)
            batched.append(value)
        elif array:
            key.append((slot, "shared", id(value), value.shape, value.dtype))  # (see Group.run)
            shared.append(value)
        else:
            key.append((slot, "static", static_part(value)))
            statics[slot] = value
    if rows < 0:
        raise BatchError(
            f"{owner!r} was called without a batched array argument (batch_axis={batch_axis}); pass "
            "the rows as an array, or name the batched arguments with batched="
        )
    if rows == 0:
        raise BatchError(f"{owner!r}: a call with no rows along batch axis {batch_axis}")
    return tuple(key), [*batched, *shared], rows
