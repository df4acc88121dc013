"""examples/serve_starlette.py and examples/serve_fastapi.py: in process through an ASGI client, and under
uvicorn in a subprocess on 127.0.0.1, hit over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from tests.compile.helpers import occupied
from tests.examples import NESTED, assert_capped, assert_told, client_of, load_example
from tests.helpers import TIMEOUT, state, within

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["serve_starlette", "serve_fastapi"]
#: one worker, and no task run inline by the awaiting request, so a held worker holds every call
HELD = {"cpu_workers": 1, "inline_threshold_us": 0}


def row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(16)


def assert_own_row(response: Any, example: Any, x: np.ndarray) -> None:
    """The response is the model's output on this row alone, within the rounding of the default (fast)
    batching: a row of a many-row product is rounded in its last bits (JSON keeps a float64 exactly)."""
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        response.json()["y"], example.forward(x.reshape(1, -1))[0], rtol=1e-12, atol=1e-12
    )


# -- in process: def endpoints --------------------------------------------------------------------------------


async def test_def_and_async_endpoints_batch_their_calls_together() -> None:
    """FastAPI runs ``def`` endpoints in worker threads: their calls are admitted from there, queue with the
    ``async def`` endpoint's, and run as one batch; each request gets its own row."""
    example = load_example("serve_fastapi")
    app = example.create_app(ss.Config(**HELD))
    xs = [row(seed) for seed in range(6)]
    async with client_of(app) as client:
        eng = app.state.engine
        async with occupied(eng, 1):
            paths = ["/predict-sync", "/predict"] * 3
            requests = [
                asyncio.ensure_future(client.post(p, json={"x": x.tolist()}))
                for p, x in zip(paths, xs, strict=True)
            ]
            await state(eng, lambda: eng.pending == 1 + len(xs))  # the held task, and every call
            assert not any(r.done() for r in requests)
        responses = await within(asyncio.gather(*requests))
        model = app.state.model.stats()
    for response, x in zip(responses, xs, strict=True):
        assert_own_row(response, example, x)
    assert model["batch_sizes"] == {1: 1, 6: 1}  # the row traced at startup, then the six together


async def test_a_def_endpoint_at_the_engines_limits_is_answered_503() -> None:
    example = load_example("serve_fastapi")
    app = example.create_app(ss.Config(**HELD, max_pending=1), retry_after=4)
    async with client_of(app) as client:
        async with occupied(app.state.engine, 1) as (_, held):  # the one slot
            refused = await within(client.post("/predict-sync", json={"x": row(0).tolist()}))
        await within(held[0])  # the slot is free again once the held task has ended, not at the gate
        admitted = await within(client.post("/predict-sync", json={"x": row(1).tolist()}))
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "4"
    assert "busy" in refused.json()["detail"]
    assert_own_row(admitted, example, row(1))


@pytest.mark.parametrize("name", EXAMPLES)
async def test_a_bad_row_is_told_what_to_send(name: str) -> None:
    example = load_example(name)
    async with client_of(example.create_app(ss.Config(cpu_workers=1))) as client:
        response = await within(client.post("/predict", json={"x": [1, 2]}))
    assert response.status_code == 400  # Starlette's own check, FastAPI's validation answered as the others
    assert "16" in response.json()["detail"]


FINITE = b", 0" * 15 + b"]}"  # the rest of a row of 16


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", '{"x": [16'),
        (b"[" * NESTED + b"]" * NESTED, '{"x": [16'),
        (b'{"x": ' + b"[" * NESTED + b"]" * NESTED + b"}", '{"x": [16'),
        (b'{"x": [NaN' + FINITE, "finite"),  # Python's JSON parser takes NaN and Infinity
        (b'{"x": [-Infinity' + FINITE, "finite"),
        (b'{"x": [1e400' + FINITE, "finite"),  # inf as a float
        (b'{"x": [NaN]}', "16"),
        (b"NaN", '{"x": [16'),
    ],
)
async def test_bad_input_is_a_400_that_says_what_to_send(name: str, body: bytes, says: str) -> None:
    await assert_told(load_example(name).create_app(ss.Config(cpu_workers=1)), body, 400, says)


@pytest.mark.parametrize("name", EXAMPLES)
async def test_a_body_over_the_limit_is_refused_as_soon_as_it_is_known(name: str) -> None:
    example = load_example(name)
    await assert_capped(example.create_app(ss.Config(cpu_workers=1)), example.MAX_BODY_BYTES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_script_binds_127_0_0_1_with_its_lifespan_on(name: str) -> None:
    config = load_example(name).server_config(["--port", "8123", "--retry-after", "5"])
    assert (config.host, config.port, config.lifespan) == ("127.0.0.1", 8123, "on")
    assert load_example(name).server_config([]).port == 8000


# -- under uvicorn, in a subprocess -------------------------------------------------------------------------


class Service:
    """An example running under uvicorn in a subprocess (``tests/serving_server.py``), and its output."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        try:
            self.port = int(self.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1))
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first line of output from now on that matches ``pattern`` (within TIMEOUT)."""
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} in: {''.join(self.output)}") from None
            assert line is not None, f"the service exited before {pattern!r}: {''.join(self.output)}"
            self.output.append(line)
            if match := re.search(pattern, line):
                return match

    def stop(self) -> str:
        """Ctrl-C, as a user stops it: it must shut down and exit 0; its whole output."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(TIMEOUT) == 0, "".join(self.output)
        while (line := self.lines.get(timeout=TIMEOUT)) is not None:
            self.output.append(line)
        return "".join(self.output)

    def close(self) -> None:
        """Kill it if it still runs; close its pipe once the reader has seen its end."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        self.reader.join(TIMEOUT)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@contextmanager
def serving(name: str, *args: str) -> Iterator[Service]:
    """``examples/<name>.py --port 0 *args`` under uvicorn, with the test routes; killed if left running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDSVC_")}
    env |= {"SCHEDSVC_CPU_WORKERS": "1", "SCHEDSVC_INLINE_THRESHOLD_US": "0", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tests.serving_server", name, "--port", "0", *args]
    service = Service(
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    )
    try:
        yield service
    finally:
        service.close()


async def send_and_leave(port: int, x: np.ndarray) -> asyncio.StreamWriter:
    """POST a row over a socket of its own, and close the socket without waiting for the answer."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"x": x.tolist()}).encode()
    head = f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    return writer


@pytest.mark.parametrize("name", EXAMPLES)
async def test_uvicorn_serves_refuses_at_the_limits_drops_the_departed_and_shuts_down(name: str) -> None:
    example = load_example(name)
    with serving(name, "--max-pending", "2", "--retry-after", "3") as service:
        async with httpx.AsyncClient(base_url=service.url, trust_env=False) as client:
            x = row(0)
            assert_own_row(await within(client.post("/predict", json={"x": x.tolist()})), example, x)
            assert (await within(client.post("/test/hold"))).text == "held"  # 1 of the 2 slots
            writer = await within(send_and_leave(service.port, row(1)))  # its call takes the other
            await within(client.get("/test/pending/2"))
            refused = await within(client.post("/predict", json={"x": row(2).tolist()}))
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "3"
            writer.close()  # the client of the admitted request leaves: its call is cancelled, not run
            await within(client.get("/test/pending/1"))
            await within(client.post("/test/release"))
            x = row(3)
            assert_own_row(await within(client.post("/predict", json={"x": x.tolist()})), example, x)
            model = (await within(client.get("/stats"))).json()["model"]
        assert model["rows"] == 3  # the startup row and the two answered: the departed request's never ran
        output = service.stop()
    assert "engine closed: True" in output and "Application shutdown complete" in output
    assert "Traceback" not in output and "ERROR" not in output


def test_the_script_runs_as_python_examples_serve_fastapi_py() -> None:
    example = load_example("serve_fastapi")
    command = [
        sys.executable,
        str(ROOT / "examples" / "serve_fastapi.py"),
        "--port",
        "0",
        "--cpu-workers",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDSVC_")} | {"PYTHONUNBUFFERED": "1"}
    service = Service(
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )
    try:
        x = row(4)
        with httpx.Client(base_url=service.url, trust_env=False, timeout=TIMEOUT) as client:
            assert_own_row(client.post("/predict-sync", json={"x": x.tolist()}), example, x)
        output = service.stop()
    finally:
        service.close()
    assert "Application shutdown complete" in output and "Traceback" not in output
