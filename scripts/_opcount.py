"""Bytecodes run per function and thread while a path runs: the opcode tracer of the scripts that count
what a path costs (``serve_path.py ops``, ``gpu_probe.py ops``).  Unlike a time, a count hardly moves from
run to run, so a change on the path shows as what it adds or removes."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import schedsvc

#: where the engine's modules are (an editable install or site-packages alike)
PACKAGE = os.path.dirname(schedsvc.__file__) + os.sep
#: the package's modules that are not the engine: the command line, and the CUDA simulator (it stands for
#: CuPy and the GPU, whose work is not Python there)
NOT_ENGINE = (PACKAGE + "cli" + os.sep, PACKAGE + os.path.join("devices", "cudasim") + os.sep)

Counts = collections.Counter[tuple[str, str, bool, bool]]


class OpCounter:
    """Bytecodes run per function while ``on``, by thread as ``label()`` names it.  Each thread counts in
    a counter of its own (``+=`` on a shared one could lose counts when threads switch).  Install
    ``tracer`` with ``threading.settrace`` before the threads to count start, and ``sys.settrace``."""

    def __init__(self, label: Callable[[], str]) -> None:
        self.label = label
        self.on = False
        self._per_thread: dict[int, Counts] = {}

    @property
    def counts(self) -> Counts:
        """(thread's label, function, is it the engine's?, does it run for the engine?) -> bytecodes, all
        threads summed.  A function runs for the engine when the nearest of the package's functions on its
        stack (itself included) is the engine's: the engine's own, and the library code it calls."""
        total: Counts = collections.Counter()
        for counts in list(self._per_thread.values()):
            total.update(counts)
        return total

    def take(self) -> Counts:
        """``counts``, and count from zero again (a frame running meanwhile may add a few bytecodes to either
        side of the cut)."""
        total: Counts = collections.Counter()
        for counts in list(self._per_thread.values()):
            total.update(counts)
            counts.clear()
        return total

    def add(self, counts: Counts) -> None:
        """Count ``counts`` as if run here (counts read from another process, to ``report``)."""
        self._per_thread.setdefault(-1, collections.Counter()).update(counts)

    def tracer(self, frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        if not self.on:
            return None
        frame.f_trace_opcodes = True
        code = frame.f_code
        path = code.co_filename
        engine = path.startswith(PACKAGE) and not path.startswith(NOT_ENGINE)
        caller: FrameType | None = frame
        while caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
            caller = caller.f_back
        for_engine = caller is not None and not caller.f_code.co_filename.startswith(NOT_ENGINE)
        where = path[len(PACKAGE) :] if path.startswith(PACKAGE) else path.rsplit("site-packages/", 1)[-1]
        key = (self.label(), f"{where}:{code.co_firstlineno}:{code.co_name}", engine, for_engine)
        ident = threading.get_ident()
        counts = self._per_thread.get(ident)
        if counts is None:
            counts = self._per_thread.setdefault(ident, collections.Counter())

        def local(frame: FrameType, event: str, arg: object) -> Callable[..., Any]:
            if event == "opcode":
                counts[key] += 1
            return local

        return local

    def report(self, n: int, unit: str, threads: Iterable[str], top: int, skip: Iterable[str] = ()) -> None:
        """Print, for each thread label, its bytecodes per ``unit`` (``n`` of them ran), the engine's share
        and what ran for the engine, then its ``top`` functions; functions whose name holds one of ``skip``
        are left out."""
        skip = tuple(skip)
        for thread in threads:
            mine: collections.Counter[str] = collections.Counter()
            engine = for_engine = 0.0
            for (label, name, own, ran_for), count in self.counts.items():
                if label != thread or any(p in name for p in skip):
                    continue
                mine[name] += count / n
                engine += count / n if own else 0.0
                for_engine += count / n if ran_for else 0.0
            print(
                f"{thread}: {sum(mine.values()):,.0f} bytecodes per {unit}, {engine:,.0f} in the engine's "
                f"modules, {for_engine:,.0f} run for the engine"
            )
            for name, v in mine.most_common(top):
                print(f"  {v:8.1f}  {name}")
