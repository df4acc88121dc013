"""Cores and processes of ``schedsvc bench serve``: the ``--cpus`` lists, the split of the server's cores
among its processes, and the pinning of a process, or of a child as it starts.

A cpu list is Linux's syntax (``taskset -c``, ``/sys/devices/system/cpu/online``): core numbers and
ranges, comma-separated, as in ``0-3,8,10-11``.  A child started while the calling thread is pinned
(``thread_pinned``) starts on those cores (it inherits the thread's affinity at fork), so that everything
sized by the cores a process may run on sees them from the start: NumPy's BLAS sizes its thread pool when
it loads, an engine its default ``cpu_workers`` when it opens.  The bench pins the load generator the same
way: wrk starts from a pinned thread, and the asyncio client (and the health probe) run on one.  Only the
standard library: the server process imports this as it starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence

__all__ = [
    "Cores",
    "allowed_cores",
    "format_cpu_list",
    "parse_cpu_list",
    "parse_cpus",
    "pin_process",
    "server_shares",
    "split_cores",
    "stop_processes",
    "thread_pinned",
]

#: core numbers, ascending, each once
Cores = tuple[int, ...]
#: a cpu list's item: a core, or a range of cores
_ITEM = re.compile(r"(\d+)(?:-(\d+))?")
#: no machine has a core numbered this high (Linux's NR_CPUS): a list naming one is refused before its ranges
#: are expanded
MAX_CORE = 1 << 16


def allowed_cores() -> Cores:
    """The cores this process may run on (its CPU affinity)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def parse_cpu_list(text: str) -> Cores:
    """The cores of a cpu list such as ``0-3,8,10-11``; ``ValueError`` saying why for an empty list, a bad
    item, or a range that goes down."""
    text = text.strip()
    if not text:
        raise ValueError("the cpu list is empty")
    cores: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()!r} is not a core or a range of cores (e.g. 0-3,8,10-11)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"the range {item.strip()!r} goes down: write it {last}-{first}")
        if last >= MAX_CORE:
            raise ValueError(f"no machine has a core {last}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def format_cpu_list(cores: Iterable[int]) -> str:
    """``cores`` as a cpu list, runs of consecutive cores as ranges: ``0-3,8,10-11``."""
    runs: list[list[int]] = []
    for core in sorted(set(cores)):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpus(text: str, allowed: Cores | None = None) -> tuple[Cores, Cores]:
    """The server's and the client's cores of ``--cpus``: ``SERVER:CLIENT``, or one list that both share.
    ``ValueError`` with the option's message where a list is bad or names a core outside ``allowed``
    (default: the cores this process may run on)."""
    parts = text.split(":")
    if len(parts) > 2:
        raise ValueError(f"--cpus {text!r}: give one cpu list, or SERVER:CLIENT (e.g. 0-7:8-15)")
    allowed = allowed_cores() if allowed is None else allowed
    lists: list[Cores] = []
    for who, part in zip(
        ("the server's ", "the client's ") if len(parts) == 2 else ("",), parts, strict=True
    ):
        if not part.strip():
            raise ValueError(f"--cpus {text!r}: {who or 'the '}cpu list is empty")
        try:
            cores = parse_cpu_list(part)
        except ValueError as exc:
            raise ValueError(f"--cpus {text!r}: {who}{'cpu list: ' if who else ''}{exc}") from None
        if outside := sorted(set(cores) - set(allowed)):
            raise ValueError(
                f"--cpus {text!r}: this process may not run on core{'s' if len(outside) > 1 else ''} "
                f"{format_cpu_list(outside)}; it may run on {format_cpu_list(allowed)}"
            )
        lists.append(cores)
    return lists[0], lists[-1]


def split_cores(cores: Cores, n: int) -> list[Cores]:
    """``cores`` in ``n`` contiguous shares, in order, their sizes at most one apart (the first ones larger)."""
    if not 1 <= n <= len(cores):
        raise ValueError(f"{len(cores)} cores cannot be split in {n} shares")
    size, larger = divmod(len(cores), n)
    shares, start = [], 0
    for i in range(n):
        stop = start + size + (i < larger)
        shares.append(cores[start:stop])
        start = stop
    return shares


def server_shares(cores: Cores | None, processes: int) -> list[Cores] | None:
    """Each server process's cores: ``cores`` (default: those this process may run on) in ``processes``
    shares; None where nothing is pinned (one process, no cores given).  ``ValueError`` with the option's
    message where there are fewer cores than processes."""
    if processes < 1:
        raise ValueError("--processes must be at least 1")
    if cores is None and processes == 1:
        return None
    cores = allowed_cores() if cores is None else cores
    if processes > len(cores):
        raise ValueError(
            f"--processes {processes} is more than the server's {len(cores)} "
            f"core{'s' if len(cores) > 1 else ''} ({format_cpu_list(cores)}): each process needs one"
        )
    return split_cores(cores, processes)


def pin_process(cores: Cores) -> None:
    """Pin every thread of this process to ``cores`` (threads started later inherit it)."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        threads = [0]
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def thread_pinned(cores: Cores | None) -> Iterator[None]:
    """The calling thread pinned to ``cores`` (None: left as it is) for the block, then restored.  Children
    it starts and threads it creates meanwhile inherit the pinning, and keep it."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM each of ``procs`` still running (a graceful shutdown), SIGKILL those still there ``grace``
    seconds later, and close their stdout."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
