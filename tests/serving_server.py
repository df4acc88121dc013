"""An example service under uvicorn, for tests: ``python -m tests.serving_server <example> [its arguments]``.

It runs ``examples/<example>.py`` as its ``main`` does (``uvicorn.Server(server_config(argv)).run()``), with
routes for tests added to its app: ``POST /test/hold`` holds an engine worker with a task (it answers once
the task runs), ``POST /test/release`` lets it finish, ``GET /test/pending/{n}`` answers once the engine has
``n`` tasks pending.  When its lifespan ends it prints whether the engine was closed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from schedsvc import serving
from tests.examples import load_example
from tests.helpers import Gate, state


def add_test_routes(app: Any) -> None:
    gate = Gate()

    async def hold(request: Request) -> PlainTextResponse:
        serving.get_engine(request).submit_nowait(gate.hold(), name="hold")
        await gate.wait_started(1)
        return PlainTextResponse("held")

    async def release(request: Request) -> PlainTextResponse:
        gate.open()
        return PlainTextResponse("released")

    async def pending(request: Request) -> PlainTextResponse:
        eng = serving.get_engine(request)
        n = int(request.path_params["n"])
        await state(eng, lambda: eng.pending == n)
        return PlainTextResponse(str(n))

    app.add_route("/test/hold", hold, methods=["POST"])
    app.add_route("/test/release", release, methods=["POST"])
    app.add_route("/test/pending/{n:int}", pending, methods=["GET"])


def report_the_close(app: Any) -> None:
    """Print whether the engine is closed once the app's lifespan has ended."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with inner(app):
            yield
        print(f"engine closed: {app.state.engine.closed}", flush=True)

    app.router.lifespan_context = lifespan


def main(argv: list[str]) -> None:
    name, *args = argv
    config = load_example(name).server_config(args)
    add_test_routes(config.app)
    report_the_close(config.app)
    with contextlib.suppress(KeyboardInterrupt):  # raised again by uvicorn once it has shut down
        uvicorn.Server(config).run()


if __name__ == "__main__":
    main(sys.argv[1:])
