"""The web service ``schedsvc bench serve`` measures: Starlette on uvicorn, one variant of ``POST /predict``.

Run by the bench in a process of its own, one per variant and model::

    python -m schedsvc.cli.bench._serve_app VARIANT MODEL [--max-pending N] [--cpus LIST] [--processes N]

It binds a free port on 127.0.0.1 only, and once its startup is done (the engine open, the model traced)
writes ``ready PORT PID...`` on stdout (the pids of its processes).  It stops at SIGTERM or Ctrl-C, and by
itself when the process that started it goes away, so that no server outlives its bench.

``--processes N``: N processes serve one listening socket, each with its own event loop, app and engine.
This one binds the socket and starts the N - 1 others (``--fd FD``: the socket, inherited), writes
``ready`` once every one serves, and stops them when it stops; each of them stops by itself when this one
is gone (killed).  ``--cpus LIST``: the cores of the whole server, split in N contiguous shares, one per
process (each process pinned to its share; default: the cores this process may run on, pinned only for
N > 1), so that each engine starts a worker per core of its share.

Routes: ``POST /predict`` takes ``{"x": [IN numbers]}`` (one row) and answers ``{"y": [OUT numbers]}``, the
model's output for the row; ``GET /health`` answers ``ok`` from the event loop, without the model, with the
answering process's pid in an ``X-Pid`` header.  The variants differ only in how ``/predict`` runs the
model (``VARIANTS``).  The model is a float32 MLP with ReLU whose weights come from a fixed seed
(``MODELS``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np

from ._serve_procs import (
    Cores,
    format_cpu_list,
    parse_cpu_list,
    pin_process,
    server_shares,
    stop_processes,
    thread_pinned,
)

__all__ = [
    "ENGINE_VARIANTS",
    "MODELS",
    "HandBatcher",
    "OVERLOAD",
    "VARIANTS",
    "create_app",
    "make_forward",
    "main",
    "model_weights",
    "parse_row",
    "request_row",
]

#: layer sizes of each model: inputs, hidden layers, outputs
MODELS: dict[str, tuple[int, ...]] = {"digits": (64, 128, 64, 10), "wide": (64, 1024, 1024, 10)}
#: how ``/predict`` runs the model, by variant
VARIANTS: dict[str, str] = {
    "none": "no model: a constant of the output's shape (the HTTP ceiling of this stack)",
    "inline": "forward(x) on the event loop",
    "to_thread": "await anyio.to_thread.run_sync(forward, x), BLAS at its default threads",
    "to_thread_pinned": "await anyio.to_thread.run_sync(forward, x), BLAS at 1 thread",
    "submit": "await (await eng.submit(forward, x))",
    "batched": "await model(x), model = eng.compile(forward, batch_axis=0) (the default mode: one matrix product per layer for the batch)",
    "batched_exact": "await model(x), model = eng.compile(forward, batch_axis=0, exact=True)",
    "batched_fast": "await model(x), model = eng.compile(forward, batch_axis=0, exact=False)",
    "handmade": "await batcher(x): a hand-written batcher, no engine (a list, one thread, one loop wake per batch)",
    "ray": "Ray Serve, @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.002), 1 replica",
}
#: the overload variant: ``batched`` with a small ``max_pending`` (given on the command line)
OVERLOAD = "overload"
#: the variants served by an engine, and the options of their compile (None: submit, not compile)
ENGINE_VARIANTS: dict[str, dict[str, Any] | None] = {
    "submit": None,
    "batched": {},
    "batched_exact": {"exact": True},
    "batched_fast": {"exact": False},
    OVERLOAD: {},
}
#: the seed of every model's weights
SEED = 2024
HOST = "127.0.0.1"
#: seconds between two checks that the process that started this one is still there
PARENT_POLL_S = 0.5
#: seconds the other processes of a server get to stop after SIGTERM before they are killed
WORKER_STOP_S = 5.0
#: this module's name, as ``python -m`` takes it (``__name__`` is ``__main__`` when it runs so)
MODULE = __spec__.name if __spec__ is not None else __name__


# -- the model ---------------------------------------------------------------------------------------------


def model_weights(model: str) -> list[np.ndarray]:
    """Weights and biases of ``model``, float32, He-initialised from a fixed seed."""
    rng = np.random.default_rng(SEED)
    sizes = MODELS[model]
    out: list[np.ndarray] = []
    for n, m in itertools.pairwise(sizes):
        out.append((rng.standard_normal((n, m)) * np.sqrt(2 / n)).astype(np.float32))
        out.append((rng.standard_normal(m) * 0.1).astype(np.float32))
    return out


def make_forward(model: str) -> Callable[[Any], Any]:
    """The model as a function of its rows: Dense layers with ReLU between them (NumPy arrays or Tensors)."""
    weights = model_weights(model)
    layers = list(zip(weights[::2], weights[1::2], strict=True))

    def forward(x: Any) -> Any:
        for w, b in layers[:-1]:
            x = np.maximum(x @ w + b, 0)
        w, b = layers[-1]
        return x @ w + b

    return forward


def request_row(model: str) -> list[float]:
    """The row every request sends: digits-like pixels, whole values 0..16 from a fixed seed."""
    rng = np.random.default_rng(SEED)
    return [float(v) for v in rng.integers(0, 17, MODELS[model][0])]


class BadRow(ValueError):
    """A request's body is not one row of the model's inputs."""


def parse_row(body: bytes, n_in: int) -> np.ndarray:
    """``{"x": [n_in finite numbers]}`` as one float32 row, shape (1, n_in)."""
    try:
        x = np.array(json.loads(body)["x"], dtype=np.float32)
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise BadRow(f'the body is nested too deeply to parse: send JSON {{"x": [{n_in} numbers]}}') from exc
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise BadRow(f'send JSON {{"x": [{n_in} numbers]}}: {exc}') from exc
    if x.shape != (n_in,) or not np.isfinite(x).all():
        raise BadRow(f"x must be a list of {n_in} finite numbers, got shape {x.shape}")
    return x.reshape(1, n_in)


# -- a batcher with no engine --------------------------------------------------------------------------------


class HandBatcher:
    """The ``handmade`` variant: the least a batcher does, to measure the engine's own cost against.

    A call queues its rows with a future of the loop; one thread takes what is queued (at most
    ``max_batch`` calls), runs ``forward`` once on their rows with BLAS at 1 thread, and wakes the loop
    once to hand each caller its rows.  Nothing else: no admission limits, no ordering against other
    work, no cancellation before the run, no split of a batch that raises (each caller gets its error).
    At ``stop()`` the calls still queued fail with ``RuntimeError``, as does a call made after it.
    """

    def __init__(self, forward: Callable[[Any], Any], max_batch: int = 256) -> None:
        self.forward = forward
        self.max_batch = max_batch
        self.queue: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = []
        self.ready = threading.Condition()
        self.closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._run, name="handmade-batcher", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Take no more calls; the thread ends after the batch it runs, and the calls still queued fail."""
        with self.ready:
            self.closed = True
            self.ready.notify()

    def stop(self) -> None:
        """``close()``, and wait for the thread to end."""
        self.close()
        if self.thread is not None:
            self.thread.join(timeout=10)

    async def __call__(self, x: np.ndarray) -> np.ndarray:
        assert self.loop is not None, "start() the batcher first"
        future = self.loop.create_future()
        with self.ready:
            if self.closed:
                raise RuntimeError("the batcher is stopped")
            self.queue.append((x, future))
            self.ready.notify()
        return await future  # type: ignore[no-any-return]

    def _run(self) -> None:
        from threadpoolctl import threadpool_limits

        try:
            with threadpool_limits(limits=1):
                while True:
                    with self.ready:
                        while not self.queue and not self.closed:
                            self.ready.wait()
                        if self.closed:
                            return
                        batch, self.queue = self.queue[: self.max_batch], self.queue[self.max_batch :]
                    try:
                        out: Any = self.forward(np.concatenate([x for x, _ in batch]))
                    except Exception as exc:  # each caller gets the error
                        out = exc
                    self._hand(batch, out)
        finally:  # stopped (or the thread failed): nobody will run what is queued
            with self.ready:
                self.closed = True
                left, self.queue = self.queue, []
            if left:
                self._hand(left, RuntimeError("the batcher stopped before this call ran"))

    def _hand(self, batch: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]], out: Any) -> None:
        assert self.loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits there any more
            self.loop.call_soon_threadsafe(_hand_out, batch, out)


def _hand_out(batch: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]], out: Any) -> None:
    """On the loop: each caller's rows of the batch's output (or its error)."""
    start = 0
    for x, future in batch:
        stop = start + len(x)
        if future.done():  # the caller gave up (cancelled)
            pass
        elif isinstance(out, Exception):
            future.set_exception(out)
        else:
            future.set_result(out[start:stop])
        start = stop


# -- the app -----------------------------------------------------------------------------------------------


def _predictor(variant: str, forward: Callable[[Any], Any], n_out: int) -> Callable[[Any, Any], Any]:
    """``async (request, x) -> row``: how ``/predict`` runs the model in ``variant``."""
    import anyio.to_thread

    from schedsvc import serving

    if variant == "none":
        constant = np.zeros(n_out, dtype=np.float32)

        async def none(request: Any, x: np.ndarray) -> np.ndarray:
            return constant

        return none
    if variant == "inline":

        async def inline(request: Any, x: np.ndarray) -> np.ndarray:
            return forward(x)[0]  # type: ignore[no-any-return]

        return inline
    if variant in ("to_thread", "to_thread_pinned"):

        async def to_thread(request: Any, x: np.ndarray) -> np.ndarray:
            return (await anyio.to_thread.run_sync(forward, x))[0]  # type: ignore[no-any-return]

        return to_thread
    if variant == "handmade":

        async def handmade(request: Any, x: np.ndarray) -> np.ndarray:
            return (await request.app.state.batcher(x))[0]  # type: ignore[no-any-return]

        return handmade
    if variant == "submit":

        async def submit(request: Any, x: np.ndarray) -> np.ndarray:
            eng = serving.get_engine(request)
            return (await (await eng.submit(forward, x)))[0]  # type: ignore[no-any-return]

        return submit

    async def batched(request: Any, x: np.ndarray) -> np.ndarray:
        return (await request.app.state.model(x))[0]  # type: ignore[no-any-return]

    return batched


def create_app(variant: str, model: str, *, max_pending: int | None = None) -> Any:
    """The Starlette app of ``variant`` (not ``ray``) serving ``model``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from schedsvc import Config, serving

    sizes = MODELS[model]
    forward = make_forward(model)
    run = _predictor(variant, forward, sizes[-1])

    async def predict(request: Request) -> Response:
        try:
            x = parse_row(await request.body(), sizes[0])
        except BadRow as exc:
            return JSONResponse({"detail": str(exc)}, 400)
        return JSONResponse({"y": (await run(request, x)).tolist()})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok", headers={"X-Pid": str(os.getpid())})

    routes = [Route("/predict", predict, methods=["POST"]), Route("/health", health, methods=["GET"])]
    if variant == "handmade":

        @contextlib.asynccontextmanager
        async def batcher(app: Any) -> AsyncIterator[None]:
            app.state.batcher = HandBatcher(forward)
            app.state.batcher.start()
            try:
                yield
            finally:
                app.state.batcher.stop()

        return Starlette(routes=routes, lifespan=batcher)
    if variant not in ENGINE_VARIANTS:
        return Starlette(routes=routes)
    options = ENGINE_VARIANTS[variant]

    async def load(app: Any, eng: Any) -> None:
        """Compile the model (batched variants) and run it once, so that no request pays for a trace."""
        if options is not None:
            app.state.model = eng.compile(forward, batch_axis=0, name=model, **options)
            await app.state.model(np.zeros((1, sizes[0]), np.float32))

    config = Config() if max_pending is None else Config(max_pending=max_pending)
    return Starlette(
        routes=routes,
        lifespan=serving.lifespan(config, setup=load),
        exception_handlers=serving.exception_handlers(),
    )


# -- the server --------------------------------------------------------------------------------------------


def _listening_socket() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1 (the server takes it: no race for the port)."""
    # proto given: asyncio sets TCP_NODELAY on the connections only of a socket whose proto is TCP, and
    # without it each answer on a kept-alive connection waits ~40 ms for the client's delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    sock.listen(2048)
    return sock


def _say_ready(port: int, pids: Sequence[int] = ()) -> None:
    print(" ".join(["ready", str(port), *map(str, pids)]), flush=True)


async def _watch_parent(parent: int, stop: Callable[[], None]) -> None:
    """Stop the server once the process that started it is gone (it was killed: nobody will stop us)."""
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_POLL_S)
    stop()


async def _serve_uvicorn(
    app: Any, sock: socket.socket, workers: Sequence[subprocess.Popen[bytes]] = ()
) -> bool:
    """Serve ``app`` on ``sock`` until told to stop; whether it started, and ``workers`` (the server's other
    processes) with it: ``ready`` is written once every one serves."""
    import uvicorn

    config = uvicorn.Config(app, lifespan="on", ws="none", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    watch = asyncio.ensure_future(_watch_parent(os.getppid(), lambda: setattr(server, "should_exit", True)))
    started = False
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            started = await _workers_ready(workers, serving)
        if started:
            _say_ready(sock.getsockname()[1], [os.getpid(), *(w.pid for w in workers)])
        elif server.started:
            print("a process of the server failed to start (its words are above)", file=sys.stderr)
            server.should_exit = True
        await serving
    finally:
        watch.cancel()
    return started


async def _workers_ready(workers: Sequence[subprocess.Popen[bytes]], serving: asyncio.Future[Any]) -> bool:
    """Wait for each worker's ``ready`` line; False where one ends before it, or this one stops meanwhile."""
    waiting = [w.stdout for w in workers if w.stdout is not None]
    while waiting and not serving.done():
        readable = select.select(waiting, [], [], 0)[0]
        for out in readable:
            if not out.readline().startswith(b"ready "):  # it ended (EOF) before it served
                return False
        waiting = [out for out in waiting if out not in readable]
        if waiting:
            await asyncio.sleep(0.01)
    return not waiting and not serving.done()


def _start_worker(args: argparse.Namespace, cores: Cores, sock: socket.socket) -> subprocess.Popen[bytes]:
    """Another process of the server: this variant and model served on ``sock``, pinned to ``cores`` from
    its start; its ``ready`` line comes to this process, its errors go where this one's go."""
    cmd = [sys.executable, "-m", MODULE, args.variant, args.model, "--cpus", format_cpu_list(cores)]
    cmd += ["--fd", str(sock.fileno())]
    if args.max_pending is not None:
        cmd += ["--max-pending", str(args.max_pending)]
    with thread_pinned(cores):
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, pass_fds=[sock.fileno()]
        )


def _exit_on_signal(signum: int, frame: Any) -> None:
    """SIGTERM in a server of several processes: unwind (uvicorn raises the signal again once it has shut
    down), so that the server's other processes are stopped on the way out."""
    raise SystemExit(128 + signum)


def _serve_ray(model: str) -> None:
    """The ``ray`` variant: a Ray Serve deployment of 1 replica, its calls batched by ``@serve.batch``."""
    import time

    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    sizes = MODELS[model]
    forward = make_forward(model)

    class Predict:
        @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.002)
        async def rows(self, xs: list[np.ndarray]) -> list[list[float]]:
            return forward(np.concatenate(xs)).tolist()  # type: ignore[no-any-return]

        async def __call__(self, request: Request) -> Response:
            if request.url.path.rstrip("/").endswith("/health"):
                return PlainTextResponse("ok")
            try:
                x = parse_row(await request.body(), sizes[0])
            except BadRow as exc:
                return JSONResponse({"detail": str(exc)}, 400)
            return JSONResponse({"y": await self.rows(x)})

    sock = _listening_socket()  # a free port, handed to Ray's proxy (it binds its own socket)
    port = sock.getsockname()[1]
    sock.close()
    serve.start(http_options={"host": HOST, "port": port})
    serve.run(serve.deployment(num_replicas=1)(Predict).bind(), route_prefix="/")
    _say_ready(port)
    parent = os.getppid()
    try:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
    finally:
        serve.shutdown()


def _cpu_list(text: str) -> Cores:
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("variant", choices=[*VARIANTS, OVERLOAD])
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--max-pending", type=int, default=None, help="the engine's max_pending")
    parser.add_argument("--cpus", type=_cpu_list, help="the server's cores, split among its processes")
    parser.add_argument("--processes", type=int, default=1, help="processes serving one socket (default 1)")
    parser.add_argument(
        "--fd", type=int, help="serve on this inherited listening socket (one of --processes)"
    )
    args = parser.parse_args(argv)
    try:
        args.shares = server_shares(args.cpus, args.processes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.variant == "ray" and (args.processes > 1 or args.fd is not None):
        parser.error("ray runs one process of its own: no --processes, no --fd")
    if args.fd is not None and args.processes > 1:
        parser.error("--fd: a process of a server, which starts no other")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM, Ctrl-C, or the parent's exit; the exit status."""
    args = _parse_args(argv)
    if args.shares is not None:  # a pinned server: this process on the first share, the others on theirs
        pin_process(args.shares[0])
    if args.variant == "ray":
        _serve_ray(args.model)
        return 0
    if args.variant == "to_thread_pinned":
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)  # for the life of this process: every thread's BLAS at 1 thread
    sock = (
        _listening_socket()
        if args.fd is None
        else socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=args.fd)
    )
    workers: list[subprocess.Popen[bytes]] = []
    started = False
    try:
        if args.shares is not None and len(args.shares) > 1:
            signal.signal(signal.SIGTERM, _exit_on_signal)
            workers += (_start_worker(args, share, sock) for share in args.shares[1:])
        with contextlib.suppress(KeyboardInterrupt):
            app = create_app(args.variant, args.model, max_pending=args.max_pending)
            started = asyncio.run(_serve_uvicorn(app, sock, workers))
    finally:
        stop_processes(workers, WORKER_STOP_S)
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
