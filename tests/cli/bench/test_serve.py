"""``schedsvc bench serve``: real servers under real HTTP load, every answer counted and checked."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from schedsvc.cli import main
from schedsvc.cli.bench import _serve_procs, serve

WRK = shutil.which("wrk")
needs_wrk = pytest.mark.skipif(WRK is None, reason="wrk is not on PATH")
TINY = ["--duration", "0.5", "--rounds", "1", "--connections", "4", "--model", "digits"]
FIGURES = {"rps", "p50_us", "p99_us", "health_p99_us", "ratio"}

WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:40000/predict
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.02ms  211.00us   4.20ms   90.00%
  4170 requests in 1.00s, 0.73MB read
  Non-2xx or 3xx responses: 12
schedsvc-wrk requests=4170 duration_us=1000500 p50_us=950.0 p99_us=2215.5 connect=0 read=1 write=0 timeout=2 \
ok=4150 s503=12 other=3 bad=5
Requests/sec:   4167.92
"""


def _bench(tmp_path: Path, *options: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "serve.json"
    status = main(["bench", "serve", *TINY, *options, "--json", str(out)])
    return status, json.loads(out.read_text())


def _check_working(result: dict[str, Any]) -> None:
    """A variant that served every request with the model's output."""
    assert result["failed"] is None
    assert set(result["medians"]) == FIGURES
    m, c = result["medians"], result["counts"]
    assert m["rps"] > 0 and 0 < m["p50_us"] <= m["p99_us"] and m["health_p99_us"] > 0 and m["ratio"] > 0
    assert c["ok"] == c["requests"] > 0
    assert c["errors"] == c["status_503"] == c["bad"] == c["health_errors"] == 0
    assert result["peak_rss_mib"] > 0


@pytest.mark.slow
@needs_wrk
def test_bench_serve_under_wrk_measures_each_variant_against_none(tmp_path: Path) -> None:
    status, report = _bench(tmp_path, "--variants", "inline,batched", "--overload", "--max-pending", "8")
    assert status == 0
    assert report["client"].startswith("wrk")
    assert report["failed"] == []
    rows = {r["variant"]: r for r in report["results"]}
    assert list(rows) == ["none", "inline", "batched", "overload"]  # none added, first: the ratios' base
    for variant in ("none", "inline", "batched"):
        _check_working(rows[variant])
        assert rows[variant]["connections"] == 4
    assert rows["none"]["medians"]["ratio"] == 1.0
    overload = rows["overload"]
    assert overload["connections"] == serve.OVERLOAD_CONNECTIONS
    assert overload["failed"] is None
    c = overload["counts"]
    assert c["errors"] == c["status_503"] and c["bad"] == 0  # refused with 503s, nothing else went wrong
    assert c["ok"] > 0 and overload["peak_rss_mib"] > 0
    assert report["variants"]["overload"] == "batched, max_pending=8"


@pytest.mark.slow
def test_bench_serve_with_the_asyncio_client_checks_every_body(tmp_path: Path) -> None:
    status, report = _bench(tmp_path, "--variants", "none,to_thread,submit,handmade", "--client", "asyncio")
    assert status == 0
    assert report["client"] == "asyncio"
    assert [r["variant"] for r in report["results"]] == ["none", "to_thread", "submit", "handmade"]
    for result in report["results"]:
        _check_working(result)


@pytest.mark.slow
def test_a_variant_whose_answers_are_errors_is_reported_as_failed_never_as_fast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(serve.app, "request_row", lambda model: [1.0, 2.0, 3.0])  # not a row: 400s
    status, report = _bench(tmp_path, "--variants", "none", "--client", "asyncio")
    assert status == 1
    (result,) = report["results"]
    assert result["failed"].startswith("a first request was answered 400")
    assert result["counts"]["ok"] == 0 and result["counts"]["errors"] == result["counts"]["requests"] > 0
    assert report["failed"] == ["digits/none"]
    main(["bench", "serve", *TINY, "--variants", "none", "--client", "asyncio"])
    table = capsys.readouterr().out
    assert "digits  none         4  FAILED" in table
    assert "digits/none: FAILED: a first request was answered 400" in table


def test_bench_serve_skips_ray_where_it_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(serve, "variant_problems", lambda: {"ray": "ray[serve] is not installed"})
    rows, skipped = serve.plan(("digits",), ("ray", "inline"), connections=4, overload=False, max_pending=8)
    assert [(r.server.model, r.variant) for r in rows] == [("digits", "none"), ("digits", "inline")]
    assert skipped == {"ray": "ray[serve] is not installed"}


@needs_wrk
def test_ray_is_measured_apart_beside_a_no_model_server_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray's daemons work while its server is up: no other variant's round may run beside it.  (ray itself
    # is stood in for by the inline app here: the phases are what is tested.)
    monkeypatch.setattr(serve, "variant_problems", dict)
    up: list[str] = []
    phases: list[list[str]] = []
    start, stop = serve.Server.start, serve.Server.stop

    def start_as(server: serve.Server) -> None:
        up.append(server.variant)
        variant = server.variant
        server.variant = "inline" if variant == "ray" else variant
        try:
            start(server)
        finally:
            server.variant = variant

    def stop_and_note(server: serve.Server) -> None:
        if up:
            phases.append(sorted(up))
            up.clear()
        stop(server)

    monkeypatch.setattr(serve.Server, "start", start_as)
    monkeypatch.setattr(serve.Server, "stop", stop_and_note)
    report = serve.run(
        1, duration=0.5, connections=4, models=("digits",), variants=("inline", "ray"), client="wrk"
    )
    assert phases == [["inline", "none"], ["none", "ray"]]  # never ray beside inline
    rows = [(r["variant"], r["failed"]) for r in report["results"]]
    assert rows == [("none", None), ("inline", None), (serve.RAY_BASE, None), ("ray", None)]
    base, ray = report["results"][2:]
    assert base["medians"]["ratio"] == 1.0  # its own base
    assert ray["medians"]["ratio"] > 0


def test_bench_serve_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", "--variants", "inline,nope"]) == 2
    assert "unknown variants ['nope']" in capsys.readouterr().err
    assert main(["bench", "serve", "--duration", "0"]) == 2
    assert "--duration must be more than 0" in capsys.readouterr().err
    assert main(["bench", "serve", "--max-pending", "8"]) == 2
    assert "--max-pending applies to the overload server" in capsys.readouterr().err
    assert main(["bench", "core", "--connections", "4"]) == 2
    assert "--connections applies to the serve suite only" in capsys.readouterr().err


# -- --cpus and --processes: cores, and servers of several processes -------------------------------------

CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="this process may run on one core only")


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), (" 3,1,1-2 ", (1, 2, 3)), ("4-4", (4,))],
)
def test_cpu_lists_are_read_in_the_linux_syntax(text: str, cores: tuple[int, ...]) -> None:
    assert _serve_procs.parse_cpu_list(text) == cores
    assert _serve_procs.parse_cpu_list(_serve_procs.format_cpu_list(cores)) == cores


def test_cpu_lists_are_written_with_ranges() -> None:
    assert _serve_procs.format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert _serve_procs.format_cpu_list([4]) == "4"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the cpu list is empty"),
        ("0-", "'0-' is not a core or a range of cores (e.g. 0-3,8,10-11)"),
        ("0,,1", "'' is not a core or a range of cores"),
        ("-1", "'-1' is not a core or a range of cores"),
        ("a", "'a' is not a core or a range of cores"),
        ("3-1", "the range '3-1' goes down: write it 1-3"),
        ("0-99999999", "no machine has a core 99999999"),
    ],
)
def test_bad_cpu_lists_are_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _serve_procs.parse_cpu_list(text)


def test_the_cpus_option_gives_the_servers_and_the_loads_cores() -> None:
    allowed = (0, 1, 2, 3, 4, 5, 6, 7)
    assert serve.parse_cpus("0-5:6,7", allowed) == ((0, 1, 2, 3, 4, 5), (6, 7))
    assert serve.parse_cpus("0,1", allowed) == ((0, 1), (0, 1))  # one list: both share it
    refusals = {
        "0-8:1": "--cpus '0-8:1': this process may not run on core 8; it may run on 0-7",
        "0:9-10": "--cpus '0:9-10': this process may not run on cores 9-10; it may run on 0-7",
        "0:": "--cpus '0:': the client's cpu list is empty",
        ":0": "--cpus ':0': the server's cpu list is empty",
        "0:x": "--cpus '0:x': the client's cpu list: 'x' is not a core or a range of cores",
        "0:1:2": "--cpus '0:1:2': give one cpu list, or SERVER:CLIENT (e.g. 0-7:8-15)",
    }
    for text, message in refusals.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            serve.parse_cpus(text, allowed)


def test_the_server_cores_are_split_in_contiguous_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve.split_cores((0, 1, 2, 3, 4, 5, 6, 7), 2) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert serve.split_cores((0, 1, 2, 3, 8), 3) == [(0, 1), (2, 3), (8,)]  # sizes at most one apart
    assert serve.split_cores((2, 5), 2) == [(2,), (5,)]
    assert serve.split_cores((0, 1, 2), 1) == [(0, 1, 2)]
    with pytest.raises(ValueError, match="2 cores cannot be split in 3 shares"):
        serve.split_cores((0, 1), 3)
    assert serve.server_shares(None, 1) is None  # one process, no cores given: nothing pinned
    assert serve.server_shares((4, 5), 1) == [(4, 5)]
    monkeypatch.setattr(_serve_procs, "allowed_cores", lambda: (0, 1, 2))
    assert serve.server_shares(None, 2) == [(0, 1), (2,)]  # several processes: this process's cores split
    with pytest.raises(ValueError, match=re.escape("--processes 4 is more than the server's 3 cores (0-2)")):
        serve.server_shares(None, 4)
    with pytest.raises(ValueError, match="--processes must be at least 1"):
        serve.server_shares((0,), 0)


def test_bench_serve_refuses_bad_cpus_and_processes(capsys: pytest.CaptureFixture[str]) -> None:
    outside = max(CORES) + 1
    refusals = {
        (
            "--cpus",
            str(outside),
        ): f"--cpus '{outside}': this process may not run on core {outside}; it may run on",
        ("--cpus", ""): "--cpus '': the cpu list is empty",
        ("--cpus", "0:"): "--cpus '0:': the client's cpu list is empty",
        ("--cpus", "0-x"): "--cpus '0-x': '0-x' is not a core or a range of cores (e.g. 0-3,8,10-11)",
        ("--processes", "0"): "--processes must be at least 1",
        ("--processes", str(len(CORES) + 1)): f"--processes {len(CORES) + 1} is more than the server's",
        ("--cpus", str(CORES[0]), "--processes", "2"): "--processes 2 is more than the server's 1 core",
    }
    for options, message in refusals.items():
        assert main(["bench", "serve", *options]) == 2
        err = capsys.readouterr().err
        assert err.startswith("schedsvc bench serve: ") and message in err, (options, err)
    for option in ("--cpus", "--processes"):
        assert main(["bench", "core", option, "1"]) == 2
        assert f"{option} applies to the serve suite only" in capsys.readouterr().err


def test_the_server_process_refuses_more_processes_than_cores(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        serve.app.main(["none", "digits", "--cpus", "0", "--processes", "2"])
    assert exited.value.code == 2
    assert "--processes 2 is more than the server's 1 core (0)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve.app.main(["none", "digits", "--cpus", "2-1"])
    assert "the range '2-1' goes down" in capsys.readouterr().err


def _alive(pid: int) -> bool:
    """Is ``pid`` a process that still runs (not gone, not a zombie waiting for its parent)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if _alive(p)]}"
        time.sleep(0.02)


def _answering_pids(port: int, want: int, timeout: float = 10.0) -> set[int]:
    """The pids in the answers to ``GET /health`` on fresh connections, until ``want`` of them answered."""
    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(pids) < want and time.monotonic() < deadline:
        conns = [http.client.HTTPConnection(serve.app.HOST, port, timeout=5) for _ in range(8)]
        try:
            for conn in conns:  # all connected before any asks: the kernel hands them to waiting processes
                conn.connect()
            for conn in conns:
                conn.request("GET", "/health")
                response = conn.getresponse()
                assert response.read() == b"ok"
                pids.add(int(response.headers["X-Pid"]))
        finally:
            for conn in conns:
                conn.close()
    return pids


@needs_two_cores
def test_a_server_of_two_processes_answers_from_each_on_its_cores_and_leaves_none() -> None:
    a, b = CORES[:2]
    server = serve.Server("batched", "digits", processes=2, cpus=(a, b))
    assert server.command()[-4:] == ["--cpus", _serve_procs.format_cpu_list((a, b)), "--processes", "2"]
    with serve.running([server]):
        assert server.proc is not None
        assert len(server.pids) == 2 and server.pids[0] == server.proc.pid
        assert [os.sched_getaffinity(pid) for pid in server.pids] == [{a}, {b}]
        assert _answering_pids(server.port, 2) == set(server.pids)
        assert serve.check_answer(server) is None
        assert server.peak_rss_mib() is not None
    _wait_gone(server.pids)


@needs_two_cores
def test_the_other_processes_of_a_server_stop_when_the_first_is_killed() -> None:
    server = serve.Server("none", "digits", processes=2)
    with serve.running([server]):
        assert server.proc is not None
        server.proc.kill()
        server.proc.wait()
        _wait_gone(server.pids[1:])  # no orphan: it saw that its parent is gone


@needs_two_cores
def test_a_server_of_two_processes_stops_whole_when_its_bench_is_killed() -> None:
    bench = (
        "import time; from schedsvc.cli.bench import serve; "
        "s = serve.Server('none', 'digits', processes=2); s.start(); s.wait_ready(time.monotonic() + 60); "
        "print(*s.pids, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", bench], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        pids = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    _wait_gone(pids)  # the first saw its bench gone and stopped the other


@pytest.mark.slow
@needs_two_cores
def test_bench_serve_with_two_processes_on_chosen_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = CORES[:2]
    served: list[tuple[str, set[int], list[int]]] = []
    loads: list[set[int]] = []
    stop, asyncio_load = serve.Server.stop, serve.asyncio_load

    def stop_after_asking(server: serve.Server) -> None:
        if server.port:  # it started: which of its processes answer, before it stops
            served.append((server.variant, _answering_pids(server.port, 2), list(server.pids)))
        stop(server)

    def load_noting_its_cores(*args: Any) -> serve.Load:
        loads.append(os.sched_getaffinity(0))
        return asyncio_load(*args)

    monkeypatch.setattr(serve.Server, "stop", stop_after_asking)
    monkeypatch.setattr(serve, "asyncio_load", load_noting_its_cores)
    before = os.sched_getaffinity(0)
    options = ["--variants", "none,batched,handmade", "--client", "asyncio", "--processes", "2"]
    status, report = _bench(tmp_path, *options, "--cpus", f"{a},{b}:{b}")
    assert status == 0, report["failed"]
    assert os.sched_getaffinity(0) == before  # the bench's own thread is unpinned after the load
    assert report["processes"] == 2
    assert report["cpus"] == {"server": [a, b], "shares": [[a], [b]], "client": [b]}
    assert [r["variant"] for r in report["results"]] == ["none", "batched", "handmade"]
    for result in report["results"]:
        _check_working(result)
    assert loads == [{b}] * 3  # the client ran on its cores
    assert [variant for variant, _, _ in served] == ["none", "batched", "handmade"]
    for _, answering, pids in served:
        assert len(pids) == 2 and answering == set(pids)  # both processes served
    _wait_gone([pid for _, _, pids in served for pid in pids])
    text = serve.format_report(report)
    assert "2 processes per variant and model on one socket" in text
    both = _serve_procs.format_cpu_list((a, b))
    assert f"  cores: server {both} (2 processes, on {a} | {b}); load and health probe {b}" in text


@needs_wrk
def test_wrk_runs_on_the_clients_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server, client = CORES[0], CORES[-1]
    loads: list[set[int]] = []
    wrk_load = serve.wrk_load

    def load_noting_its_cores(*args: Any) -> serve.Load:
        loads.append(os.sched_getaffinity(0))  # the thread that starts wrk: wrk inherits its cores at fork
        return wrk_load(*args)

    monkeypatch.setattr(serve, "wrk_load", load_noting_its_cores)
    status, report = _bench(tmp_path, "--variants", "none", "--client", "wrk", "--cpus", f"{server}:{client}")
    assert status == 0
    assert report["processes"] == 1
    assert report["cpus"] == {"server": [server], "shares": [[server]], "client": [client]}
    assert loads == [{client}]
    _check_working(report["results"][0])


# -- the load generators, against a server of the bench ---------------------------------------------------


@pytest.fixture(scope="module")
def none_server() -> Iterator[serve.Server]:
    with serve.running([serve.Server("none", "digits")]) as (server,):
        yield server


def _body(n: int = 64) -> bytes:
    return json.dumps({"x": [1.0] * n}).encode()


LOADS = [
    pytest.param("wrk", marks=needs_wrk),
    pytest.param("asyncio"),
]


def _load(client: str, server: serve.Server, body: bytes, n_out: int) -> serve.Load:
    if client == "wrk":
        assert WRK is not None
        return serve.wrk_load(WRK, server.port, body, n_out, 0.3, 2)
    return serve.asyncio_load(server.port, body, n_out, 0.3, 2)


@pytest.mark.parametrize("client", LOADS)
def test_a_load_counts_the_answers_of_the_model_shape_as_good(client: str, none_server: serve.Server) -> None:
    load = _load(client, none_server, _body(), 10)
    assert load.requests > 0 and load.ok == load.requests
    assert load.status_503 == load.other_status == load.bad == load.socket_errors == 0
    assert 0 < load.p50_us <= load.p99_us and load.seconds > 0


@pytest.mark.parametrize("client", LOADS)
def test_a_load_counts_answers_of_another_shape_as_bad(client: str, none_server: serve.Server) -> None:
    load = _load(client, none_server, _body(), 5)  # the server answers 10 numbers
    assert load.requests > 0 and load.bad == load.requests and load.ok == 0
    assert load.figures()["rps"] == 0  # never fast


@pytest.mark.parametrize("client", LOADS)
def test_a_load_counts_other_statuses_as_errors(client: str, none_server: serve.Server) -> None:
    load = _load(client, none_server, _body(3), 10)  # a row of 3, not 64: 400s
    assert load.requests > 0 and load.other_status == load.requests and load.ok == 0
    assert load.figures()["errors"] == load.requests


def test_a_server_that_fails_to_start_is_an_error_with_its_words() -> None:
    with (
        pytest.raises(serve.ServeError, match="failed to start") as caught,
        serve.running([serve.Server("submit", "digits", max_pending=0)]),
    ):
        pass
    assert "max_pending" in str(caught.value)


def test_a_server_that_does_not_start_in_time_is_an_error_and_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serve, "STARTUP_TIMEOUT_S", 0.001)
    server = serve.Server("none", "digits")
    with pytest.raises(serve.ServeError, match="did not start within"), serve.running([server]):
        pass
    assert server.proc is not None and server.proc.returncode is not None


def test_the_servers_are_stopped_when_the_bench_is_interrupted(none_server: serve.Server) -> None:
    servers = [serve.Server("none", "digits"), serve.Server("inline", "digits")]
    with pytest.raises(KeyboardInterrupt), serve.running(servers):
        assert all(s.proc is not None and s.proc.poll() is None for s in servers)
        raise KeyboardInterrupt
    assert all(s.proc is not None and s.proc.returncode is not None for s in servers)


def test_wrk_output_is_parsed() -> None:
    load = serve.parse_wrk(WRK_OUTPUT)
    assert load == serve.Load(
        seconds=1.0005,
        requests=4170,
        ok=4150,
        status_503=12,
        other_status=3,
        bad=5,
        socket_errors=3,
        p50_us=950.0,
        p99_us=2215.5,
    )
    figures = load.figures()
    assert figures["rps"] == pytest.approx(4150 / 1.0005)
    assert figures["errors"] == 4170 - 4150 + 3 and figures["bad"] == 3 + 5 + 3


def test_wrk_output_without_figures_is_an_error() -> None:
    with pytest.raises(serve.ServeError, match="wrk printed no figures"):
        serve.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_the_wrk_script_posts_the_row_and_checks_the_shape() -> None:
    script = serve.wrk_script(b'{"x":[1.0,2.0]}', 10)
    assert "wrk.body = '{\"x\":[1.0,2.0]}'" in script
    assert "local commas = 9" in script
    assert "function done(summary, latency, requests)" in script


# -- the hand-written batcher the engine is measured against ------------------------------------------------


async def test_the_handmade_batcher_gives_each_caller_its_rows_of_one_run() -> None:
    runs: list[int] = []
    forward = serve.app.make_forward("digits")

    def counted(x: Any) -> Any:
        runs.append(len(x))
        return forward(x)

    batcher = serve.app.HandBatcher(counted)
    rows = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    with batcher.ready:  # the thread cannot take a call until all five are queued: one run of 5 rows
        batcher.start()
        calls = [asyncio.ensure_future(batcher(rows[i : i + 1])) for i in range(5)]
        await asyncio.sleep(0)  # each call queues its row (the lock is reentrant: same thread)
        assert len(batcher.queue) == 5
    try:
        outs = await asyncio.wait_for(asyncio.gather(*calls), 10)
    finally:
        batcher.stop()
    assert runs == [5]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, forward(rows)[i : i + 1])
    assert batcher.thread is not None and not batcher.thread.is_alive()


async def test_the_handmade_batcher_hands_a_runs_error_to_each_caller() -> None:
    def broken(x: Any) -> Any:
        raise ValueError("no model")

    batcher = serve.app.HandBatcher(broken)
    batcher.start()
    try:
        row = np.zeros((1, 64), np.float32)
        results = await asyncio.wait_for(
            asyncio.gather(batcher(row), batcher(row), return_exceptions=True), 10
        )
    finally:
        batcher.stop()
    assert [type(r) for r in results] == [ValueError, ValueError]


async def test_the_handmade_batcher_gives_a_caller_of_several_rows_all_of_them() -> None:
    batcher = serve.app.HandBatcher(lambda x: x * 10)
    two, one = np.array([[1.0], [2.0]]), np.array([[3.0]])
    with batcher.ready:  # both queued before the thread takes them: one run of 3 rows
        batcher.start()
        calls = [asyncio.ensure_future(batcher(two)), asyncio.ensure_future(batcher(one))]
        await asyncio.sleep(0)
        assert len(batcher.queue) == 2
    try:
        outs = await asyncio.wait_for(asyncio.gather(*calls), 10)
    finally:
        batcher.stop()
    np.testing.assert_array_equal(outs[0], [[10.0], [20.0]])
    np.testing.assert_array_equal(outs[1], [[30.0]])


async def test_the_handmade_batchers_queued_calls_fail_when_it_stops() -> None:
    running, release = threading.Event(), threading.Event()

    def held(x: Any) -> Any:
        running.set()
        assert release.wait(10)
        return x

    batcher = serve.app.HandBatcher(held)
    batcher.start()
    row = np.zeros((1, 4))
    first = asyncio.ensure_future(batcher(row))
    assert await asyncio.to_thread(running.wait, 10)  # the thread runs the first call's batch
    second = asyncio.ensure_future(batcher(row))
    await asyncio.sleep(0)  # queued behind it
    assert len(batcher.queue) == 1
    batcher.close()
    release.set()
    await asyncio.wait_for(asyncio.to_thread(batcher.stop), 10)
    np.testing.assert_array_equal(await asyncio.wait_for(first, 10), row)  # the batch it ran is answered
    with pytest.raises(RuntimeError, match="stopped before this call ran"):
        await asyncio.wait_for(second, 10)
    with pytest.raises(RuntimeError, match="the batcher is stopped"):
        await batcher(row)


# -- scripts/serve_path.py: the loop's cost per request, in process ----------------------------------------

SERVE_PATH = Path(__file__).resolve().parents[3] / "scripts" / "serve_path.py"


def _serve_path(*args: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SERVE_PATH), *args, "--concurrent", "4", "--requests", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_serve_path_times_the_loop_per_request() -> None:
    out = _serve_path("time", "batched", "digits", "--rounds", "2")
    assert out.startswith("16 requests x 2 rounds, 4 at a time: wall ")
    assert "µs/request" in out and "loop CPU" in out


@pytest.mark.slow
def test_serve_path_counts_the_engines_bytecodes_on_the_loop_and_the_workers() -> None:
    lines = _serve_path("ops", "batched", "digits", "--top", "2").splitlines()
    loop, workers = lines[0], lines[3]
    assert loop.startswith("loop: ") and workers.startswith("workers: ")
    engine_on_loop = int(loop.split(", ")[1].split()[0].replace(",", ""))
    assert engine_on_loop > 100  # a batched call is a task of the engine: admitted, awaited, woken
    none = _serve_path("ops", "none", "digits", "--top", "1").splitlines()
    assert none[0].endswith(", 0 in the engine's modules, 0 run for the engine") and none[2].startswith(
        "workers: 0 bytecodes"
    )


# -- scripts/serve_ops.py: a served request's bytecodes under wrk -----------------------------------------

SERVE_OPS = Path(__file__).resolve().parents[3] / "scripts" / "serve_ops.py"


def _script_lines(script: Path, *args: str) -> list[str]:
    """What ``python script *args`` prints, once it has exited 0 (within 3 minutes)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.slow
@needs_wrk
def test_serve_ops_counts_each_variants_bytecodes_per_answered_request_under_wrk() -> None:
    options = ["--seconds", "1", "--connections", "4", "--top", "3"]
    lines = _script_lines(SERVE_OPS, "run", "digits", "none", "batched", *options)
    heads = [i for i, line in enumerate(lines) if " requests answered under wrk" in line]
    assert [lines[i].split(":")[0] for i in heads] == ["digits none", "digits batched"]

    def engine(i: int) -> int:  # the engine's bytecodes per request on the loop, from its "loop:" line
        loop = lines[i + 1]
        assert loop.startswith("loop: ") and int(loop.split()[1].replace(",", "")) > 500  # uvicorn's too
        return int(loop.split(", ")[1].split()[0].replace(",", ""))

    assert engine(heads[0]) == 0 and engine(heads[1]) > 100  # a batched call: admitted, awaited, woken


_TAKE = """
import sys
from _opcount import OpCounter

def work():
    return sum(range(3))

counter = OpCounter(lambda: "main")
counter.on = True
sys.settrace(counter.tracer)
work()
first = counter.take()
work()
work()
second = counter.take()
sys.settrace(None)
mine = [key for key in first if key[1].endswith(":work")]
received = OpCounter(lambda: "")
received.add(second)
print(len(mine), first[mine[0]], second[mine[0]], received.counts == second)
"""


def test_the_opcode_counter_counts_from_zero_after_a_take() -> None:
    import subprocess
    import sys

    # (in a process of its own, as the scripts run it: a tracer of opcodes is the process's)
    done = subprocess.run(
        [sys.executable, "-c", _TAKE], cwd=SERVE_OPS.parent, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    functions, first, second, received = done.stdout.split()
    assert functions == "1" and int(second) == 2 * int(first) > 0 and received == "True"


# -- scripts/serve_timeline.py: when the loop waits under wrk, and what runs meanwhile --------------------

SERVE_TIMELINE = Path(__file__).resolve().parents[3] / "scripts" / "serve_timeline.py"


def _timeline_module() -> Any:
    from tests.examples import load_script

    return load_script(SERVE_TIMELINE, "serve_timeline")


def test_serve_timeline_reads_the_middle_of_a_run_and_the_loops_waits_during_batches() -> None:
    timeline = _timeline_module()
    # requests span 0..10 s: the middle is 2..8 s (6 s); 30 requests end there
    requests = [[0.0, 0.1], [9.9, 10.0]] + [[2.0 + 0.2 * i, 2.1 + 0.2 * i] for i in range(30)]
    waits = [[1.0, 3.0], [4.0, 4.5], [7.5, 9.0]]  # in the middle: 2..3, 4..4.5, 7.5..8 = 2 s
    # two workers' batches: 2.5..3.5 and 3..4 overlap (2.5..4 covered), 6..7 alone; 9..9.5 is outside
    batches = [[2.5, 3.5, 10], [3.0, 4.0, 20], [6.0, 7.0, 30], [9.0, 9.5, 40]]
    figures = timeline.analyse({"request": requests, "wait": waits, "batch": batches})
    assert figures["seconds"] == pytest.approx(6.0)
    assert figures["answered_per_s"] == pytest.approx(30 / 6)
    assert figures["loop_waits"] == pytest.approx(2.0 / 6)
    assert figures["batch_runs"] == pytest.approx(2.5 / 6)  # 2.5..4 and 6..7, each instant once
    assert figures["loop_waits_while_batch"] == pytest.approx(0.5 / 6)  # 2.5..3 only
    assert figures["batches"] == 3 and figures["calls_per_batch"] == 20
    assert figures["batch_ms"] == pytest.approx(1000.0)
    assert figures["loop_wall_us"] == figures["loop_cpu_us"] == 0.0  # one wait lies whole in the middle
    with pytest.raises(ValueError, match="no request"):
        timeline.analyse({"request": [], "wait": waits, "batch": batches})
    with pytest.raises(ValueError, match="waits were not recorded"):
        timeline.analyse({"request": requests, "wait": [], "batch": batches})


def test_serve_timeline_gives_the_loops_work_per_request_as_wall_and_cpu_time() -> None:
    timeline = _timeline_module()
    requests = [[0.0, 0.1], [9.9, 10.0]] + [[2.0 + 0.2 * i, 2.1 + 0.2 * i] for i in range(30)]
    # [start, end, loop CPU at start, at end]; the middle is 2..8 s, and these three lie whole in it
    waits = [[1.0, 2.2, 9.0, 9.1], [2.5, 3.0, 10.0, 10.1], [4.0, 4.5, 10.6, 10.65], [7.0, 7.5, 11.5, 11.55]]
    figures = timeline.analyse({"request": requests, "wait": waits, "batch": []})
    # from the end of the first whole wait (3.0 s) to the start of the last (7.0 s): 4 s less the 0.5 s
    # wait between, and 1.4 s of CPU less the 0.05 s spent in that wait; 20 requests end in 3.0..7.0 s
    assert figures["loop_wall_us"] == pytest.approx(3.5 / 20 * 1e6)
    assert figures["loop_cpu_us"] == pytest.approx(1.35 / 20 * 1e6)


@pytest.mark.slow
@needs_wrk
def test_serve_timeline_records_a_batched_server_under_wrk() -> None:
    options = ["--seconds", "1", "--rounds", "1", "--connections", "8", "--max-batch", "4"]
    lines = _script_lines(SERVE_TIMELINE, "run", "digits", "batched", "handmade", *options)
    assert [line.split(":")[0] for line in lines] == ["digits batched round 1", "digits handmade round 1"]
    for line in lines:
        calls = float(line.split("median ")[1].split(" calls")[0])
        assert 1 <= calls <= 4  # --max-batch caps the batches of both batchers
        assert " 0 batches" not in line and "answered 0/s" not in line
        cpu = float(line.split("µs wall, ")[1].split(" µs CPU")[0])
        assert cpu > 0  # the loop's CPU time per request was read


@pytest.mark.parametrize(
    "body", [b"[" * 100_000 + b"]" * 100_000, b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"]
)
def test_the_bench_server_answers_deeply_nested_json_as_a_bad_row(body: bytes) -> None:
    from schedsvc.cli.bench._serve_app import BadRow, parse_row

    with pytest.raises(BadRow, match="send JSON"):
        parse_row(body, 64)
