"""``schedsvc bench serve``: real servers under real HTTP load, every answer counted and checked."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from schedsvc.cli import main
from schedsvc.cli.bench import serve

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
    import subprocess
    import sys

    options = ["--seconds", "1", "--rounds", "1", "--connections", "8", "--max-batch", "4"]
    done = subprocess.run(
        [sys.executable, str(SERVE_TIMELINE), "run", "digits", "batched", "handmade", *options],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
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
