"""examples/serve_batch.py, driven through an ASGI client (no sockets) inside its lifespan: the rows of
concurrent requests run in shared batches, and each request gets its own row back."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from tests.compile.helpers import occupied
from tests.examples import NESTED, assert_capped, assert_told, client_of, load_example
from tests.helpers import state, within

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
serving = pytest.importorskip("schedsvc.serving")

serve = load_example("serve_batch")

#: one worker, and no task run inline by the awaiting request, so a held worker holds every batch
HELD = {"cpu_workers": 1, "inline_threshold_us": 0}


def images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, serve.MAX_PIXEL + 1, (n, serve.PIXELS)).astype(np.float64)


def post(client: Any, row: np.ndarray) -> asyncio.Task[Any]:
    return asyncio.ensure_future(client.post("/predict", json={"pixels": row.tolist()}))


def assert_own_row(response: Any, row: np.ndarray) -> None:
    """The response is the model's output on this row alone, within the rounding of the default (fast)
    batching: a row of a many-row product is rounded in its last bits (JSON keeps a float64 exactly)."""
    assert response.status_code == 200, response.text
    expected = serve.forward(row.reshape(1, -1))[0]
    np.testing.assert_allclose(response.json()["scores"], expected, rtol=1e-12, atol=1e-12)
    assert response.json()["digit"] == int(np.argmax(expected))


async def test_concurrent_requests_share_batches_and_each_gets_its_own_row() -> None:
    app = serve.create_app(ss.Config(cpu_workers=2))
    x = images(200, 0)
    async with client_of(app) as client:
        responses = await within(asyncio.gather(*[post(client, row) for row in x]))
        figures = (await within(client.get("/stats"))).json()["model"]
    for response, row in zip(responses, x, strict=True):
        assert_own_row(response, row)
    assert figures["rows"] == len(x) + 1  # and the row of zeros traced at startup
    assert figures["batches"] < len(x)


async def test_requests_made_while_the_engine_is_busy_run_as_one_batch() -> None:
    app = serve.create_app(ss.Config(**HELD), max_batch=8)
    x = images(8, 1)
    async with client_of(app) as client:
        async with occupied(app.state.engine, 1):
            requests = [post(client, row) for row in x]
            await state(app.state.engine, lambda: app.state.engine.pending == 9)  # the held task, 8 calls
            assert not any(r.done() for r in requests)
        responses: list[Any] = await within(asyncio.gather(*requests))
        model = app.state.model.stats()
    for response, row in zip(responses, x, strict=True):
        assert_own_row(response, row)
    assert model["batch_sizes"] == {1: 1, 8: 1}  # the startup row alone, then the eight requests together


async def test_a_request_at_the_engines_limits_is_answered_503_with_retry_after() -> None:
    app = serve.create_app(ss.Config(**HELD, max_pending=1), max_batch=1)
    first, second = images(2, 2)
    async with client_of(app) as client:
        eng = app.state.engine
        async with occupied(eng, 1) as (_, held):  # the one slot
            refused = await within(post(client, first))
        await within(held[0])
        admitted = await within(post(client, second))
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == str(serving.RETRY_AFTER_S)
    assert "busy" in refused.json()["detail"]
    assert_own_row(admitted, second)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, '{"pixels": [64 numbers'),
        (b'{"pixels": [1, 2]}', 400, "shape (2,)"),
        (b'{"pixels": [[1]]}', 400, "list of 64 numbers"),
        (b'{"rows": [1]}', 400, "'pixels'"),
        (b'{"pixels": [17' + b", 0" * 63 + b"]}", 400, "from 0 to 16"),
        (b'{"pixels": [NaN' + b", 0" * 63 + b"]}", 400, "from 0 to 16"),
        (b"[" * NESTED + b"]" * NESTED, 400, '{"pixels": [64 numbers'),
        (b'{"pixels": ' + b"[" * NESTED + b"]" * NESTED + b"}", 400, '{"pixels": [64 numbers'),
        (b" " * (serve.MAX_BODY_BYTES + 1), 413, "one image"),
    ],
)
async def test_a_bad_request_is_told_what_to_send(body: bytes, status: int, says: str) -> None:
    await assert_told(serve.create_app(ss.Config(cpu_workers=1)), body, status, says)


async def test_a_body_over_the_limit_is_refused_as_soon_as_it_is_known() -> None:
    await assert_capped(serve.create_app(ss.Config(cpu_workers=1)), serve.MAX_BODY_BYTES)


def test_the_script_binds_127_0_0_1_with_its_batching_options() -> None:
    config = serve.server_config(["--port", "8123", "--max-batch", "32"])
    assert (config.host, config.port, config.lifespan) == ("127.0.0.1", 8123, "on")
    assert config.app.state.max_batch == 32
    assert serve.server_config([]).port == 8000
