"""Is this thread tracing a compiled function?  The flag Tensor operations consult on every call.

A leaf module (it imports nothing of schedsvc), so that ``schedsvc.tensor``,
the engine and ``schedsvc.compile`` can all read it without importing one
another: compile sets it while it traces, the others check it.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ACTIVE", "tracing"]


class _Tracing(threading.local):
    """The trace recording on this thread (``schedsvc.compile``), if any."""

    depth = 0
    trace: Any = None


tracing = _Tracing()
#: traces running on any thread: checked first, so that no trace costs one list read
ACTIVE = [0]
