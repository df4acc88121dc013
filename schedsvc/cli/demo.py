"""``schedsvc demo``: the sources' experiments, measured on this machine, with the sources' claims beside them.

The "Computational Performance" chapter of *Dive into Deep Learning* makes a
handful of claims about an asynchronous engine: asynchronous computation,
automatic parallelism, memory under a flooded queue, hybridize, profiling,
and CPU/GPU overlap.  Each row here measures one of them with schedsvc as the
engine (the experiments are in ``bench/demo.py``).  GPU rows run only where
the engine can run cuda tasks, and otherwise say why they were skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from .bench.demo import Sizes

__all__ = ["SECTIONS", "main", "register"]

_MAX_WIDTH = 120

Fmt = Callable[[dict[str, float], dict[str, Any], "Sizes"], str]


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: what ran, how to show its figures, and what the sources say."""

    experiment: str
    label: str  # formatted with s=Sizes
    claim: str
    measured: Fmt


def _n(x: float) -> str:
    """A figure with as many digits as it deserves."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _t(seconds: float) -> str:
    """A duration in the unit that suits it."""
    if seconds < 1e-3:
        return f"{_n(seconds * 1e6)} µs"
    if seconds < 1:
        return f"{_n(seconds * 1e3)} ms"
    return f"{_n(seconds)} s"


def _queued(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    same = "equal to NumPy's" if c["equals_numpy"] else "DIFFERENT from NumPy's"
    return f"submit returned in {_n(f['submit_us'])} µs; the result ({same}) came at {_n(f['result_ms'])} ms"


def _loop(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"awaited op by op: {_n(f['awaited_ms'])} ms ({_n(f['awaited_us'])} µs/op through a worker; "
        f"{_n(f['awaited_inline_us'])} µs/op when tiny ops run in the awaiting coroutine); "
        f"queued, then one wait: {_n(f['queued_ms'])} ms, {_n(f['awaited_over_queued'])}x faster"
    )


def _cost(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    per_op = f["t1_us"] + f["t2_us"] + f["t3_us"]
    return (
        f"awaited: t1 {_n(f['t1_us'])} + t2 {_n(f['t2_us'])} + t3 {_n(f['t3_us'])} = {_n(per_op)} µs, "
        f"N times = {_n(s.loop_ops * per_op / 1e3)} ms. Queued: t1 {_n(f['queued_t1_us'])} µs + "
        f"N·t2 {_n(s.loop_ops * f['queued_t2_us'] / 1e3)} ms (t2 {_n(f['queued_t2_us'])} µs) + "
        f"t3 {_n(f['queued_t3_us'])} µs; the frontend was done queueing at {_n(f['queued_frontend_ms'])} ms"
    )


def _speedup(kind: str) -> Fmt:
    def fmt(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
        return (
            f"1 worker {_t(f[f'{kind}_1worker_s'])}, {c['workers']} workers "
            f"{_t(f[f'{kind}_nworkers_s'])}: {_n(f[f'{kind}_speedup'])}x"
        )

    return fmt


def _memory(mode: str) -> Fmt:
    def fmt(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
        text = f"peak {_n(f[f'{mode}_peak_mib'])} MiB, {_t(f[f'{mode}_s'])}"
        if mode != "unbounded":
            text += f" ({_n(f[f'{mode}_s'] / f['unbounded_s'])}x the time without a limit)"
        return text

    return fmt


def _mlp(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"NumPy {_n(f['numpy_us'])} µs/call; engine Tensors, eager {_n(f['eager_us'])} µs; "
        f"compiled {_n(f['compiled_us'])} µs: {_n(f['eager_over_compiled'])}x faster than eager, "
        f"{_n(f['compiled_over_numpy'])}x NumPy's time"
    )


def _fancy(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"eager: {f['eager_tasks_per_call']:.0f} tasks, {_n(f['eager_us'])} µs per call; compiled: "
        f"{f['compiled_tasks_per_call']:.0f} task, {_n(f['compiled_us'])} µs ({_n(f['eager_over_compiled'])}x)"
    )


def _folded(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"{c['folded_traced_ops']} traced ops, {c['folded_ops']} folded, {c['folded_kept_ops']} left: "
        f"the graph returns the constant {c['folded_value']:g}; a call costs {_n(f['folded_us'])} µs"
    )


def _serialise(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    same = "the same result bit for bit" if c["loaded_equals_compiled"] else "a DIFFERENT result"
    return (
        f"{_n(f['file_kib'])} KiB of JSON, saved in {_n(f['save_ms'])} ms; ss.load took {_n(f['load_ms'])} ms "
        f"(no source, {c['loaded_traces']} traces); its first call {_n(f['loaded_call_ms'])} ms gave {same}"
    )


def _profile(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"{f['spans']:.0f} spans on {f['tracks']:.0f} thread tracks, {f['flow_arrows']:.0f} dependency "
        f"arrows, {f['counter_samples']:.0f} counter samples: {_n(f['file_kib'])} KiB of Chrome trace JSON "
        "(open it in ui.perfetto.dev)"
    )


def _cpu_gpu(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"CPU alone {_t(f['cpu_s'])}, GPU alone {_t(f['gpu_s'])}, both queued together "
        f"{_t(f['both_s'])} ({_n(f['sum_over_both'])}x less than one after the other)"
    )


def _copy_overlap(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return (
        f"each product awaited on the host in turn {_t(f['serial_s'])}; all queued "
        f"{_t(f['overlapped_s'])} ({_n(f['serial_over_overlapped'])}x)"
    )


def _multi_gpu(f: dict[str, float], c: dict[str, Any], s: Sizes) -> str:
    return f"1 GPU {_t(f['one_s'])}, {len(c['devices'])} GPUs {_t(f['all_s'])}: {_n(f['speedup'])}x"


#: (section title, rows), in the order of the sources.
SECTIONS: list[tuple[str, list[Row]]] = [
    (
        "Asynchronous computation",
        [
            Row(
                "queued",
                "c = a * b + 2, {s.queued_side}x{s.queued_side}",
                "The frontend only puts the work in the backend's queue and returns; it waits "
                "when it needs the result (print c).",
                _queued,
            ),
            Row(
                "loop",
                "{s.loop_ops:,} x (y = x + 1)",
                "Synchronous 3.56 s, asynchronous 1.05 s for 1,000 ops (TensorFlow): not waiting "
                "for each op is faster.",
                _loop,
            ),
            Row(
                "loop",
                "the cost model, same loops",
                "Per op, t1 to queue, t2 to compute, t3 to return: N(t1+t2+t3) synchronously, "
                "t1 + N·t2 + t3 asynchronously (if N·t2 > (N-1)·t1).",
                _cost,
            ),
        ],
    ),
    (
        "Automatic parallelism",
        [
            Row(
                "parallel",
                "{s.dots} independent np.dot, {s.dot_side}x{s.dot_side}",
                "The backend sees no dependency between them and runs them in parallel "
                "(BLAS held at 1 thread here, so the speed-up is the engine's).",
                _speedup("independent"),
            ),
            Row(
                "parallel",
                "a chain of {s.dots} np.dot",
                "Operations that depend on each other cannot be parallelised.",
                _speedup("chain"),
            ),
        ],
    ),
    (
        "Memory and backpressure",
        [
            Row(
                "memory",
                "{s.batches} batches {s.batch_rows}x{s.features} float32, no limit",
                "With no sync point, the frontend hands the backend many batches at once, "
                "which can take much more memory.",
                _memory("unbounded"),
            ),
            Row(
                "memory",
                "the same, max_pending_bytes = {s.bound_batches} batches",
                "Do not hand the backend too many tasks at once. (Here await submit waits for room, "
                "with no sync point in the loop.)",
                _memory("bounded"),
            ),
            Row(
                "memory",
                "the same, awaited once per batch",
                "Sync once per minibatch to keep the frontend and the backend in step.",
                _memory("synced"),
            ),
        ],
    ),
    (
        "Hybridize: imperative and symbolic",
        [
            Row(
                "mlp",
                "MLP 512-256-128-2, {s.calls:,} calls",
                "Eager 1.28 s, graph mode (tf.function) 0.58 s for 1,000 calls: hybridized, "
                "the network runs faster.",
                _mlp,
            ),
            Row(
                "fancy",
                "fancy_func, {s.fancy_len} elements",
                "Python runs add three times, one call after another; a compiled program runs as one.",
                _fancy,
            ),
            Row(
                "fancy",
                "fancy_func(1, 2, 3, 4), compiled",
                "A compiler sees the whole program: it can rewrite it as print((1 + 2) + (3 + 4)), "
                "or even print(10).",
                _folded,
            ),
            Row(
                "serialise",
                "save and load the compiled MLP",
                "A compiled model can be serialised (tf.saved_model) and run without the Python program.",
                _serialise,
            ),
        ],
    ),
    (
        "Profiling",
        [
            Row(
                "profile",
                "eng.trace(): {s.trace_dots} dots, a join, a chain of {s.trace_chain}",
                "Vendors' profilers show precisely where the time goes.",
                _profile,
            ),
        ],
    ),
    (
        "GPU",
        [
            Row(
                "cpu_gpu",
                "CPU and GPU in parallel",
                "The CPU and the GPU compute at the same time.",
                _cpu_gpu,
            ),
            Row(
                "copy_overlap",
                "copies overlap compute",
                "Copying results to the host while the GPU computes the next ones hides the copies.",
                _copy_overlap,
            ),
            Row(
                "multi_gpu",
                "{s.gpu_ops} products on 1 and 2 GPUs",
                "Work spread over several GPUs runs in parallel.",
                _multi_gpu,
            ),
        ],
    ),
]


def register(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="run the sources' experiments on this machine and print what they measured"
    )
    demo.add_argument("--reps", type=int, default=3, help="repetitions per experiment; medians shown (3)")
    demo.add_argument("--quick", action="store_true", help="small sizes: a quick look, in a few seconds")
    demo.add_argument(
        "--json", metavar="PATH", help="also write every figure as JSON to PATH ('-': stdout only)"
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The ``demo`` subcommand."""
    from ._common import output_problem

    if args.reps < 1:
        print("schedsvc demo: --reps must be at least 1", file=sys.stderr)
        return 2
    if problem := output_problem("--json", args.json):
        print(f"schedsvc demo: {problem}", file=sys.stderr)
        return 2
    return main(reps=args.reps, quick=args.quick, json_path=args.json)


def main(reps: int = 3, quick: bool = False, json_path: str | None = None) -> int:
    """Run the experiments, print the table (or JSON), and write the JSON report if asked."""
    from .bench import demo

    sizes = demo.QUICK if quick else demo.FULL
    with _progress() as progress:
        report = demo.run(reps=reps, sizes=sizes, progress=progress)
        progress(f"all runs done in {report['wall_s']:.1f} s")
    report = _with_rows(report, sizes, quick)
    if json_path == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    _render(report)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {json_path}")
    return 0


def _with_rows(report: dict[str, Any], sizes: Sizes, quick: bool) -> dict[str, Any]:
    """The report, plus each row as shown: section, label, status, the figures in words, the claim."""
    import schedsvc

    rows = []
    for title, section in SECTIONS:
        for row in section:
            result = report["experiments"][row.experiment]
            entry = {"section": title, "experiment": row.experiment, "label": row.label.format(s=sizes)}
            entry["status"] = result["status"]
            if result["status"] == "measured":
                entry["measured"] = row.measured(result["figures"], result["checks"], sizes)
            else:
                entry["reason"] = result["reason"]
            rows.append(entry | {"claim": row.claim})
    return {"schedsvc": schedsvc.__version__, "quick": quick} | report | {"rows": rows}


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], None]]:
    """Progress on stderr while the experiments run: a status line on a terminal, else a line per run
    (stdout, which may be the JSON report, stays the report)."""
    from rich.console import Console

    from ._common import progress

    console = Console(stderr=True)
    if not console.is_terminal:
        yield progress
        return
    with console.status("starting") as status:
        yield lambda line: status.update(line)


def _console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:  # piped: 100 columns, not rich's 80
        return Console(highlight=False, width=100)
    if console.width > _MAX_WIDTH:  # wider tables only stretch the text apart
        return Console(highlight=False, width=_MAX_WIDTH)
    return console


def _render(report: dict[str, Any]) -> None:
    from rich.text import Text

    console = _console()
    sizes = ", quick sizes" if report["quick"] else ""
    runs = "1 run" if report["reps"] == 1 else f"median of {report['reps']} runs"
    console.print(
        Text(
            f'schedsvc demo: the experiments of the sources\' "Computational Performance" chapter on this '
            f"machine ({runs}, {report['cpu_workers']} CPU workers, BLAS at "
            f"1 thread{sizes})"
        )
    )
    for i, (title, _) in enumerate(SECTIONS):
        console.print()
        console.print(_table(title, [r for r in report["rows"] if r["section"] == title], header=i == 0))
    console.print(Text(f"took {report['wall_s']:.1f} s; schedsvc demo --json PATH writes every figure"))


def _table(title: str, rows: list[dict[str, Any]], header: bool) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=Text(title.upper(), style="bold cyan"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        expand=True,
        show_edge=False,
        pad_edge=False,
        show_header=header,
        show_lines=True,  # SIMPLE_HEAD draws them blank: a gap between rows of wrapped text
    )
    table.add_column("experiment", ratio=22, style="bold")
    table.add_column("measured here", ratio=45)
    table.add_column("the sources say", ratio=33, style="dim")
    for row in rows:
        if row["status"] == "measured":
            measured = Text(row["measured"])
        else:
            measured = Text(f"skipped: {row['reason']}", style="yellow")
        table.add_row(Text(row["label"]), measured, Text(row["claim"]))
    return table
