"""A FastAPI service over schedsvc with ``schedsvc.serving``: batched calls from ``async def`` and ``def``
endpoints.

Run: ``python examples/serve_fastapi.py [--port 8000] [--max-pending 64] [--retry-after 1] [--help]``
(needs the ``examples`` extra: ``pip install '.[examples]'``), then::

    curl -s -X POST 127.0.0.1:8000/predict -H 'content-type: application/json' \\
        -d '{"x": [0.5, -1, 2, 0, 1, 1, 0, 0, 3, 1, 0, 2, 1, 0, 1, 1]}'
    curl -s -X POST 127.0.0.1:8000/predict-sync -H 'content-type: application/json' -d '{"x": [1, ...]}'
    curl -s 127.0.0.1:8000/stats

- ``FastAPI(lifespan=serving.lifespan(config, setup=load), exception_handlers=serving.exception_handlers())``:
  the engine is open while the app serves (``load`` compiles and traces the model at startup), and
  ``ss.QueueFull`` / ``ss.EngineClosed`` are answered ``503`` with ``Retry-After``.
- ``POST /predict`` is an ``async def`` endpoint: it awaits its call through ``serving.while_connected``, so
  a request whose client leaves before its call runs is dropped and its call taken out of its batch.
- ``POST /predict-sync`` is a ``def`` endpoint, which FastAPI runs in a worker thread: it makes the same call
  and blocks that thread on ``call.result(timeout)``. The calls of both endpoints batch together.
- Requests are validated by FastAPI (pydantic) against ``Row``: a bad one is a 400 that says what is wrong and
  what to send (``bad_row``, which leaves the input out: NaN, which Python's JSON parser takes, cannot be
  written back as JSON). ``BoundedRoute`` has FastAPI read bodies through ``BoundedRequest``: one over
  ``MAX_BODY_BYTES`` is a 413, refused by its ``Content-Length`` or, sent chunked, as soon as it passes the
  limit; JSON nested too deeply to parse is a 400.
- It binds 127.0.0.1 only: put a reverse proxy in front of it to serve other hosts.
"""

import argparse
import contextlib
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

import numpy as np
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

import schedsvc as ss
from schedsvc import serving

HOST = "127.0.0.1"
IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4
MAX_BODY_BYTES = 1 << 14  # a row of 16 numbers is well under 1 KiB
SEND = f'send JSON {{"x": [{IN_FEATURES} finite numbers]}}'
#: seconds a ``def`` endpoint waits for its call: a stalled engine answers 504 instead of holding the thread
RESULT_TIMEOUT_S = 30.0

_RNG = np.random.default_rng(11)  # fixed seed: the same weights in every run
W1 = _RNG.standard_normal((IN_FEATURES, HIDDEN)) / math.sqrt(IN_FEATURES)
B1 = _RNG.standard_normal(HIDDEN) * 0.1
W2 = _RNG.standard_normal((HIDDEN, OUT_FEATURES)) / math.sqrt(HIDDEN)
B2 = _RNG.standard_normal(OUT_FEATURES) * 0.1


def forward(x: np.ndarray) -> np.ndarray:
    """The model on rows: a two-layer MLP with ReLU, plain NumPy (``eng.compile`` traces it)."""
    return np.maximum(x @ W1 + B1, 0) @ W2 + B2


class Row(BaseModel):
    """One input row: ``{"x": [16 finite numbers]}``."""

    x: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(
        min_length=IN_FEATURES, max_length=IN_FEATURES
    )


class Prediction(BaseModel):
    """The model's outputs for the row."""

    y: list[float]


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES: by its Content-Length before any of it is read,
    and a chunked one as soon as it passes the limit."""
    too_large = HTTPException(413, f"the body is over {MAX_BODY_BYTES} bytes: {SEND}")
    length = request.headers.get("content-length", "")
    if length.isdecimal() and int(length) > MAX_BODY_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class BoundedRequest(Request):
    """A request whose body FastAPI reads with ``read_body``, and whose JSON nested too deeply is a 400."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):  # Starlette's cache of the body, which its json() and stream() read
            self._body = await read_body(self)
        return self._body

    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError as exc:  # nested deeper than the interpreter recurses
            raise HTTPException(400, f"the body is nested too deeply to parse: {SEND}") from exc


class BoundedRoute(APIRoute):
    """A route whose endpoint gets a ``BoundedRequest``: FastAPI parses the body from it, bounded."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(BoundedRequest(request.scope, request.receive))

        return bounded


async def bad_row(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that is not a ``Row``: 400, each error's place and what is wrong, without the input itself."""
    errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return JSONResponse({"detail": f"{SEND}: {errors}"}, 400)


#: the compiled model: called with a batch of rows, awaited for the caller's rows of the outputs
Model = ss.Batched[[np.ndarray], np.ndarray]


def get_model(request: Request) -> Model:
    """The compiled model (a FastAPI dependency), made at startup by ``load``."""
    model: Model = request.app.state.model
    return model


ModelDep = Annotated[Model, Depends(get_model)]
EngineDep = Annotated[ss.Engine, Depends(serving.get_engine)]


async def load(app: FastAPI, eng: ss.Engine) -> None:
    """At startup: compile the model for batched calls and trace it, so no request pays for the trace."""
    app.state.model = eng.compile(forward, batch_axis=0, name="mlp")
    await app.state.model(np.zeros((1, IN_FEATURES)))


def create_app(config: ss.Config | None = None, *, retry_after: int = serving.RETRY_AFTER_S) -> FastAPI:
    """The service: ``app.state.engine`` and ``app.state.model`` exist while its lifespan runs."""
    handlers = serving.exception_handlers(retry_after=retry_after) | {RequestValidationError: bad_row}
    app = FastAPI(lifespan=serving.lifespan(config, setup=load), exception_handlers=handlers)
    app.router.route_class = BoundedRoute  # for the routes added below

    @app.post("/predict")
    async def predict(row: Row, request: Request, model: ModelDep) -> Prediction:
        """The model's outputs for the row; dropped if the client leaves before its call runs."""
        call = model(np.array([row.x]))  # ss.QueueFull at the engine's limits: a 503
        y = await serving.while_connected(request, call)
        return Prediction(y=y[0].tolist())

    @app.post("/predict-sync")
    def predict_sync(row: Row, model: ModelDep) -> Prediction:
        """The same from a ``def`` endpoint, in one of FastAPI's worker threads."""
        call = model(np.array([row.x]))  # callable from any thread, batched with the async endpoint's calls
        try:
            y = call.result(timeout=RESULT_TIMEOUT_S)
        except TimeoutError as exc:
            call.cancel()  # not wanted any more, if it has not started
            raise HTTPException(504, f"no result within {RESULT_TIMEOUT_S} s") from exc
        return Prediction(y=y[0].tolist())

    @app.get("/stats")
    async def stats(eng: EngineDep, model: ModelDep) -> dict[str, Any]:
        """The engine's ``eng.stats()`` figures and the model's, its batches too."""
        return {"engine": eng.stats().as_dict(), "model": model.stats()}

    return app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--cpu-workers", type=int, default=None, help="engine worker threads")
    parser.add_argument("--max-pending", type=int, default=None, help="engine tasks (calls) admitted at once")
    parser.add_argument(
        "--retry-after", type=int, default=serving.RETRY_AFTER_S, help="seconds a 503 tells clients to wait"
    )
    parser.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds running requests get at shutdown"
    )
    return parser.parse_args(argv)


def server_config(argv: Sequence[str] | None = None, **uvicorn_options: Any) -> uvicorn.Config:
    """The uvicorn settings the script runs with (``uvicorn_options`` override them)."""
    args = parse_args(argv)
    engine_options = {"cpu_workers": args.cpu_workers, "max_pending": args.max_pending}
    config = ss.Config(**{k: v for k, v in engine_options.items() if v is not None})
    options: dict[str, Any] = {
        "host": HOST,
        "port": args.port,
        "lifespan": "on",  # a failing startup stops the server instead of serving without an engine
        "ws": "none",  # HTTP only
        "timeout_graceful_shutdown": args.graceful_timeout,
    }
    return uvicorn.Config(create_app(config, retry_after=args.retry_after), **(options | uvicorn_options))


def main(argv: Sequence[str] | None = None) -> None:
    # Ctrl-C or SIGTERM: a graceful shutdown; uvicorn raises Ctrl-C's KeyboardInterrupt again once it is done
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(server_config(argv)).run()


if __name__ == "__main__":
    main()
