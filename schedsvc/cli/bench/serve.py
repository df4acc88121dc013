"""Serving benchmark: a real web service (Starlette on uvicorn, in a process of its own) under real HTTP load,
one way of running the model per variant, against the same stack with no model measured in the same run.

Each variant and model is served by its own server process (``_serve_app``), bound to 127.0.0.1 on a free
port, started before the first round and stopped at the end (a server that is not up within
``STARTUP_TIMEOUT_S`` is an error).  Each request POSTs one JSON row to ``/predict``; the load comes from
wrk when it is on PATH (a Lua script counts the answers by status and checks each body's shape), else from
a client of asyncio streams of this process (it checks each body's JSON).  ``connections`` connections are
kept busy for ``duration`` seconds (wrk takes whole seconds: rounded up).  Meanwhile a probe thread GETs
``/health`` every ``HEALTH_INTERVAL_S`` on a connection of its own: the app answers it from the event loop,
so its latency is the event loop's own health under load.

Rounds are interleaved (A B C A B C ...); each figure is the median over rounds, and each variant's ratio
is its req/s over that of ``none`` (the same stack, no model) in the same round.  req/s counts the answers
that are the model's output only; a 503 (the engine at its limits), any other status, a body of the wrong
shape or a socket error is an error, and a variant with such errors (503s aside) or without one good answer
is reported as failed, never as fast.  Before the load, each server's answer to one row is checked against
the model run here.

``overload``: ``batched`` with a small ``max_pending`` under ``OVERLOAD_CONNECTIONS`` connections: the 503s
keep the queue, and the server's memory (peak RSS, ``VmHWM``), bounded while ``/health`` still answers.

``processes``: each server is that many processes on one listening socket, each with its own event loop,
app and engine, each pinned to its share of the server's cores (``_serve_app``).  ``server_cpus`` and
``client_cpus`` pin the servers and the load (wrk or the asyncio client, and the health probe) to those
cores; without them nothing is pinned, but the processes of a server of several still split the cores
this process may run on.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._common import CLI_EXTRA, Figures, NeedsExtra, median_figures, runs_phrase, text_table
from . import _serve_app as app
from ._serve_load import (
    REQUEST_TIMEOUT_S,
    HealthProbe,
    Load,
    ServeError,
    asyncio_load,
    parse_wrk,
    wrk_load,
    wrk_script,
)
from ._serve_procs import (
    Cores,
    format_cpu_list,
    parse_cpus,
    server_shares,
    split_cores,
    stop_processes,
    thread_pinned,
)

__all__ = [
    "CLIENTS",
    "DEFAULT_VARIANTS",
    "MODELS",
    "OVERLOAD",
    "OVERLOAD_CONNECTIONS",
    "Load",
    "Server",
    "ServeError",
    "asyncio_load",
    "format_report",
    "parse_cpus",
    "parse_wrk",
    "plan",
    "run",
    "running",
    "server_shares",
    "split_cores",
    "variant_problems",
    "wrk_load",
    "wrk_script",
]

MODELS = tuple(app.MODELS)
OVERLOAD = app.OVERLOAD
#: every variant, in the order of a round (``overload`` only with ``--overload``)
DEFAULT_VARIANTS = tuple(app.VARIANTS)
CLIENTS = ("auto", "wrk", "asyncio")
#: the report's name of the no-model server measured beside ray's
RAY_BASE = "none (beside ray)"
#: seconds a server may take to start (imports, the engine, the model's trace) before it is an error
STARTUP_TIMEOUT_S = 60.0
#: seconds a server gets to stop after SIGTERM before it is killed
STOP_TIMEOUT_S = 10.0
#: connections and max_pending of the overload variant
OVERLOAD_CONNECTIONS = 256
OVERLOAD_MAX_PENDING = 64
#: the figures of a measurement whose medians are reported, and the counts that are summed over rounds
MEDIANS = ("rps", "p50_us", "p99_us", "health_p99_us", "ratio")
COUNTS = ("requests", "ok", "errors", "status_503", "bad", "health_errors")


# -- the servers ---------------------------------------------------------------------------------------------


class Server:
    """One server: started by ``start``, ready once it wrote its port, stopped by ``stop``.

    ``processes`` processes serve it (``proc`` is the first, which starts and stops the others; ``pids``
    are all of theirs once it is ready), on ``cpus`` split among them (None: not pinned; with more than one
    process, the cores this process may run on)."""

    def __init__(
        self,
        variant: str,
        model: str,
        max_pending: int | None = None,
        *,
        processes: int = 1,
        cpus: Cores | None = None,
    ) -> None:
        self.variant, self.model, self.max_pending = variant, model, max_pending
        self.processes, self.shares = processes, server_shares(cpus, processes)
        self.port = 0
        self.pids: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.model}/{self.variant}"

    def command(self) -> list[str]:
        """The server's command line: the bench's app of this variant and model."""
        cmd = [sys.executable, "-m", app.__name__, self.variant, self.model]
        if self.max_pending is not None:
            cmd += ["--max-pending", str(self.max_pending)]
        if self.shares is not None:
            cmd += ["--cpus", format_cpu_list(c for share in self.shares for c in share)]
        if self.processes > 1:
            cmd += ["--processes", str(self.processes)]
        return cmd

    def start(self) -> None:
        """Start the process (do not wait for it: ``wait_ready``), on its share of the cores from the start."""
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, kept until stop() closes it
        with thread_pinned(self.shares[0] if self.shares is not None else None):
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log
            )

    def wait_ready(self, deadline: float) -> None:
        """Wait (until ``deadline``, a ``time.monotonic()``) for the server's ``ready PORT [PID...]`` line."""
        import selectors

        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise ServeError(f"the {self.name} server did not start within {STARTUP_TIMEOUT_S:g} s")
        line = self.proc.stdout.readline().decode(errors="replace").split()
        if len(line) < 2 or line[0] != "ready" or not all(word.isdigit() for word in line[1:]):
            with contextlib.suppress(subprocess.TimeoutExpired):  # its last words in the log
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            raise ServeError(f"the {self.name} server failed to start:\n{self.log_tail()}")
        self.port = int(line[1])
        self.pids = [int(pid) for pid in line[2:]] or [self.proc.pid]

    def log_tail(self, lines: int = 20) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])

    def peak_rss_mib(self) -> float | None:
        """The peak resident memory so far (``VmHWM``) of the server's processes, summed, MiB; None where
        /proc does not say."""
        total = 0
        for pid in self.pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return None
            match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
            if match is None:
                return None
            total += int(match.group(1))
        return total / 1024 if self.pids else None

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown: the first process stops the others), then SIGKILL after
        ``STOP_TIMEOUT_S`` (the others then stop by themselves: their parent is gone)."""
        if self.proc is None:
            return
        stop_processes([self.proc], STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()


@contextlib.contextmanager
def running(servers: list[Server]) -> Iterator[list[Server]]:
    """Every server started (at once) and ready; every one stopped on the way out, Ctrl-C included."""
    try:
        for server in servers:
            server.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in servers:
            server.wait_ready(deadline)
        yield servers
    finally:
        for server in servers:
            server.stop()


def _post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(app.HOST, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def check_answer(server: Server) -> str | None:
    """Why the server's answer to the bench's row is not the model's output (None: it is)."""
    row = app.request_row(server.model)
    try:
        status, body = _post(server.port, "/predict", json.dumps({"x": row}).encode())
        y = np.asarray(json.loads(body)["y"], dtype=np.float64) if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
        return f"no answer to a first request: {type(exc).__name__}: {exc}"
    if y is None:
        return f"a first request was answered {status}: {body[:200]!r}"
    n_out = app.MODELS[server.model][-1]
    if server.variant == "none":
        expected = np.zeros(n_out)
    else:
        expected = app.make_forward(server.model)(np.asarray([row], dtype=np.float32))[0]
    if y.shape != (n_out,) or not np.allclose(y, expected, rtol=1e-4, atol=1e-4):
        return f"a first request's answer is not the model's output: {y.tolist()} != {expected.tolist()}"
    return None


# -- a run ---------------------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One line of the report: a variant serving a model, its server, and what each round measured."""

    server: Server
    connections: int
    samples: list[Figures] = field(default_factory=list)
    failure: str | None = None
    label: str | None = None  # the report's name of its variant, where not the variant's own
    peak_rss_mib: float | None = None

    @property
    def variant(self) -> str:
        return self.server.variant


def _measure(row: _Row, load: Callable[..., Load], duration: float, cpus: Cores | None = None) -> Figures:
    """One round of ``row``'s variant: the load, and the health probe meanwhile, both on ``cpus``."""
    model = row.server.model
    body = json.dumps({"x": app.request_row(model)}, separators=(",", ":")).encode()
    with thread_pinned(cpus), HealthProbe(row.server.port) as probe:
        result = load(row.server.port, body, app.MODELS[model][-1], duration, row.connections)
    figures = result.figures()
    figures |= {"health_p99_us": probe.p99_us(), "health_errors": float(probe.errors)}
    return figures


def _failure(row: _Row) -> str | None:
    """Why ``row``'s figures are not those of a working service (None: they are)."""
    if row.failure:
        return row.failure
    bad = sum(s["bad"] for s in row.samples)
    if bad:
        return f"{bad:.0f} answers were errors (not 503s): another status, a wrong body, or a socket error"
    if not all(s["ok"] > 0 for s in row.samples):
        return "a round had no answer with the model's output"
    return None


def _pick_load(client: str) -> tuple[str, Callable[..., Load]]:
    """The load generator: wrk when asked for or (``auto``) found on PATH, else the asyncio client."""
    wrk = shutil.which("wrk") if client in ("auto", "wrk") else None
    if client == "wrk" and wrk is None:
        raise NeedsExtra("--client wrk: wrk is not on PATH (e.g. apt-get install wrk)")
    if wrk is None:
        return "asyncio", asyncio_load
    version = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False).stdout.split()
    label = f"wrk {version[1]}" if len(version) > 1 else "wrk"
    return label, lambda *args: wrk_load(wrk, *args)


def _require_server_stack() -> None:
    import importlib.util

    missing = [m for m in ("uvicorn", "starlette") if importlib.util.find_spec(m) is None]
    if missing:
        raise NeedsExtra(f"schedsvc bench serve needs {' and '.join(missing)}: pip install 'schedsvc[serve]'")


def variant_problems() -> dict[str, str]:
    """Why a variant cannot run here, by variant (those that can are not named)."""
    import importlib.util

    def missing(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ImportError:  # its parent package is missing
            return True

    problems = {}
    if missing("ray") or missing("ray.serve"):
        problems["ray"] = "ray[serve] is not installed (pip install 'ray[serve]')"
    if missing("threadpoolctl"):
        problems["to_thread_pinned"] = (
            f"threadpoolctl holds BLAS at 1 thread, and is not installed; {CLI_EXTRA}"
        )
    return problems


def plan(
    models: tuple[str, ...],
    variants: tuple[str, ...],
    connections: int,
    overload: bool,
    max_pending: int,
    processes: int = 1,
    cpus: Cores | None = None,
) -> tuple[list[_Row], dict[str, str]]:
    """The report's rows in the order of a round (``none`` first for each model), and the skipped variants;
    each server of ``processes`` processes on ``cpus``."""
    names = ["none", *(v for v in variants if v != "none")]
    problems = variant_problems()
    if processes > 1:
        problems.setdefault("ray", "Ray Serve runs processes of its own: --processes does not apply")
    skipped = {v: why for v, why in problems.items() if v in names}
    names = [v for v in names if v not in skipped]
    rows = [_Row(Server(v, m, processes=processes, cpus=cpus), connections) for m in models for v in names]
    if overload:
        rows += [
            _Row(Server(OVERLOAD, m, max_pending, processes=processes, cpus=cpus), OVERLOAD_CONNECTIONS)
            for m in models
        ]
    return rows, skipped


def run(
    reps: int = 5,
    progress: Callable[[str], None] | None = None,
    *,
    duration: float = 3.0,
    connections: int = 64,
    models: tuple[str, ...] = MODELS,
    variants: tuple[str, ...] = DEFAULT_VARIANTS,
    client: str = "auto",
    overload: bool = False,
    max_pending: int = OVERLOAD_MAX_PENDING,
    processes: int = 1,
    server_cpus: Cores | None = None,
    client_cpus: Cores | None = None,
) -> dict[str, Any]:
    """``reps`` interleaved rounds over every variant and model; the report (medians, counts, failures).

    Each server is ``processes`` processes, pinned to their shares of ``server_cpus``; the load runs on
    ``client_cpus`` (None: not pinned).  ``ValueError`` where there are fewer server cores than processes."""
    _require_server_stack()
    client_label, load = _pick_load(client)
    rows, skipped = plan(models, variants, connections, overload, max_pending, processes, server_cpus)
    phases = [[row for row in rows if row.variant != "ray"]]
    ray = [row for row in rows if row.variant == "ray"]
    if ray:  # Ray's daemons work in the background while its server is up: it is measured apart, against
        # a no-model server of its own, so that it loads none of the other variants' rounds
        base = [Server("none", r.server.model, processes=processes, cpus=server_cpus) for r in ray]
        phases.append([_Row(server, connections, label=RAY_BASE) for server in base] + ray)
    for number, phase in enumerate(phases, 1):
        with running([row.server for row in phase]):
            for row in phase:
                row.failure = check_answer(row.server)
            for rep in range(reps):
                for row in phase:
                    row.samples.append(_measure(row, load, duration, client_cpus))
                _ratios(phase, rep)
                if progress is not None:
                    part = f" (part {number} of {len(phases)})" if len(phases) > 1 else ""
                    progress(f"round {rep + 1}/{reps}{part}")
            for row in phase:
                row.peak_rss_mib = row.server.peak_rss_mib()
    cpus = _cpus(server_shares(server_cpus, processes), client_cpus)
    setup = {"client": client_label, "processes": processes, "cpus": cpus}
    return _report([row for phase in phases for row in phase], skipped, reps, duration, setup, max_pending)


def _cpus(server: list[Cores] | None, client: Cores | None) -> dict[str, Any]:
    """The report's cores: the servers', each process's share of them, the load's (None: not pinned)."""
    shares = [list(share) for share in server] if server is not None else None
    return {
        "server": [c for share in shares for c in share] if shares is not None else None,
        "shares": shares,
        "client": list(client) if client is not None else None,
    }


def _http_parser() -> str:
    """The HTTP parser uvicorn picks (``http="auto"``): httptools where it is installed, else h11."""
    import importlib.util

    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def _described(row: _Row, max_pending: int) -> str:
    if row.label == RAY_BASE:
        return "no model, measured with ray's server up: the base of ray's ratio"
    return app.VARIANTS.get(row.variant, f"batched, max_pending={max_pending}")


def _ratios(rows: list[_Row], rep: int) -> None:
    """Each row's req/s over that of ``none`` serving its model, in round ``rep``."""
    ceiling = {row.server.model: row.samples[rep]["rps"] for row in rows if row.variant == "none"}
    for row in rows:
        base = ceiling[row.server.model]
        row.samples[rep]["ratio"] = row.samples[rep]["rps"] / base if base > 0 else 0.0


def _report(
    rows: list[_Row],
    skipped: dict[str, str],
    reps: int,
    duration: float,
    setup: dict[str, Any],
    max_pending: int,
) -> dict[str, Any]:
    import uvicorn

    results = []
    for row in rows:
        medians = median_figures([{k: s[k] for k in MEDIANS} for s in row.samples])
        results.append(
            {
                "model": row.server.model,
                "variant": row.label or row.variant,
                "connections": row.connections,
                "medians": medians,
                "range": {
                    k: [min(s[k] for s in row.samples), max(s[k] for s in row.samples)] for k in MEDIANS
                },
                "counts": {k: sum(s[k] for s in row.samples) for k in COUNTS},
                "peak_rss_mib": row.peak_rss_mib,
                "failed": _failure(row),
            }
        )
    processes = setup["processes"]
    each = (
        "a process per variant and model"
        if processes == 1
        else f"{processes} processes per variant and model on one socket, an event loop and app each"
    )
    return {
        "rounds": reps,
        "duration_s": duration,
        **setup,
        "server": f"uvicorn {uvicorn.__version__} ({_http_parser()}, asyncio's own event loop), Starlette, "
        f"127.0.0.1, {each}",
        "models": {
            m: "-".join(map(str, app.MODELS[m])) + ", ReLU, float32"
            for m in dict.fromkeys(r.server.model for r in rows)
        },
        "variants": {(r.label or r.variant): _described(r, max_pending) for r in rows},
        "results": results,
        "skipped": skipped,
        "failed": [f"{r['model']}/{r['variant']}" for r in results if r["failed"]],
    }


# -- the report ----------------------------------------------------------------------------------------------


def _row_cells(r: dict[str, Any]) -> list[str]:
    m, c = r["medians"], r["counts"]
    rss = f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] is not None else "-"
    if r["failed"]:
        speed = ["FAILED", "-", "-", "-"]
    else:
        speed = [f"{m['rps']:,.0f}", f"{m['ratio']:.2f}x", f"{m['p50_us']:,.0f}", f"{m['p99_us']:,.0f}"]
    return [
        r["model"],
        r["variant"],
        str(r["connections"]),
        *speed,
        f"{m['health_p99_us']:,.0f}",
        f"{c['errors']:,.0f}",
        f"{c['status_503']:,.0f}",
        rss,
    ]


def _right_aligned(headers: list[str], rows: list[list[str]], first: int) -> list[list[str]]:
    """The cells of every column from ``first`` on padded on the left to the column's width (numbers)."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return [
        row[:first] + [cell.rjust(w) for cell, w in zip(row[first:], widths[first:], strict=True)]
        for row in rows
    ]


def _cores_line(report: dict[str, Any]) -> str:
    """Where the servers and the load ran: ``cores: server 0-1 (2 processes, on 0 | 1); load and ... 1``."""
    cpus, processes = report["cpus"], report["processes"]
    if cpus["server"] is None and cpus["client"] is None:
        return "  cores: not pinned"
    server = "not pinned" if cpus["server"] is None else format_cpu_list(cpus["server"])
    if processes > 1:
        server += f" ({processes} processes, on {' | '.join(map(format_cpu_list, cpus['shares']))})"
    client = "not pinned" if cpus["client"] is None else format_cpu_list(cpus["client"])
    return f"  cores: server {server}; load and health probe {client}"


def format_report(report: dict[str, Any]) -> str:
    headers = ["model", "variant", "conns", "req/s", "x none", "p50 us", "p99 us", "health p99 us"]
    headers += ["errors", "503s", "peak RSS MiB"]
    rows = [_row_cells(r) for r in report["results"]]
    lines = [
        f"schedsvc bench serve: {runs_phrase(report['rounds'])} (rounds interleaved), "
        f"{report['duration_s']:g} s of load each, {report['client']}; {report['server']}",
        _cores_line(report),
        *(f"  model {m}: {desc}" for m, desc in report["models"].items()),
        "  req/s: answers with the model's output per second; x none: over the no-model server's, same round;",
        "  health p99: GET /health every 20 ms meanwhile; errors: all not-good answers, 503s among them;",
        "  errors and 503s summed over the rounds",
        text_table(headers, _right_aligned(headers, rows, first=2)),
    ]
    lines += [f"  {v}: skipped: {why}" for v, why in report["skipped"].items()]
    lines += [
        f"  {r['model']}/{r['variant']}: FAILED: {r['failed']}" for r in report["results"] if r["failed"]
    ]
    return "\n".join(lines)
