"""An async web service over schedsvc: Starlette + uvicorn, a compiled MLP behind ``POST /predict``.

Run: ``python examples/serve.py [--port 8000] [--max-pending 64] [--admission reject|wait] [--help]``
(needs the ``examples`` extra: ``pip install '.[examples]'``), then::

    curl -s -X POST 127.0.0.1:8000/predict -d '{"rows": [[0.5, -1, 2, 0, 1, 1, 0, 0, 3, 1, 0, 2, 1, 0, 1, 1]]}'
    curl -s 127.0.0.1:8000/stats

- The engine lives in the app's lifespan, ``serving.lifespan(config, setup=load)``: opened at startup, where
  ``load`` compiles the model and traces every batch size it takes (so no request pays for a trace), and
  closed at shutdown with ``eng.aclose()``, which finishes the work of requests still in flight. uvicorn
  first stops accepting connections and lets running requests end.
- Each request is one compiled call: one engine task, awaited without blocking the event loop.
- Admission: ``--admission reject`` (the default) calls the model without waiting; at the engine's limits
  (``max_pending`` tasks, ``max_pending_bytes``) that raises ``ss.QueueFull``, which
  ``serving.add_exception_handlers(app)`` answers with 503 and a ``Retry-After`` header (and
  ``ss.EngineClosed``, while the server shuts down, too): the client retries later and the server's memory
  stays bounded.
  ``--admission wait`` awaits ``model.submit(x)`` instead: requests queue for room first come first served
  and none is refused, so the waiting requests themselves are what grows under overload (bound them with
  ``--limit-concurrency``, uvicorn's, which answers 503 past it).
- Engine settings also come from ``SCHEDSVC_*`` environment variables (``SCHEDSVC_CPU_WORKERS=4``).
- It binds 127.0.0.1 only: put a reverse proxy in front of it to serve other hosts.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any, Literal

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
MAX_ROWS = 64  # rows per request
MAX_ABS = 1e6  # input values: bounded, so the outputs are finite (JSON has no infinity)
MAX_BODY_BYTES = 1 << 20
#: a batch is padded to the next of these sizes: the model is traced once per size, at startup
BATCH_SIZES = tuple(2**i for i in range(MAX_ROWS.bit_length()))

_RNG = np.random.default_rng(0)  # fixed seed: the same weights in every run
W1 = _RNG.standard_normal((IN_FEATURES, HIDDEN)) / math.sqrt(IN_FEATURES)
B1 = _RNG.standard_normal(HIDDEN) * 0.1
W2 = _RNG.standard_normal((HIDDEN, OUT_FEATURES)) / math.sqrt(HIDDEN)
B2 = _RNG.standard_normal(OUT_FEATURES) * 0.1

Admission = Literal["reject", "wait"]


def forward(x: np.ndarray) -> np.ndarray:
    """The model: a two-layer MLP with ReLU, plain NumPy (``eng.compile`` traces it)."""
    return np.maximum(x @ W1 + B1, 0) @ W2 + B2


class BadRequest(Exception):
    """The request cannot be served as sent; the message says what to change."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_rows(body: bytes) -> np.ndarray:
    """``{"rows": [[x0, ..., x15], ...]}`` as a float64 array of shape (n, IN_FEATURES)."""
    try:
        rows = json.loads(body)["rows"]
        x = np.array(rows, dtype=np.float64)
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise BadRequest(
            f'the body is nested too deeply to parse: send JSON {{"rows": [[{IN_FEATURES} numbers], ...]}}'
        ) from exc
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise BadRequest(f'send JSON {{"rows": [[{IN_FEATURES} numbers], ...]}}: {exc}') from exc
    if x.ndim != 2 or x.shape[1] != IN_FEATURES or not 1 <= len(x) <= MAX_ROWS:
        raise BadRequest(
            f"rows must be 1 to {MAX_ROWS} lists of {IN_FEATURES} numbers each, got an array of shape {x.shape}"
        )
    if not (np.abs(x) <= MAX_ABS).all():  # NaN too: its comparisons are False
        raise BadRequest(f"rows must hold finite numbers of magnitude at most {MAX_ABS:g}")
    return x


def padded(x: np.ndarray) -> np.ndarray:
    """``x`` with zero rows added up to the next batch size, so a few traces serve every request."""
    size = next(n for n in BATCH_SIZES if n >= len(x))
    batch = np.zeros((size, IN_FEATURES))
    batch[: len(x)] = x
    return batch


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES: by its Content-Length before any of it is read,
    and a chunked one as soon as it passes the limit."""
    too_large = BadRequest(f"the body is over {MAX_BODY_BYTES} bytes: send fewer rows per request", 413)
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
    """POST /predict: the model's outputs for the rows sent."""
    state = request.app.state
    try:
        x = parse_rows(await read_body(request))
    except BadRequest as exc:
        return JSONResponse({"detail": str(exc)}, exc.status)
    batch = padded(x)
    # the call is one engine task (ss.QueueFull at the engine's limits: a 503); its Tensor is awaited below
    out = await state.model.submit(batch) if state.admission == "wait" else state.model(batch)
    return JSONResponse({"outputs": (await out)[: len(x)].tolist()})


async def stats(request: Request) -> JSONResponse:
    """GET /stats: the engine's ``eng.stats()`` figures and the model's trace/replay counts."""
    state = request.app.state
    return JSONResponse({"engine": state.engine.stats().as_dict(), "model": state.model.stats()})


def create_app(config: ss.Config | None = None, *, admission: Admission = "reject") -> Starlette:
    """The service: ``app.state.engine`` and ``app.state.model`` exist while its lifespan runs."""
    if admission not in ("reject", "wait"):
        raise ValueError(f"admission must be 'reject' or 'wait', got {admission!r}")

    async def load(app: Starlette, eng: ss.Engine) -> None:
        app.state.model = model = eng.compile(forward, name="mlp")
        for size in BATCH_SIZES:  # trace now, not on a request's time
            await (await model.submit(np.zeros((size, IN_FEATURES))))

    app = Starlette(
        routes=[Route("/predict", predict, methods=["POST"]), Route("/stats", stats, methods=["GET"])],
        lifespan=serving.lifespan(config, setup=load),
    )
    serving.add_exception_handlers(app)
    app.state.admission = admission
    return app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--cpu-workers", type=int, default=None, help="engine worker threads")
    parser.add_argument("--max-pending", type=int, default=None, help="engine tasks admitted at once")
    parser.add_argument(
        "--admission",
        choices=("reject", "wait"),
        default="reject",
        help="at the engine's limits: answer 503 + Retry-After (reject), or queue the request (wait)",
    )
    parser.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds running requests get at shutdown"
    )
    parser.add_argument(
        "--limit-concurrency", type=int, default=None, help="connections served at once (503 past it)"
    )
    return parser.parse_args(argv)


def server_config(argv: Sequence[str] | None = None, **uvicorn_options: Any) -> uvicorn.Config:
    """The uvicorn settings ``python examples/serve.py`` runs with (``uvicorn_options`` override them)."""
    args = parse_args(argv)
    engine_options = {"cpu_workers": args.cpu_workers, "max_pending": args.max_pending}
    config = ss.Config(**{k: v for k, v in engine_options.items() if v is not None})
    options: dict[str, Any] = {
        "host": HOST,
        "port": args.port,
        "lifespan": "on",  # a failing startup stops the server instead of serving without an engine
        "ws": "none",  # HTTP only
        "timeout_graceful_shutdown": args.graceful_timeout,
        "limit_concurrency": args.limit_concurrency,
    }
    return uvicorn.Config(create_app(config, admission=args.admission), **(options | uvicorn_options))


def main(argv: Sequence[str] | None = None) -> None:
    uvicorn.Server(server_config(argv)).run()  # Ctrl-C or SIGTERM: a graceful shutdown


if __name__ == "__main__":
    main()
