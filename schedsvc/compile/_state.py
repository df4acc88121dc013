"""Compile's state that Tensor operations consult: is this thread tracing a compiled function?

A leaf module (it imports nothing of schedsvc), so ``schedsvc.tensor`` can
read it on every operation without importing the compiler.
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
