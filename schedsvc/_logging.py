"""The ``schedsvc`` loggers: their names, and warnings that come in floods.

schedsvc logs with the standard library's ``logging`` under public names, never its private modules'
(``_engine``), and adds no handler: the application decides what is shown and where
(``logging.basicConfig``, uvicorn's ``log_config``); until it configures logging, Python's last resort
prints warnings and errors to stderr, as for any library.  No record is written per task:
only at rare events.  A warning that can come once per request in a flood (a 503 each) is ``Throttled``:
the first is logged at once, the others counted into the next record, at most one a minute.

This module imports nothing of schedsvc, so every layer above the core may use it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

__all__ = [
    "COMPILE",
    "DEVICES_CUDA",
    "DEVICES_DASK",
    "ENGINE",
    "ROOT",
    "SERVING",
    "Throttled",
    "settings",
    "tally",
]

ROOT = "schedsvc"
#: an engine started (its settings) and closed (its tally), INFO; an error nobody could be told, ERROR
ENGINE = "schedsvc.engine"
#: requests answered 503 (the engine at its limits, or closing), WARNING
SERVING = "schedsvc.serving"
#: compiled and batched functions: batches split after a failure, CUDA-graph capture off, WARNING
COMPILE = "schedsvc.compile"
#: CUDA devices: out of device memory at a launch, WARNING
DEVICES_CUDA = "schedsvc.devices.cuda"
#: Dask devices: a task's outcome the cluster could not give (the scheduler lost, a value not fetched), WARNING
DEVICES_DASK = "schedsvc.devices.dask"

#: the fewest seconds between two records of one ``Throttled`` warning
INTERVAL_S = 60.0


class Throttled:
    """A warning that may come in a flood, logged at most once per ``INTERVAL_S``: the first at once,
    the ones after it counted, and the count said by the next one logged."""

    __slots__ = ("_held", "_last", "_lock", "logger")

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._lock = threading.Lock()
        self._held = 0  # warnings not logged since the last one that was
        self._last = -math.inf  # when the last one was logged (time.monotonic)

    def warning(self, msg: str, *args: Any) -> None:
        """Log ``msg % args`` at WARNING, unless one was logged less than ``INTERVAL_S`` ago: count it."""
        with self._lock:
            now = time.monotonic()
            since = now - self._last
            if since < INTERVAL_S:
                self._held += 1
                return
            held, self._held, self._last = self._held, 0, now
        if held:
            msg += " (and %d more like it in the %.0f s since the last one logged)"
            args = (*args, held, since)
        self.logger.warning(msg, *args, stacklevel=2)  # (the record names its caller's line)


#: the settings an engine's start record always shows; the others when they are not their defaults
_SHOWN = ("devices", "cpu_workers", "max_pending", "max_pending_bytes", "backend")


def settings(config: Any) -> str:
    """The settings in force, ``name=value`` each: the main ones, and every other one not left at its
    default."""
    shown = list(_SHOWN)
    shown += [n for n, source in config.sources().items() if source != "default" and n not in shown]
    return " ".join(f"{name}={_shown(getattr(config, name))}" for name in shown)


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if hasattr(value, "human_readable"):  # a ByteSize
        return f"{int(value)}({value.human_readable()})"
    return str(value)


def tally(stats: Any) -> str:
    """What an engine did, from its ``stats()``."""
    text = (
        f"{stats.submitted} tasks submitted, {stats.completed} completed, {stats.failed} failed, "
        f"{stats.cancelled} cancelled; peak pending bytes {stats.peak_pending_bytes}"
    )
    if stats.batches:
        batches = "1 batch" if stats.batches == 1 else f"{stats.batches} batches"
        text += f"; {batches} of {stats.batch_rows} rows"
    return text
