"""examples/serve.py, driven through an ASGI client (no sockets) inside its lifespan, and once under uvicorn."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from tests.examples import NESTED, assert_capped, assert_told, client_of, load_example
from tests.helpers import Gate, state, until, within

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
serving = pytest.importorskip("schedsvc.serving")

serve = load_example("serve")


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, serve.IN_FEATURES))


@asynccontextmanager
async def held(eng: ss.Engine) -> AsyncIterator[Gate]:
    """The engine's one worker held by a task until the gate opens: requests' tasks queue behind it."""
    gate = Gate()
    eng.submit_nowait(gate.hold(), name="hold")
    try:
        await gate.wait_started(1)
        yield gate
    finally:
        gate.open()


#: one worker, and no task run inline by the awaiting request (a cheap awaited task may run in the awaiting
#: coroutine: Config.inline_threshold_us), so a held worker holds every request's task
HELD = {"cpu_workers": 1, "inline_threshold_us": 0}


def post(client: Any, x: np.ndarray) -> asyncio.Task[Any]:
    return asyncio.ensure_future(client.post("/predict", json={"rows": x.tolist()}))


def assert_outputs(response: Any, x: np.ndarray) -> None:
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["outputs"], serve.forward(x), rtol=1e-12, atol=1e-12)


async def test_outputs_equal_the_numpy_forward_pass() -> None:
    app = serve.create_app(ss.Config(cpu_workers=2))
    async with client_of(app) as client:
        for n, seed in [(1, 0), (3, 1), (5, 2), (serve.MAX_ROWS, 3)]:
            x = rows(n, seed)
            assert_outputs(await within(client.post("/predict", json={"rows": x.tolist()})), x)
        figures = (await within(client.get("/stats"))).json()
    assert figures["model"]["traces"] == len(serve.BATCH_SIZES)  # all at startup: none for a request
    assert figures["model"]["replays"] == len(serve.BATCH_SIZES) + 4
    assert figures["engine"]["completed"] == len(serve.BATCH_SIZES) + 4
    assert figures["engine"]["max_pending"] == app.state.engine.config.max_pending


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, '{"rows": [[16 numbers]'),
        (b'{"rows": [[1, 2]]}', 400, "shape (1, 2)"),
        (b'{"rows": []}', 400, "1 to 64 lists"),
        (b'{"cols": [[1]]}', 400, "'rows'"),
        (b'{"rows": [["a"]]}', 400, "16 numbers"),
        (b'{"rows": [[NaN' + b", 0" * 15 + b"]]}", 400, "finite numbers"),
        (b'{"rows": [[2e6' + b", 0" * 15 + b"]]}", 400, "at most 1e+06"),
        (b"[" * NESTED + b"]" * NESTED, 400, '{"rows": [[16 numbers], ...]}'),
        (b'{"rows": ' + b"[" * NESTED + b"]" * NESTED + b"}", 400, '{"rows": [[16 numbers], ...]}'),
        (b" " * (serve.MAX_BODY_BYTES + 1), 413, "fewer rows"),
    ],
)
async def test_a_bad_request_is_told_what_to_send(body: bytes, status: int, says: str) -> None:
    await assert_told(serve.create_app(ss.Config(cpu_workers=1)), body, status, says)


async def test_a_body_over_the_limit_is_refused_as_soon_as_it_is_known() -> None:
    await assert_capped(serve.create_app(ss.Config(cpu_workers=1)), serve.MAX_BODY_BYTES)


async def test_overload_is_answered_503_with_retry_after_and_the_admitted_get_their_values() -> None:
    app = serve.create_app(ss.Config(**HELD, max_pending=3))
    async with client_of(app) as client:
        eng = app.state.engine
        inputs = [rows(2, seed) for seed in range(6)]
        async with held(eng) as gate:  # 1 of 3 slots: two requests are admitted, four refused at once
            requests = [post(client, x) for x in inputs]
            await until(lambda: sum(r.done() for r in requests) == 4)
            refused = {i for i, r in enumerate(requests) if r.done()}
            assert eng.pending == 3
            gate.open()
            responses: list[Any] = await within(asyncio.gather(*requests))
    for i, (response, x) in enumerate(zip(responses, inputs, strict=True)):
        if i in refused:
            assert response.status_code == 503
            assert response.headers["Retry-After"] == str(serving.RETRY_AFTER_S)
            assert "busy" in response.json()["detail"]
        else:
            assert_outputs(response, x)


async def test_awaited_admission_queues_requests_instead_of_refusing_them() -> None:
    app = serve.create_app(ss.Config(**HELD, max_pending=3), admission="wait")
    async with client_of(app) as client:
        eng = app.state.engine
        inputs = [rows(1, seed) for seed in range(6)]
        async with held(eng) as gate:
            requests = [post(client, x) for x in inputs]
            await state(eng, lambda: eng.stats().waiting_admission == 4)  # two admitted, four wait for room
            assert not any(r.done() for r in requests)
            gate.open()
            responses: list[Any] = await within(asyncio.gather(*requests))
    for response, x in zip(responses, inputs, strict=True):
        assert_outputs(response, x)


def test_admission_must_be_reject_or_wait() -> None:
    with pytest.raises(ValueError, match="'reject' or 'wait'"):
        serve.create_app(admission="drop")


async def test_shutdown_finishes_the_requests_in_flight_and_closes_the_engine() -> None:
    app = serve.create_app(ss.Config(**HELD))
    lifespan = app.router.lifespan_context(app)
    await within(lifespan.__aenter__())
    eng = app.state.engine
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
        inputs = [rows(3, seed) for seed in range(3)]
        async with held(eng) as gate:
            requests = [post(client, x) for x in inputs]
            await state(eng, lambda: eng.pending == 1 + len(inputs))  # all three admitted, none run
            shutdown = asyncio.ensure_future(lifespan.__aexit__(None, None, None))
            await until(lambda: eng.closed)  # aclose() has begun: it waits for the three
            late = await within(client.post("/predict", json={"rows": rows(1, 9).tolist()}))
            assert not shutdown.done() and not any(r.done() for r in requests)
            gate.open()
            await within(shutdown)
        responses: list[Any] = await within(asyncio.gather(*requests))
    for response, x in zip(responses, inputs, strict=True):
        assert_outputs(response, x)
    assert late.status_code == 503 and "shutting down" in late.json()["detail"]
    assert late.headers["Retry-After"] == str(serving.RETRY_AFTER_S)
    assert eng.closed and eng.stats().completed == len(serve.BATCH_SIZES) + 1 + len(inputs)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("schedsvc-")]


def test_the_script_binds_127_0_0_1_with_its_lifespan_on() -> None:
    argv = ["--port", "8123", "--max-pending", "7", "--admission", "wait", "--limit-concurrency", "9"]
    config = serve.server_config(argv)
    assert (config.host, config.port, config.lifespan) == ("127.0.0.1", 8123, "on")
    assert (config.timeout_graceful_shutdown, config.limit_concurrency) == (30.0, 9)
    assert config.app.state.admission == "wait"
    assert serve.server_config([]).port == 8000
    with pytest.raises(SystemExit):
        serve.parse_args(["--admission", "drop"])


async def test_uvicorn_serves_it_on_127_0_0_1_and_shuts_down_cleanly() -> None:
    config = serve.server_config(["--port", "0", "--cpu-workers", "1"], log_config=None)
    server = uvicorn.Server(config)
    running = asyncio.ensure_future(server.serve())
    try:
        await until(lambda: server.started or running.done())
        assert server.started, running.result()
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        assert host == "127.0.0.1"
        x = rows(2, 5)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            assert_outputs(await within(client.post("/predict", json={"rows": x.tolist()})), x)
            assert (await within(client.get("/stats"))).json()["engine"]["completed"] > 0
    finally:
        server.should_exit = True
        await within(running)
    assert config.app.state.engine.closed
