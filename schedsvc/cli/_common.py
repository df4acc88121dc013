"""What more than one ``schedsvc`` subcommand needs: errors, output files and reports, figures in words, the
machine (its load, the cores the process may use), the measuring set-up, and the models they run (the
sources' two, and a digits-sized MLP).

Each subcommand module (``demo``, ``info``, ``tune``, and the ``bench`` suites) imports this module and the
library, never another subcommand, so that one command can be read or changed without the others.  Only
the standard library is imported at module level: ``schedsvc --help`` imports every subcommand module to
build its parser, and stays fast; NumPy and threadpoolctl are imported when a command runs.

The cli extra (``pip install 'schedsvc[cli]'``) brings rich: without it the commands print plain text
tables and progress lines.  threadpoolctl, with which the commands that measure hold BLAS at one thread
(``one_blas_thread``), is one of schedsvc's own dependencies; where it is missing they say to install it
(``NeedsExtra``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "CLI_EXTRA",
    "DIGITS_PIXELS",
    "DIGITS_ROWS",
    "Figures",
    "MiB",
    "NeedsExtra",
    "aligned",
    "bench_workers",
    "cores_phrase",
    "digits_rows",
    "digits_weights",
    "duration",
    "emit",
    "fail",
    "fancy_func",
    "figure",
    "figure_digits",
    "gpu_unavailable",
    "has_rich",
    "load_average",
    "make_mlp",
    "median_figures",
    "meets",
    "mlp_weights",
    "one_blas_thread",
    "or_dash",
    "output_problem",
    "print_json",
    "progress",
    "runs_phrase",
    "short",
    "target_line",
    "target_mark",
    "text_table",
    "usable_cores",
    "write_json",
]

CLI_EXTRA = "pip install 'schedsvc[cli]'"
MiB = 2**20
#: the shape of scikit-learn's digits set: 1,797 images of 8 x 8 pixels, each pixel 0..16
DIGITS_ROWS, DIGITS_PIXELS = 1797, 64
#: Measured quantities of one run, by name (seconds, microseconds, ratios, MiB, counts).
Figures = dict[str, float]


# -- errors and progress ------------------------------------------------------------------------------


def fail(command: str, problem: str, status: int = 2) -> int:
    """Say ``schedsvc COMMAND: PROBLEM`` on stderr; return the exit status (2: a usage error)."""
    print(f"schedsvc {command}: {problem}", file=sys.stderr)
    return status


def progress(line: str) -> None:
    """A progress line on stderr (stdout stays the report)."""
    print(f"  ... {line}", file=sys.stderr, flush=True)


class NeedsExtra(Exception):
    """A command needs a package of the cli extra that is not installed; the message says which and how."""


def has_rich() -> bool:
    """Is rich (the cli extra) installed?  Tables and progress bars with it, plain text without it."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def text_table(headers: list[str], rows: list[list[str]], title: str | None = None, right: int = 0) -> str:
    """Rows as plain text: a column per header, as wide as its widest cell, two spaces apart, a rule under
    the headers; the first ``right`` columns (numbers) aligned right."""
    rule = ["-" * max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    head, *lines = aligned([headers, rule, *rows], right)
    return "\n".join([*([title] if title else []), head, *lines])


def aligned(rows: list[list[str]], right: int = 0) -> list[str]:
    """Rows of cells as lines: each column as wide as its widest cell, two spaces apart; the first
    ``right`` columns aligned right, the rest left."""
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [
        "  ".join(
            cell.rjust(width) if i < right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()
        for cells in rows
    ]


# -- figures in words ----------------------------------------------------------------------------------


def figure_digits(x: float) -> int:
    """Decimals a figure deserves: none from 100, one from 10, two below."""
    magnitude = abs(x)
    return 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2


def figure(x: float, digits: int | None = None) -> str:
    """A figure with as many decimals as it deserves (``figure_digits``), or ``digits`` of them."""
    return f"{x:,.{figure_digits(x) if digits is None else digits}f}"


def duration(seconds: float) -> str:
    """A duration in the unit that suits it: '850 µs', '12.3 ms', '1.20 s'."""
    if seconds < 1e-3:
        return f"{figure(seconds * 1e6)} µs"
    if seconds < 1:
        return f"{figure(seconds * 1e3)} ms"
    return f"{figure(seconds)} s"


def short(value: float, unit: str) -> str:
    """A figure to three significant digits with its unit: '14.7 ms', '127 MiB'."""
    return f"{value:.3g} {unit}"


def or_dash(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or '-' where there is none."""
    return "-" if value is None else format(value, spec)


def cores_phrase(n: int) -> str:
    """'1 core', '2 cores'."""
    return "1 core" if n == 1 else f"{n} cores"


# -- output files and reports ---------------------------------------------------------------------------


def output_problem(flag: str, path: str | None) -> str | None:
    """Why ``path`` cannot take an output file, checked before a run rather than after it; None if it can."""
    if not path or path == "-":
        return None
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path}: that is a directory; name a file in it"
    if not target.resolve().parent.is_dir():
        return f"{flag} {path}: the directory {str(target.parent)!r} does not exist"
    return None


def print_json(report: dict[str, Any]) -> None:
    """The report as indented JSON on stdout, and nothing else there."""
    json.dump(report, sys.stdout, indent=2)
    print()


def write_json(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """The report as indented JSON in the file ``path``."""
    Path(path).write_text(json.dumps(report, indent=2), encoding="utf-8")


def emit(report: dict[str, Any], path: str | None, fmt: Callable[[dict[str, Any]], str]) -> None:
    """Print ``fmt(report)``, and write the report as JSON to ``path`` ('-': JSON to stdout instead)."""
    if path == "-":
        print_json(report)
        return
    print(fmt(report))
    if path:
        write_json(report, path)
        print(f"wrote {path}")


def runs_phrase(reps: int) -> str:
    """How a figure over ``reps`` runs was taken, for a report's heading."""
    return "1 run" if reps == 1 else f"median of {reps} runs"


# -- measuring ---------------------------------------------------------------------------------------------


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as an engine counts them), not all the machine's."""
    from ..devices import engine_cores

    return engine_cores()


def load_average() -> float | None:
    """The 1-minute load average, to two decimals (None where the platform has none): runs on a busy
    machine are noisy, and a report should say so."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # no load average on this platform
        return None


def bench_workers() -> int:
    """Worker threads for the parallel benchmarks and demo runs: one per core the process may run on (as
    an engine's default), and at least 2."""
    return max(2, usable_cores())


def one_blas_thread() -> AbstractContextManager[Any]:
    """BLAS held at one thread while measuring, so that parallel speed-up comes from the engine.

    An engine started inside keeps it at one: its default (``blas_threads="auto"``) only lowers BLAS's
    threads, and it gives back the one thread when it closes.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as exc:
        raise NeedsExtra(
            "measuring holds BLAS at one thread with threadpoolctl, which is not installed (schedsvc needs it); "
            "pip install 'threadpoolctl>=3.1'"
        ) from exc

    limits: AbstractContextManager[Any] = threadpool_limits(limits=1)  # threadpoolctl has no annotations
    return limits


def median_figures(samples: list[Figures]) -> Figures:
    """The median of each figure over runs (the keys of the first run, in its order)."""
    import statistics

    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def meets(value: float, op: str, target: float) -> bool:
    """Whether ``value`` meets a target written ``<= target`` or ``>= target``."""
    return value <= target if op == "<=" else value >= target


def target_mark(met: bool) -> str:
    """The mark before a target's line in a report: ``met`` or ``MISS``, four wide."""
    return "met " if met else "MISS"


def target_line(t: dict[str, Any]) -> str:
    """A target check of a report as one line: the mark, the label, the value and the target."""
    return f"  [{target_mark(t['met'])}] {t['label']:42s} {t['value']:8.3g}  target {t['target']}"


# -- GPUs -----------------------------------------------------------------------------------------------


def gpu_unavailable(device: str = "cuda:0", *, cuda_simulator: bool | None = None) -> str | None:
    """Why the engine cannot run tasks on ``device`` here (None when it can): CuPy missing, no such
    device (the message says which), or a first task on it failing.  ``cuda_simulator``: the engine's
    setting for the probe (None: the configuration's, e.g. ``SCHEDSVC_CUDA_SIMULATOR``)."""
    import asyncio

    import schedsvc as ss

    from ..devices import check_device

    try:
        if not cuda_simulator:
            check_device(device)
        asyncio.run(_probe(device, cuda_simulator))
    except ss.SchedsvcError as exc:  # DeviceError, or an engine that cannot run cuda tasks yet
        return str(exc)
    except Exception as exc:  # the device is there but a first task on it failed: say so, measure nothing
        return f"{device} failed a first task: {type(exc).__name__}: {exc}"
    return None


async def _probe(device: str, cuda_simulator: bool | None) -> None:
    import schedsvc as ss

    options: dict[str, Any] = {} if cuda_simulator is None else {"cuda_simulator": cuda_simulator}
    async with ss.Engine(devices=("cpu", device), **options) as eng:
        ones: Any = eng.ones(2, device=device)
        await (ones + 1)


def randn_on(xp: Any, side: int) -> Any:
    """A side x side float32 standard-normal matrix made on the current device and stream (a cuda
    task's body, given the array module: the sources' ``nd.random.normal``)."""
    import numpy as np

    random = getattr(xp, "random", None)
    if random is None:  # the simulator has no generator: a host draw copied in (simulated runs only)
        return xp.asarray(np.random.default_rng(side).standard_normal((side, side), dtype=np.float32))
    return random.standard_normal((side, side), dtype=np.float32)


# -- the sources' models: the benchmarks, the demo and tune run them -------------------------------------


def mlp_weights(seed: int = 0) -> list[np.ndarray]:
    """Weights and biases of the sources' MLP (Dense 512->256->128->2)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = [(512, 256), (256, 128), (128, 2)]
    return [a for n, m in sizes for a in (rng.standard_normal((n, m)) / np.sqrt(n), rng.standard_normal(m))]


def digits_weights(seed: int = 19) -> list[np.ndarray]:
    """Weights and biases of an MLP the size of scikit-learn's digits classifier (64->128->64->10), He-initialised."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = [(DIGITS_PIXELS, 128), (128, 64), (64, 10)]
    return [
        a
        for n, m in sizes
        for a in (rng.standard_normal((n, m)) * np.sqrt(2 / n), rng.standard_normal(m) * 0.1)
    ]


def digits_rows(n: int = DIGITS_ROWS, seed: int = 1797) -> np.ndarray:
    """``n`` digits-like rows: 64 pixels each, whole values 0..16, as float64."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 17, (n, DIGITS_PIXELS)).astype(np.float64)


def make_mlp(weights: list[np.ndarray]) -> Callable[[Any], Any]:
    """A three-layer MLP with ReLU (the sources', or the digits one) as a function of its input (NumPy arrays
    or engine Tensors)."""
    import numpy as np

    w1, b1, w2, b2, w3, b3 = weights

    def mlp(x: Any) -> Any:
        h = np.maximum(x @ w1 + b1, 0)
        h = np.maximum(h @ w2 + b2, 0)
        return h @ w3 + b3

    return mlp


def fancy_func(a: Any, b: Any, c: Any, d: Any) -> Any:
    """The sources' ``fancy_func``: (a + b) + (c + d), three additions."""
    e = a + b
    f = c + d
    return e + f
