"""``Remote``: a task value that lives on another machine until someone asks for it.

A device that runs tasks elsewhere (``schedsvc.devices.dask``) makes a
finished task's value a ``Remote``: dependents receive the handle (so data
stays where it is), and the value itself is fetched only when a ``Future`` is
awaited or ``result()`` is called, then kept.  This module imports nothing
from the device, so the frontend can recognise a ``Remote`` without Dask.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Remote"]


class Remote:
    """A handle to a value held by a remote device; ``fetch`` brings it to this process once."""

    __slots__ = ("_fetched", "_value", "handle")

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._fetched = False
        self._value: Any = None

    async def get(self) -> Any:
        """The value, fetched on the first call (on the engine's event loop)."""
        if not self._fetched:
            value = await self._fetch()
            self._value, self._fetched = value, True
        return self._value

    def get_blocking(self, timeout: float | None) -> Any:
        """The value, from a thread that is not the event loop's."""
        if not self._fetched:
            value = self._fetch_blocking(timeout)
            self._value, self._fetched = value, True
        return self._value

    async def _fetch(self) -> Any:
        raise NotImplementedError

    def _fetch_blocking(self, timeout: float | None) -> Any:
        raise NotImplementedError
