"""CUDA devices through CuPy.  CuPy is imported here and nowhere else.

This release checks availability and says how to get it; the stream workers
(compute and copy streams, CUDA events between them) are not built yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import DeviceError
from ._executor import Executor

if TYPE_CHECKING:
    from .._config import Config
    from .._runtime import Runtime

__all__ = ["CudaExecutor", "check"]


def check(index: int) -> None:
    """Raise DeviceError unless CuPy is installed and device ``index`` exists."""
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError(
            f"cuda:{index} is unavailable: CuPy is not installed; "
            "pip install 'schedsvc[cuda12]' (or [cuda13]) on a machine with an NVIDIA GPU"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        raise DeviceError(f"cuda:{index} is unavailable: CUDA reports {exc}") from exc
    if index >= count:
        raise DeviceError(f"cuda:{index} does not exist: this machine has {count} CUDA device(s)")


class CudaExecutor(Executor):
    """CUDA streams of one device (not built yet: opening one says so)."""

    kind = "cuda"
    asynchronous = True
    own_memory = True

    @classmethod
    def check_device(cls, name: str) -> None:
        """CuPy installed and device N of ``cuda:N`` present."""
        check(int(name.partition(":")[2]))

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> Executor:
        raise DeviceError(
            f"{name} is present, but this schedsvc release has no CUDA stream workers yet; "
            "run on 'cpu' for now"
        )
