"""The client side of ``schedsvc bench serve``: the load generators (wrk with a Lua script, or asyncio
streams) and the health probe.

Both generators keep ``connections`` connections busy POSTing one JSON row to ``/predict`` for a fixed time
and count the answers: good (2xx with the model's output shape), 503, another status, a 2xx whose body is
not the output's shape, socket errors; with the latencies' p50 and p99.  wrk is Debian's wrk 4 (its
``done(summary, latency, requests)`` hook prints the figures; it takes whole seconds).  The asyncio client
runs in the bench's own process: its figures include that process's own overhead.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .._common import Figures

__all__ = [
    "HEALTH_INTERVAL_S",
    "HealthProbe",
    "Load",
    "ServeError",
    "asyncio_load",
    "parse_wrk",
    "wrk_load",
    "wrk_script",
]

HOST = "127.0.0.1"
#: seconds between two health probes, and the most one waits for its answer
HEALTH_INTERVAL_S = 0.02
HEALTH_TIMEOUT_S = 5.0
#: seconds one request may take before it counts as a timeout
REQUEST_TIMEOUT_S = 10.0
#: seconds the asyncio client waits after a socket error before it connects again
RECONNECT_PAUSE_S = 0.01


class ServeError(Exception):
    """A server did not start, or a load generator failed; the message says which and why."""


# -- the health probe ----------------------------------------------------------------------------------------


class HealthProbe:
    """A thread that GETs ``/health`` every ``HEALTH_INTERVAL_S`` on a connection of its own while the load
    runs; an unanswered probe counts as an error and as ``HEALTH_TIMEOUT_S`` of latency."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="health-probe", daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(HEALTH_TIMEOUT_S + 1)

    def p99_us(self) -> float:
        return float(np.percentile(self.latencies, 99) * 1e6) if self.latencies else 0.0

    def _probe(self) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=HEALTH_TIMEOUT_S)
        tick = time.perf_counter()
        while not self._stop.wait(max(0.0, tick - time.perf_counter())):
            tick += HEALTH_INTERVAL_S
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()  # reconnects at the next request
            if ok:
                self.latencies.append(time.perf_counter() - t0)
            else:
                self.errors += 1
                self.latencies.append(HEALTH_TIMEOUT_S)
            tick = max(tick, time.perf_counter())
        conn.close()


# -- the load: wrk -------------------------------------------------------------------------------------------


@dataclass
class Load:
    """What one load run measured: counts of answers, the latencies' percentiles, its seconds."""

    seconds: float
    requests: int
    ok: int
    status_503: int
    other_status: int
    bad: int
    socket_errors: int
    p50_us: float
    p99_us: float

    def figures(self) -> Figures:
        errors = self.requests - self.ok + self.socket_errors
        return {
            "rps": self.ok / self.seconds if self.seconds > 0 else 0.0,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "requests": float(self.requests),
            "ok": float(self.ok),
            "errors": float(errors),
            "status_503": float(self.status_503),
            "bad": float(self.other_status + self.bad + self.socket_errors),
        }


def wrk_script(body: bytes, n_out: int) -> str:
    """The Lua script of wrk: POST ``body`` each time; count answers by status (503, other non-2xx, 2xx whose
    body is not ``{"y":[n_out numbers]}``, good); at the end print one ``schedsvc-wrk`` line of figures."""
    lua_body = body.decode().replace("\\", "\\\\").replace("'", "\\'")
    return f"""\
wrk.method = "POST"
wrk.body = '{lua_body}'
wrk.headers["Content-Type"] = "application/json"
local commas = {n_out - 1}
local threads = {{}}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  ok, s503, other, bad = 0, 0, 0, 0
end

function response(status, headers, body)
  if status == 503 then
    s503 = s503 + 1
  elseif status < 200 or status > 299 then
    other = other + 1
  elseif body:sub(1, 6) ~= '{{"y":[' or body:sub(-2) ~= ']}}' or select(2, body:gsub(",", ",")) ~= commas then
    bad = bad + 1
  else
    ok = ok + 1
  end
end

function done(summary, latency, requests)
  local n = {{ok = 0, s503 = 0, other = 0, bad = 0}}
  for _, thread in ipairs(threads) do
    for k, _ in pairs(n) do
      n[k] = n[k] + thread:get(k)
    end
  end
  local e = summary.errors
  io.write(string.format(
    "schedsvc-wrk requests=%d duration_us=%d p50_us=%.1f p99_us=%.1f connect=%d read=%d write=%d timeout=%d " ..
    "ok=%d s503=%d other=%d bad=%d\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.timeout, n.ok, n.s503, n.other, n.bad))
end
"""


def parse_wrk(output: str) -> Load:
    """The figures of the ``schedsvc-wrk`` line that ``wrk_script``'s ``done`` prints."""
    for line in output.splitlines():
        if line.startswith("schedsvc-wrk "):
            values = {k: float(v) for k, v in (item.split("=", 1) for item in line.split()[1:])}
            break
    else:
        raise ServeError(f"wrk printed no figures:\n{output[-2000:]}")
    return Load(
        seconds=values["duration_us"] / 1e6,
        requests=int(values["requests"]),
        ok=int(values["ok"]),
        status_503=int(values["s503"]),
        other_status=int(values["other"]),
        bad=int(values["bad"]),
        socket_errors=int(sum(values[k] for k in ("connect", "read", "write", "timeout"))),
        p50_us=values["p50_us"],
        p99_us=values["p99_us"],
    )


def wrk_load(wrk: str, port: int, body: bytes, n_out: int, duration: float, connections: int) -> Load:
    """``connections`` connections of wrk POSTing ``body`` for ``duration`` s (whole seconds, rounded up).

    wrk starts on the cores the calling thread may run on (it inherits them: the bench pins that thread to
    the client's cores), with a thread per core of those, at most 4."""
    seconds = max(1, math.ceil(duration))
    threads = max(1, min(connections, len(os.sched_getaffinity(0)), 4))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(wrk_script(body, n_out))
    try:
        cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", f"--timeout={REQUEST_TIMEOUT_S:g}s"]
        cmd += ["-s", script.name, f"http://{HOST}:{port}/predict"]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=seconds + REQUEST_TIMEOUT_S + 30, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ServeError(f"wrk did not finish within {exc.timeout:g} s") from exc
    finally:
        os.unlink(script.name)
    if done.returncode != 0:
        raise ServeError(f"wrk failed (exit status {done.returncode}): {done.stderr.strip()[-2000:]}")
    return parse_wrk(done.stdout)


# -- the load: asyncio streams -------------------------------------------------------------------------------


@dataclass
class _Tally:
    n_out: int
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    status_503: int = 0
    other_status: int = 0
    bad: int = 0
    socket_errors: int = 0

    def answer(self, status: int, body: bytes) -> None:
        if status == 503:
            self.status_503 += 1
        elif not 200 <= status <= 299:
            self.other_status += 1
        elif self.good(body):
            self.ok += 1
        else:
            self.bad += 1

    def good(self, body: bytes) -> bool:
        """Is ``body`` ``{"y": [n_out finite numbers]}``?"""
        try:
            y = json.loads(body)["y"]
        except (ValueError, KeyError, TypeError):
            return False
        return (
            isinstance(y, list)
            and len(y) == self.n_out
            and all(isinstance(v, float | int) and math.isfinite(v) for v in y)
        )


def _http_request(port: int, body: bytes) -> bytes:
    head = (
        f"POST /predict HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """Status, Content-Length, and whether the server closes the connection, from a response's head."""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    if "content-length" not in headers:
        raise ValueError("an answer without Content-Length")
    return status, int(headers["content-length"]), headers.get("connection", "").lower() == "close"


async def _connection(port: int, request: bytes, deadline: float, tally: _Tally) -> None:
    """One connection sending ``request`` again as soon as each answer is in, until ``deadline``; a socket
    error is counted, and the connection made again after a short pause."""
    writer: asyncio.StreamWriter | None = None
    try:
        while time.perf_counter() < deadline:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(HOST, port)
                t0 = time.perf_counter()
                writer.write(request)
                status, length, close = _parse_head(await reader.readuntil(b"\r\n\r\n"))
                body = await reader.readexactly(length)
                tally.latencies.append(time.perf_counter() - t0)
                tally.answer(status, body)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
                tally.socket_errors += 1
                close = True
                await asyncio.sleep(
                    RECONNECT_PAUSE_S
                )  # a server that is gone: no busy loop until the deadline
            if close and writer is not None:
                writer.close()
                writer = None
    finally:  # the deadline, or cancelled by the load's own timeout
        if writer is not None:
            writer.close()


async def _asyncio_load(port: int, body: bytes, n_out: int, duration: float, connections: int) -> Load:
    tally = _Tally(n_out)
    request = _http_request(port, body)
    t0 = time.perf_counter()
    clients = [_connection(port, request, t0 + duration, tally) for _ in range(connections)]
    try:
        await asyncio.wait_for(asyncio.gather(*clients), duration + REQUEST_TIMEOUT_S)
    except TimeoutError:  # the connections still waiting for an answer: one timeout each
        tally.socket_errors += connections
    seconds = time.perf_counter() - t0
    p50, p99 = np.percentile(tally.latencies, [50, 99]) * 1e6 if tally.latencies else (0.0, 0.0)
    return Load(
        seconds=seconds,
        requests=len(tally.latencies),
        ok=tally.ok,
        status_503=tally.status_503,
        other_status=tally.other_status,
        bad=tally.bad,
        socket_errors=tally.socket_errors,
        p50_us=float(p50),
        p99_us=float(p99),
    )


def asyncio_load(port: int, body: bytes, n_out: int, duration: float, connections: int) -> Load:
    """``connections`` connections of asyncio streams in this process POSTing ``body`` for ``duration`` s;
    each answer's body is checked to be the model's output shape."""
    return asyncio.run(_asyncio_load(port, body, n_out, duration, connections))
