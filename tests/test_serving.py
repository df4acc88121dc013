"""schedsvc.serving: the engine in an app's lifespan, its refusals as 503s, and calls dropped when their
client leaves (driven through ASGI by hand, on asyncio and trio)."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest

import schedsvc as ss
from tests.compile.helpers import both_backends, occupied
from tests.helpers import Gate, state, until, within

pytest.importorskip("starlette")
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from schedsvc import serving

anyio_backend = both_backends

#: one worker, and no task run inline by an awaiting request, so a held worker holds every call
HELD = {"cpu_workers": 1, "inline_threshold_us": 0}
W = np.random.default_rng(3).standard_normal((4, 2))


def forward(x: np.ndarray) -> np.ndarray:
    return x @ W


# -- importing ----------------------------------------------------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_import_schedsvc_does_not_import_starlette() -> None:
    done = run_python(
        "import sys, schedsvc; print(sorted(m for m in ('starlette', 'fastapi') if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_starlette_importing_serving_says_what_to_install() -> None:
    done = run_python("import sys; sys.modules['starlette'] = None; import schedsvc.serving")
    assert done.returncode != 0
    assert "ImportError: schedsvc.serving needs Starlette" in done.stderr
    assert "pip install 'schedsvc[serve]'" in done.stderr


# -- the lifespan -------------------------------------------------------------------------------------------


def test_the_lifespan_takes_a_config_not_an_engine() -> None:
    with pytest.raises(TypeError, match=r"takes an ss\.Config .*not Engine: it opens the engine itself"):
        serving.lifespan(ss.Engine())  # type: ignore[arg-type]


async def test_the_lifespan_opens_the_engine_runs_setup_and_closes_it(anyio_backend: str) -> None:
    seen: list[Any] = []

    async def setup(app: Starlette, eng: ss.Engine) -> None:
        seen.append((app, eng, eng.closed))
        app.state.model = eng.compile(forward, batch_axis=0)

    app = Starlette(lifespan=serving.lifespan(ss.Config(cpu_workers=2), setup=setup, max_pending=9))
    async with app.router.lifespan_context(app):
        eng = app.state.engine
        assert seen == [(app, eng, False)]
        assert (eng.config.cpu_workers, eng.config.max_pending) == (2, 9)
        x = np.ones((1, 4))
        assert np.array_equal(await within(app.state.model(x)), forward(x))
    assert eng.closed
    async with app.router.lifespan_context(app):  # a restart: a new engine
        assert app.state.engine is not eng and not app.state.engine.closed
    assert app.state.engine.closed


async def test_shutdown_finishes_the_work_already_accepted(anyio_backend: str) -> None:
    app = Starlette(lifespan=serving.lifespan(**HELD))
    gate = Gate()
    lifespan = app.router.lifespan_context(app)
    await within(lifespan.__aenter__())
    eng = app.state.engine
    held = eng.submit_nowait(gate.hold(lambda: "finished"))
    queued = eng.submit_nowait(len, "four")
    await gate.wait_started(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lifespan.__aexit__, None, None, None)
        await until(lambda: eng.closed)  # the close has begun: it waits for both
        assert not queued.done()
        with pytest.raises(ss.EngineClosed):
            eng.submit_nowait(len, "late")
        gate.open()
    assert (held.result(), queued.result()) == ("finished", 4)


async def test_a_failing_setup_fails_the_startup_and_closes_the_engine(anyio_backend: str) -> None:
    async def setup(app: Starlette, eng: ss.Engine) -> None:
        raise RuntimeError("no model file")

    app = Starlette(lifespan=serving.lifespan(setup=setup, cpu_workers=1))
    with pytest.raises(RuntimeError, match="no model file"):
        async with app.router.lifespan_context(app):
            pytest.fail("the app served without its setup")
    assert app.state.engine.closed
    assert not [t.name for t in threading.enumerate() if t.name.startswith("schedsvc-")]


def test_bad_settings_fail_where_the_app_is_made() -> None:
    with pytest.raises(ss.ConfigError, match="max_pending"):
        serving.lifespan(max_pending=-1)


def test_get_engine_without_the_lifespan_says_how_to_add_it() -> None:
    app = Starlette()
    request = Request({"type": "http", "app": app, "headers": []})
    with pytest.raises(ss.SchedsvcError, match=r"lifespan=schedsvc\.serving\.lifespan"):
        serving.get_engine(request)


# -- exception handlers -------------------------------------------------------------------------------------


def raising(exc: Exception) -> Any:
    async def endpoint(request: Request) -> JSONResponse:
        raise exc

    return endpoint


ERRORS = {
    "/full": ss.QueueFull("at the limits"),
    "/closed": ss.EngineClosed("closing"),
    "/gone": ClientDisconnect(),
}


async def status_of(app: Starlette) -> dict[str, Any]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
        return {path: await within(client.get(path)) for path in ERRORS}


@pytest.mark.parametrize("how", ["exception_handlers", "add_exception_handlers"])
async def test_queue_full_and_engine_closed_are_503_with_retry_after(how: str) -> None:
    routes = [Route(path, raising(exc)) for path, exc in ERRORS.items()]
    if how == "exception_handlers":
        app = Starlette(routes=routes, exception_handlers=serving.exception_handlers(retry_after=7))
    else:
        app = Starlette(routes=routes)
        serving.add_exception_handlers(app, retry_after=7)
    responses = await status_of(app)
    for path in ("/full", "/closed"):
        assert responses[path].status_code == 503
        assert responses[path].headers["Retry-After"] == "7"
    assert "busy" in responses["/full"].json()["detail"]
    assert "shutting down" in responses["/closed"].json()["detail"]
    assert responses["/gone"].status_code == serving.CLIENT_CLOSED_REQUEST


async def test_the_handlers_serve_fastapi_too() -> None:
    fastapi = pytest.importorskip("fastapi")
    app = fastapi.FastAPI(exception_handlers=serving.exception_handlers())
    for path, exc in ERRORS.items():
        app.add_api_route(path, raising(exc))
    responses = await status_of(app)
    assert responses["/full"].status_code == 503
    assert responses["/full"].headers["Retry-After"] == str(serving.RETRY_AFTER_S) == "1"


async def test_a_flood_of_503s_is_one_warning_then_a_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kind of 503 is logged on schedsvc.serving with the request and why, once; the 503s after it are
    counted into the next record, one interval later -- not one record per request."""
    from schedsvc import _logging

    caplog.set_level(logging.DEBUG, logger="schedsvc")
    monkeypatch.setattr(_logging, "INTERVAL_S", math.inf)  # (no interval passes during the test)
    app = Starlette(
        routes=[Route(path, raising(exc)) for path, exc in ERRORS.items()],
        exception_handlers=serving.exception_handlers(retry_after=7),
    )
    for _ in range(5):
        responses = await status_of(app)
        assert responses["/full"].status_code == responses["/closed"].status_code == 503
    records = [r for r in caplog.records if r.name.startswith("schedsvc")]
    assert [(r.name, r.levelno) for r in records] == [("schedsvc.serving", logging.WARNING)] * 2
    busy, closing = (r.getMessage() for r in records)
    assert busy == "503 to GET /full, Retry-After 7 s: at the limits"
    assert closing == "503 to GET /closed, the engine is closing: closing"
    monkeypatch.setattr(_logging, "INTERVAL_S", 0.0)  # the interval has passed
    await status_of(app)
    counted = [r.getMessage() for r in caplog.records if r.name.startswith("schedsvc")][2:]
    assert len(counted) == 2
    assert all("(and 4 more like it in the " in said for said in counted), counted


async def test_a_503_from_an_engine_at_its_limits_is_logged_with_its_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """End to end: a held worker and max_pending=1; a second request is refused, a 503, and the warning
    names the limit that was full."""
    import httpx

    caplog.set_level(logging.WARNING, logger="schedsvc.serving")
    gate = Gate()

    async def hold(request: Request) -> JSONResponse:
        await within(serving.get_engine(request).submit_nowait(gate.hold()))  # QueueFull at the limits
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[Route("/hold", hold, methods=["POST"])],
        lifespan=serving.lifespan(ss.Config(max_pending=1, **HELD)),
        exception_handlers=serving.exception_handlers(),
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://service") as client,
        anyio.create_task_group() as group,
    ):
        group.start_soon(client.post, "/hold")
        await gate.wait_started(1)
        refused = await within(client.post("/hold"))
        gate.open()
    assert refused.status_code == 503
    (record,) = (r for r in caplog.records if r.name == "schedsvc.serving")
    assert record.getMessage().startswith("503 to POST /hold, Retry-After 1 s: engine at its limits (")


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True])
def test_retry_after_must_be_whole_seconds(bad: Any) -> None:
    with pytest.raises(ValueError, match="retry_after"):
        serving.exception_handlers(retry_after=bad)


# -- while_connected ----------------------------------------------------------------------------------------


class Connection:
    """One HTTP request to an ASGI app, driven by hand: the body, then a disconnect once ``leave()`` is
    called; what the app sends is kept."""

    def __init__(self, body: bytes = b"", on_wait: Any = None) -> None:
        self.body = body
        self.body_sent = False
        self.left = anyio.Event()
        self.on_wait = on_wait  # called when the app first waits for the disconnect
        self.sent: list[dict[str, Any]] = []

    def scope(self, app: Starlette, path: str) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
            "app": app,
        }

    async def receive(self) -> dict[str, Any]:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        if self.on_wait is not None:
            self.on_wait()
            self.on_wait = None
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self.left.set()

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    async def request(self, app: Starlette, path: str) -> None:
        await app(self.scope(app, path), self.receive, self.send)


async def predict(request: Request) -> JSONResponse:
    x = np.array([await request.json()])
    y = await serving.while_connected(request, request.app.state.model(x))
    return JSONResponse(y[0].tolist())


async def load(app: Starlette, eng: ss.Engine) -> None:
    app.state.model = eng.compile(forward, batch_axis=0)
    await app.state.model(np.zeros((1, 4)))


@asynccontextmanager
async def service(**options: Any) -> AsyncIterator[Starlette]:
    app = Starlette(
        routes=[Route("/predict", predict, methods=["POST"])],
        lifespan=serving.lifespan(**options, setup=load),
    )
    serving.add_exception_handlers(app)
    async with app.router.lifespan_context(app):
        yield app


async def test_a_call_whose_client_left_before_it_ran_leaves_its_batch_and_never_runs(
    anyio_backend: str,
) -> None:
    async with service(**HELD) as app:
        eng, model = app.state.engine, app.state.model
        leaving, staying = Connection(b"[1, 2, 3, 4]"), Connection(b"[5, 6, 7, 8]")
        async with anyio.create_task_group() as tg, occupied(eng, 1):
            tg.start_soon(leaving.request, app, "/predict")
            tg.start_soon(staying.request, app, "/predict")
            await state(eng, lambda: eng.pending == 3)  # the held task and both calls
            leaving.leave()
            await state(eng, lambda: eng.pending == 2)  # its call cancelled, out of the queue
        assert leaving.status == serving.CLIENT_CLOSED_REQUEST
        assert staying.status == 200
        assert eng.stats().cancelled == 1
        assert model.stats()["batch_sizes"] == {1: 2}  # the startup row, then the staying row alone
    body = b"".join(m.get("body", b"") for m in staying.sent)
    assert np.array_equal(np.array(json.loads(body)), forward(np.array([[5.0, 6, 7, 8]]))[0])


async def test_a_call_that_runs_when_its_client_leaves_finishes_and_is_dropped(anyio_backend: str) -> None:
    gate = Gate()
    results: list[Any] = []

    async def slow(request: Request) -> JSONResponse:
        fut = serving.get_engine(request).submit_nowait(gate.hold(lambda: 42))
        results.append(fut)
        return JSONResponse(await serving.while_connected(request, fut))

    app = Starlette(routes=[Route("/slow", slow, methods=["POST"])], lifespan=serving.lifespan(**HELD))
    serving.add_exception_handlers(app)
    async with app.router.lifespan_context(app):
        connection = Connection()
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection.request, app, "/slow")
            await gate.wait_started(1)
            connection.leave()
        assert connection.status == serving.CLIENT_CLOSED_REQUEST
        assert not results[0].done() and not results[0].cancel()  # running: it cannot be cancelled
        gate.open()
        assert await within(results[0]) == 42


async def test_a_finished_call_is_returned_and_its_error_raised_as_it_is(anyio_backend: str) -> None:
    def fail() -> None:
        raise ValueError("bad rows")

    async with service(**HELD) as app:
        eng = app.state.engine
        gate = Gate()
        fut = eng.submit_nowait(gate.hold(fail))
        await gate.wait_started(1)
        connection = Connection(on_wait=gate.open)  # the task ends once while_connected watches
        request = Request(connection.scope(app, "/"), connection.receive)
        with pytest.raises(ValueError, match="bad rows"):  # not wrapped in an exception group
            await within(serving.while_connected(request, fut))
        done = eng.submit_nowait(len, "abc")
        await within(done.wait())
        assert await serving.while_connected(request, done) == 3


async def test_cancelling_the_request_cancels_its_call(anyio_backend: str) -> None:
    async with service(**HELD) as app:
        eng = app.state.engine
        connection = Connection(b"[1, 2, 3, 4]")
        async with occupied(eng, 1):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(connection.request, app, "/predict")
                    await state(eng, lambda: eng.pending == 2)
                    scope.cancel()
            await state(eng, lambda: eng.pending == 1)
        assert eng.stats().cancelled == 1
        assert not connection.sent


async def test_a_request_waiting_for_room_is_not_admitted_once_its_client_left(anyio_backend: str) -> None:
    """``while_connected`` takes any awaitable: here one that waits for room (``await model.submit``)."""

    async def queued(request: Request) -> JSONResponse:
        x = np.array([await request.json()])
        model = request.app.state.model

        async def call() -> np.ndarray:
            return await (await model.submit(x))  # type: ignore[no-any-return]

        return JSONResponse((await serving.while_connected(request, call()))[0].tolist())

    app = Starlette(
        routes=[Route("/queued", queued, methods=["POST"])],
        lifespan=serving.lifespan(**HELD, max_pending=1, setup=load),
    )
    serving.add_exception_handlers(app)
    async with app.router.lifespan_context(app):
        eng, model = app.state.engine, app.state.model
        connection = Connection(b"[1, 2, 3, 4]")
        async with anyio.create_task_group() as tg, occupied(eng, 1) as (_, held):  # the one slot
            tg.start_soon(connection.request, app, "/queued")
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            connection.leave()
            await state(eng, lambda: eng.stats().waiting_admission == 0)
        await within(held[0])
        assert connection.status == serving.CLIENT_CLOSED_REQUEST
        assert eng.stats().completed == 2  # the startup call and the held task: the request's call never ran
        assert model.stats()["rows"] == 1
