"""Run cells in an IPython shell as a notebook would, in a process of their own (``test_notebook.py``).

    python tests/_notebook_session.py terminal|kernel CELLS_JSON

``terminal``: as the ``ipython`` command does, each cell through ``shell.run_cell``, whose top-level
``await`` runs on IPython's own asyncio runner (``run_until_complete`` on one loop that is never closed,
and that stands still between cells).  ``kernel``: as ipykernel does, every cell through
``await shell.run_cell_async(...)`` on one running loop, which goes on running between cells and is
never closed either.  Prints one JSON line: per cell, its printed output and its error.  Then the
process exits; an atexit hook registered before schedsvc is imported (so it runs after schedsvc's)
prints a second JSON line: the engine's threads still alive after waiting for them to end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import json
import sys
import threading
from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

THREADS_TIMEOUT_S = 10.0


def _threads_left() -> None:
    alive = [t for t in threading.enumerate() if t.name.startswith("schedsvc")]
    for thread in alive:
        thread.join(THREADS_TIMEOUT_S)
    print(json.dumps({"threads_alive": [t.name for t in alive if t.is_alive()]}), flush=True)


def _shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    return InteractiveShell.instance(config=config)


def _outcome(result: Any, out: str) -> dict[str, Any]:
    error = result.error_before_exec or result.error_in_exec
    return {"out": out, "error": None if error is None else f"{type(error).__name__}: {error}"}


def run_terminal(shell: InteractiveShell, cells: list[str]) -> list[dict[str, Any]]:
    outcomes = []
    for cell in cells:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = shell.run_cell(cell)
        outcomes.append(_outcome(result, out.getvalue()))
    return outcomes


async def run_kernel(shell: InteractiveShell, cells: list[str]) -> list[dict[str, Any]]:
    outcomes = []
    for cell in cells:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = await shell.run_cell_async(cell, transformed_cell=shell.transform_cell(cell))
        outcomes.append(_outcome(result, out.getvalue()))
        await asyncio.sleep(0)  # the loop serves its other tasks between cells
    return outcomes


def main(mode: str, cells: list[str]) -> None:
    atexit.register(_threads_left)
    shell = _shell()
    if mode == "terminal":
        outcomes = run_terminal(shell, cells)
    else:
        loop = asyncio.new_event_loop()  # a kernel's loop: it is never closed
        outcomes = loop.run_until_complete(run_kernel(shell, cells))
    print(json.dumps({"cells": outcomes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
