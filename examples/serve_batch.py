"""An async web service whose requests are batched: Starlette + uvicorn, one image per ``POST /predict``, and
the rows of concurrent requests run together through ``eng.compile(forward, batch_axis=0)``.

Run: ``python examples/serve_batch.py [--port 8000] [--max-batch 256] [--help]``
(needs the ``examples`` extra: ``pip install '.[examples]'``), then::

    python -c 'import json; print(json.dumps({"pixels": [4] * 64}))' | curl -s -X POST 127.0.0.1:8000/predict -d @-
    curl -s 127.0.0.1:8000/stats

- The model has the size of scikit-learn's digits classifier: 8x8 images of pixels 0..16 (64 inputs) ->
  128 -> 64 -> 10 scores, with ReLU, weights from a fixed seed.
- Each request makes one call of one row, ``model(x)``, and awaits it. Each call is a task of its own; the
  worker that takes one also takes the other calls waiting, up to ``--max-batch`` rows, and runs them as
  one replay (a call that finds a worker free runs at once, alone; none waits for more to come), and every
  request gets its own row back: what ``forward`` returns on that row alone, to within rounding (the batch
  runs one matrix product per layer, which may round a row in its last bits otherwise than a one-row
  product: float64 about 1e-15 relative). Compile with ``exact=True`` for the bits of the lone call, at
  the cost of a product per row.
- The engine lives in the app's lifespan, ``serving.lifespan(config, setup=load)``: opened at startup, where
  ``load`` compiles the model and traces it (proving it keeps rows apart) on a row of zeros, so no request
  pays for it; closed at shutdown with ``eng.aclose()``, which finishes the calls of requests still in flight.
- Admission: when the engine is at ``max_pending`` tasks (calls) or ``max_pending_bytes``, ``model(x)``
  raises ``ss.QueueFull``, which ``serving.add_exception_handlers(app)`` answers with 503 and a
  ``Retry-After`` header (and ``ss.EngineClosed``, while the server shuts down, too): the client retries
  later and the server's memory stays bounded.
- It binds 127.0.0.1 only: put a reverse proxy in front of it to serve other hosts.
"""

from __future__ import annotations

import argparse
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
PIXELS, CLASSES, MAX_PIXEL = 64, 10, 16
MAX_BODY_BYTES = 1 << 16

_RNG = np.random.default_rng(19)  # fixed seed: the same weights in every run
_SIZES = [(PIXELS, 128), (128, 64), (64, CLASSES)]
W1, B1, W2, B2, W3, B3 = (
    a
    for n, m in _SIZES
    for a in (_RNG.standard_normal((n, m)) * math.sqrt(2 / n), _RNG.standard_normal(m) * 0.1)
)


def forward(x: np.ndarray) -> np.ndarray:
    """The model on rows of pixels: a three-layer MLP with ReLU, plain NumPy (``eng.compile`` traces it)."""
    h = np.maximum(x @ W1 + B1, 0)
    h = np.maximum(h @ W2 + B2, 0)
    return h @ W3 + B3


class BadRequest(Exception):
    """The request cannot be served as sent; the message says what to change."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_pixels(body: bytes) -> np.ndarray:
    """``{"pixels": [p0, ..., p63]}`` as one float64 row, shape (1, PIXELS)."""
    try:
        x = np.array(json.loads(body)["pixels"], dtype=np.float64)
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise BadRequest(
            f'the body is nested too deeply to parse: send JSON {{"pixels": [{PIXELS} numbers 0 to {MAX_PIXEL}]}}'
        ) from exc
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise BadRequest(f'send JSON {{"pixels": [{PIXELS} numbers 0 to {MAX_PIXEL}]}}: {exc}') from exc
    if x.shape != (PIXELS,):
        raise BadRequest(f"pixels must be a list of {PIXELS} numbers (an 8x8 image), got shape {x.shape}")
    if not ((x >= 0) & (x <= MAX_PIXEL)).all():  # NaN too: its comparisons are False
        raise BadRequest(f"pixels must be numbers from 0 to {MAX_PIXEL}")
    return x.reshape(1, PIXELS)


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES: by its Content-Length before any of it is read,
    and a chunked one as soon as it passes the limit."""
    too_large = BadRequest(f"the body is over {MAX_BODY_BYTES} bytes: send one image of {PIXELS} pixels", 413)
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
    """POST /predict: the scores of the ten digits for the image sent, and the likeliest digit."""
    try:
        x = parse_pixels(await read_body(request))
    except BadRequest as exc:
        return JSONResponse({"detail": str(exc)}, exc.status)
    call = request.app.state.model(x)  # one row, batched with the rows of the requests made meanwhile
    scores = (await call)[0]  # this request's own row of its batch's output
    return JSONResponse({"digit": int(np.argmax(scores)), "scores": scores.tolist()})


async def stats(request: Request) -> JSONResponse:
    """GET /stats: the engine's ``eng.stats()`` figures and the model's, its batches and their sizes too."""
    state = request.app.state
    return JSONResponse({"engine": state.engine.stats().as_dict(), "model": state.model.stats()})


def create_app(config: ss.Config | None = None, *, max_batch: int = 256) -> Starlette:
    """The service: ``app.state.engine`` and ``app.state.model`` exist while its lifespan runs."""

    async def load(app: Starlette, eng: ss.Engine) -> None:
        app.state.model = model = eng.compile(forward, batch_axis=0, max_batch=max_batch, name="digits")
        await model(np.zeros((1, PIXELS)))  # traced and verified now, not on a request's time

    app = Starlette(
        routes=[Route("/predict", predict, methods=["POST"]), Route("/stats", stats, methods=["GET"])],
        lifespan=serving.lifespan(config, setup=load),
    )
    serving.add_exception_handlers(app)
    app.state.max_batch = max_batch
    return app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--cpu-workers", type=int, default=None, help="engine worker threads")
    parser.add_argument("--max-pending", type=int, default=None, help="engine tasks (calls) admitted at once")
    parser.add_argument("--max-batch", type=int, default=256, help="rows per batch at most (256)")
    parser.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds running requests get at shutdown"
    )
    return parser.parse_args(argv)


def server_config(argv: Sequence[str] | None = None, **uvicorn_options: Any) -> uvicorn.Config:
    """The uvicorn settings ``python examples/serve_batch.py`` runs with (``uvicorn_options`` override them)."""
    args = parse_args(argv)
    engine_options = {"cpu_workers": args.cpu_workers, "max_pending": args.max_pending}
    config = ss.Config(**{k: v for k, v in engine_options.items() if v is not None})
    app = create_app(config, max_batch=args.max_batch)
    options: dict[str, Any] = {
        "host": HOST,
        "port": args.port,
        "lifespan": "on",  # a failing startup stops the server instead of serving without an engine
        "ws": "none",  # HTTP only
        "timeout_graceful_shutdown": args.graceful_timeout,
    }
    return uvicorn.Config(app, **(options | uvicorn_options))


def main(argv: Sequence[str] | None = None) -> None:
    uvicorn.Server(server_config(argv)).run()  # Ctrl-C or SIGTERM: a graceful shutdown


if __name__ == "__main__":
    main()
