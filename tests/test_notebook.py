"""The engine in Jupyter and IPython: cells with top-level ``await``, on IPython's own machinery.

Each session runs in a process of its own (``_notebook_session.py``): an IPython shell replaces
``__main__`` and installs exit hooks, and the exit itself is under test.  ``terminal`` is the ``ipython``
command (IPython's asyncio runner: ``run_until_complete`` per cell on a loop that stands still between
cells); ``kernel`` is ipykernel (``await shell.run_cell_async`` on a loop that keeps running).  Neither
loop is ever closed, so ``asyncio.run``'s end -- which finds an engine left open in a script -- never comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("IPython")

ROOT = Path(__file__).resolve().parent.parent
SESSION = Path(__file__).resolve().parent / "_notebook_session.py"
MODES = ["terminal", "kernel"]

START = [
    "import threading, numpy as np, schedsvc as ss",
    "eng = await ss.Engine(cpu_workers=2).start()",
]
WORK = [
    "f = await eng.submit(np.add, np.ones(3), 1)",
    "print((await f).tolist())",
    "print(f.result().tolist())",  # a final future's value, in a cell that does not await
    "x = eng.asarray(np.arange(4.0))\ny = (x * 2 + 1).sum()\nprint(y.shape, float(await y))",
    "print([v async for v in eng.map(abs, [-1, -2, 3])])",
    "c = eng.compile(lambda a: a * 2 + 1)\nprint((await c(x)).tolist(), (await (await c.submit(x))).tolist())",
    "gate = threading.Event()\ng = eng.submit_nowait(gate.wait, 10)",  # no await: runs without the runner
    "g.result()",  # not final yet, on the loop's thread: refused, saying what to do
    "gate.set()\nprint(await g)",
    "async with ss.Engine(cpu_workers=1) as inner:\n    print(await inner.run(sum, [1, 2]))",
]
WORK_OUT = [
    "",
    "[2.0, 2.0, 2.0]\n",
    "[2.0, 2.0, 2.0]\n",
    "() 16.0\n",
    "[1, 2, 3]\n",
    "[1.0, 3.0, 5.0, 7.0] [1.0, 3.0, 5.0, 7.0]\n",
    "",
    None,  # the refusal's traceback
    "True\n",
    "3\n",
]
REFUSED = 7  # WORK's index of 'g.result()'


def session(mode: str, cells: list[str], tmp_path: Path) -> tuple[list[dict[str, Any]], list[str], str]:
    """Run ``cells``, then exit: each cell's outcome, the engine's threads alive after the exit, stderr."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "IPYTHONDIR": str(tmp_path / "ipython"),  # no profile or history of the user's
    }
    proc = subprocess.run(
        [sys.executable, "-W", "default", str(SESSION), mode, json.dumps(cells)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=50,  # an exit that hangs fails here
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, proc.stdout + proc.stderr
    return lines[0]["cells"], lines[1]["threads_alive"], proc.stderr


def check_work(outcomes: list[dict[str, Any]]) -> None:
    for cell, outcome, out in zip(WORK, outcomes, WORK_OUT, strict=True):
        if out is None:
            continue
        assert outcome == {"out": out, "error": None}, cell
    refused = outcomes[REFUSED]["error"]
    assert refused.startswith("SchedsvcError: <Future"), refused
    assert "use 'await fut' there (a Jupyter or IPython cell can await at its top level)" in refused


@pytest.mark.parametrize("mode", MODES)
def test_a_session_that_closes_its_engine(mode: str, tmp_path: Path) -> None:
    cells = [*START, *WORK, "await eng.aclose()\nprint(eng.closed)"]
    outcomes, alive, stderr = session(mode, cells, tmp_path)
    assert [o["error"] for o in outcomes[: len(START)]] == [None] * len(START)
    check_work(outcomes[len(START) : -1])
    assert outcomes[-1] == {"out": "True\n", "error": None}
    assert alive == []
    assert "Engine" not in stderr, stderr  # (IPython's loop, never closed, warns for itself)
    assert "RuntimeWarning" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_session_that_exits_with_its_engine_open(mode: str, tmp_path: Path) -> None:
    """Warns, does not hang, and the engine's threads end.  The refused ``g.result()`` keeps the engine
    alive in ``sys.last_traceback``: no garbage collection finds it out."""
    cells = [*START, *WORK]
    outcomes, alive, stderr = session(mode, cells, tmp_path)
    check_work(outcomes[len(START) :])
    assert alive == []
    assert "ResourceWarning: <Engine running" in stderr, stderr
    assert "was still open when the interpreter exited" in stderr, stderr
    assert stderr.count("was still open") == 1, stderr
    assert "RuntimeWarning" not in stderr and "Exception ignored" not in stderr, stderr
