"""A Starlette service over schedsvc with ``schedsvc.serving``: one row per ``POST /predict``, batched.

Run: ``python examples/serve_starlette.py [--port 8000] [--max-pending 64] [--retry-after 1] [--help]``
(needs the ``examples`` extra: ``pip install '.[examples]'``), then::

    curl -s -X POST 127.0.0.1:8000/predict -d '{"x": [0.5, -1, 2, 0, 1, 1, 0, 0, 3, 1, 0, 2, 1, 0, 1, 1]}'
    curl -s 127.0.0.1:8000/stats

- ``lifespan=serving.lifespan(config, setup=load)``: the engine is opened at startup, where ``load``
  compiles the model with ``batch_axis=0`` and traces it, and closed at shutdown (the calls already accepted
  finish first).
- Each request is one call of one row, ``model(x)``; the rows of the requests that queue while the workers are
  busy run as one batch, and each request gets its own row back.
- ``serving.add_exception_handlers(app)``: at the engine's limits ``model(x)`` raises ``ss.QueueFull``, and
  while the engine closes ``ss.EngineClosed``; both are answered ``503`` with ``Retry-After``.
- ``serving.while_connected(request, call)``: a request whose client goes away before its call runs is
  dropped, its call cancelled and taken out of its batch.
- Bad input is a 400 whose message says what to send (not JSON, nested too deeply, not 16 finite numbers), and
  a body over ``MAX_BODY_BYTES`` a 413: refused by its ``Content-Length``, or, sent chunked, as soon as it
  passes the limit.
- It binds 127.0.0.1 only: put a reverse proxy in front of it to serve other hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import schedsvc as ss
from schedsvc import serving

HOST = "127.0.0.1"
IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4
MAX_BODY_BYTES = 1 << 14  # a row of 16 numbers is well under 1 KiB

_RNG = np.random.default_rng(7)  # fixed seed: the same weights in every run
W1 = _RNG.standard_normal((IN_FEATURES, HIDDEN)) / math.sqrt(IN_FEATURES)
B1 = _RNG.standard_normal(HIDDEN) * 0.1
W2 = _RNG.standard_normal((HIDDEN, OUT_FEATURES)) / math.sqrt(HIDDEN)
B2 = _RNG.standard_normal(OUT_FEATURES) * 0.1


def forward(x: np.ndarray) -> np.ndarray:
    """The model on rows: a two-layer MLP with ReLU, plain NumPy (``eng.compile`` traces it)."""
    return np.maximum(x @ W1 + B1, 0) @ W2 + B2


class BadRequest(Exception):
    """The request cannot be served as sent; the message says what to change."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_row(body: bytes) -> np.ndarray:
    """``{"x": [16 finite numbers]}`` as one float64 row, shape (1, IN_FEATURES)."""
    try:
        x = np.array(json.loads(body)["x"], dtype=np.float64)
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise BadRequest(
            f'the body is nested too deeply to parse: send JSON {{"x": [{IN_FEATURES} numbers]}}'
        ) from exc
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise BadRequest(f'send JSON {{"x": [{IN_FEATURES} numbers]}}: {exc}') from exc
    if x.shape != (IN_FEATURES,):
        raise BadRequest(f"x must be a list of {IN_FEATURES} numbers, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise BadRequest(f"x must be {IN_FEATURES} finite numbers: no NaN or Infinity")
    return x.reshape(1, IN_FEATURES)


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES: by its Content-Length before any of it is read,
    and a chunked one as soon as it passes the limit."""
    too_large = BadRequest(
        f"the body is over {MAX_BODY_BYTES} bytes: send one row of {IN_FEATURES} numbers", 413
    )
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


async def predict(request: Request) -> JSONResponse:
    """POST /predict: the model's outputs for the row sent."""
    try:
        x = parse_row(await read_body(request))  # read before while_connected listens on the connection
    except BadRequest as exc:
        return JSONResponse({"detail": str(exc)}, exc.status)
    call = request.app.state.model(x)  # one row; ss.QueueFull at the engine's limits: a 503
    y = await serving.while_connected(request, call)  # the client left: cancelled, and no answer
    return JSONResponse({"y": y[0].tolist()})


async def stats(request: Request) -> JSONResponse:
    """GET /stats: the engine's ``eng.stats()`` figures and the model's, its batches too."""
    eng = serving.get_engine(request)
    return JSONResponse({"engine": eng.stats().as_dict(), "model": request.app.state.model.stats()})


async def load(app: Starlette, eng: ss.Engine) -> None:
    """At startup: compile the model for batched calls and trace it, so no request pays for the trace."""
    app.state.model = eng.compile(forward, batch_axis=0, name="mlp")
    await app.state.model(np.zeros((1, IN_FEATURES)))


def create_app(config: ss.Config | None = None, *, retry_after: int = serving.RETRY_AFTER_S) -> Starlette:
    """The service: ``app.state.engine`` and ``app.state.model`` exist while its lifespan runs."""
    app = Starlette(
        routes=[Route("/predict", predict, methods=["POST"]), Route("/stats", stats, methods=["GET"])],
        lifespan=serving.lifespan(config, setup=load),
    )
    serving.add_exception_handlers(app, retry_after=retry_after)
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
