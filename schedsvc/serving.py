"""Serving an engine from Starlette and FastAPI apps (``pip install 'schedsvc[serve]'``).

Its pieces, each usable alone::

    import numpy as np
    from fastapi import FastAPI, Request
    import schedsvc as ss
    from schedsvc import serving

    async def load(app, eng):  # run at startup, before the first request
        app.state.model = eng.compile(forward, batch_axis=0)

    app = FastAPI(
        # opens and closes the engine
        lifespan=serving.lifespan(ss.Config(max_pending=64), setup=load),
        # QueueFull, EngineClosed: 503
        exception_handlers=serving.exception_handlers(retry_after=1),
    )

    @app.post("/predict")
    async def predict(row: Row, request: Request):
        # QueueFull at the limits: a 503
        call = request.app.state.model(np.array([row.x]))
        # dropped if the client left
        y = await serving.while_connected(request, call)
        return {"y": y[0].tolist()}

    @app.post("/predict-sync")
    def predict_sync(row: Row, request: Request):  # run in a worker thread
        call = request.app.state.model(np.array([row.x]))
        return {"y": call.result(timeout=30)[0].tolist()}

- ``lifespan(config, setup=...)`` is the app's ``lifespan=``: it opens an ``ss.Engine`` at startup, sets
  ``app.state.engine``, awaits ``setup(app, eng)``, and closes the engine at shutdown (``eng.aclose()``:
  the work already accepted finishes).  ``get_engine`` gives the engine to a handler, or to FastAPI as a
  dependency: ``eng: Annotated[ss.Engine, Depends(serving.get_engine)]``.
- ``exception_handlers()`` maps ``ss.QueueFull`` (the engine is at its limits) and ``ss.EngineClosed`` (it is
  shutting down) to ``503 Service Unavailable`` with a ``Retry-After`` header, and a request whose client
  left (``ClientDisconnect``) to a 499 that nobody receives, instead of a 500 in the server's log; pass it as
  ``exception_handlers=``, or call ``add_exception_handlers(app)``.  Each 503 is a warning on the
  ``schedsvc.serving`` logger, with the request and why: the first at once, then at most one a minute that
  counts the others, so a flood of refusals is a few lines in the server's log, not one per request.
- ``while_connected(request, call)`` awaits an engine future (or any awaitable) while it watches the
  request's connection: when the client goes away first, the call is cancelled -- one that has not started
  never runs, and a batched call leaves its batch -- and ``ClientDisconnect`` is raised.
- Calls from ``def`` endpoints (which Starlette and FastAPI run in worker threads) are made as from
  coroutines, ``model(x)``, and waited for with ``call.result(timeout)``.

Starlette is imported by this module only: ``import schedsvc`` never imports it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

import anyio

from . import Config, Engine, EngineClosed, Future, QueueFull, SchedsvcError
from ._logging import SERVING, Throttled

try:
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without Starlette
    raise ImportError(
        f"schedsvc.serving needs Starlette ({exc}); install it with: pip install 'schedsvc[serve]'"
    ) from exc

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "RETRY_AFTER_S",
    "add_exception_handlers",
    "exception_handlers",
    "get_engine",
    "lifespan",
    "while_connected",
]

T = TypeVar("T")
AppT = TypeVar("AppT", bound="Starlette")

#: seconds a refused client is told to wait (``Retry-After``): the queue of an engine at its limits drains in
#: the time its workers take to finish a few tasks, so a short wait is usually enough
RETRY_AFTER_S = 1
#: the status answered to a request whose client left (nginx's "client closed request"); no one receives it
CLIENT_CLOSED_REQUEST = 499

Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]

_log = logging.getLogger(SERVING)


def lifespan(
    config: Config | None = None,
    /,
    *,
    setup: Callable[[AppT, Engine], Awaitable[None]] | None = None,
    **overrides: Any,
) -> Callable[[AppT], AbstractAsyncContextManager[None]]:
    """The ``lifespan=`` of a Starlette or FastAPI app: an engine open while the app serves.

    At each startup it opens a new ``ss.Engine(config, **overrides)``, sets
    ``app.state.engine`` and awaits ``setup(app, eng)`` (compile and warm up
    models there, so no request pays for a trace); an error there stops the
    server's startup.  At shutdown it leaves ``async with eng``, which awaits
    ``eng.aclose()``: the work already accepted finishes first.  Bad settings
    fail here, where the app is made.  To run more startup of your own, enter
    it inside yours::

        @asynccontextmanager
        async def my_lifespan(app):
            async with serving.lifespan(config)(app):
                ...  # app.state.engine is open here
                yield
    """
    if config is not None and not isinstance(config, Config):
        raise TypeError(
            f"serving.lifespan() takes an ss.Config (or settings as keywords), not {type(config).__name__}: "
            "it opens the engine itself at each startup, on the server's event loop"
        )
    settings = Config(**overrides) if config is None else config.replace(**overrides)

    @asynccontextmanager
    async def engine_lifespan(app: AppT) -> AsyncIterator[None]:
        async with Engine(settings) as eng:
            app.state.engine = eng
            if setup is not None:
                await setup(app, eng)
            yield

    return engine_lifespan


def get_engine(request: Request) -> Engine:
    """The engine of the request's app (``app.state.engine``); a FastAPI dependency as it is."""
    eng = getattr(request.app.state, "engine", None)
    if not isinstance(eng, Engine):
        raise SchedsvcError(
            "this app has no engine: pass lifespan=schedsvc.serving.lifespan(...) to Starlette or FastAPI, "
            "and run the server with its lifespan on"
        )
    return eng


def exception_handlers(*, retry_after: int = RETRY_AFTER_S) -> dict[Any, Handler]:
    """Handlers for ``exception_handlers=``: ``QueueFull`` and ``EngineClosed`` are 503s with
    ``Retry-After: <retry_after>`` (seconds), ``ClientDisconnect`` a 499 that no one receives.

    The 503s are logged on ``schedsvc.serving`` at WARNING, at most one record a minute of each kind
    (the first at once; the next says how many were not logged)."""
    if type(retry_after) is not int or retry_after < 0:
        raise ValueError(f"retry_after must be a whole number of seconds, 0 or more; got {retry_after!r}")
    headers = {"Retry-After": str(retry_after)}
    busy_log, closing_log = Throttled(_log), Throttled(_log)

    async def busy(request: Request, exc: Exception) -> Response:
        busy_log.warning(
            "503 to %s %s, Retry-After %d s: %s", request.method, request.scope["path"], retry_after, exc
        )
        detail = f"the service is busy: retry after {retry_after} s"
        return JSONResponse({"detail": detail}, 503, headers=headers)

    async def closing(request: Request, exc: Exception) -> Response:
        closing_log.warning(
            "503 to %s %s, the engine is closing: %s", request.method, request.scope["path"], exc
        )
        detail = "the service is shutting down: retry on another instance, or after it restarts"
        return JSONResponse({"detail": detail}, 503, headers=headers)

    async def gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    return {QueueFull: busy, EngineClosed: closing, ClientDisconnect: gone}


def add_exception_handlers(app: Starlette, *, retry_after: int = RETRY_AFTER_S) -> None:
    """Install ``exception_handlers(retry_after=...)`` on ``app`` (Starlette or FastAPI)."""
    for exc_class, handler in exception_handlers(retry_after=retry_after).items():
        app.add_exception_handler(exc_class, handler)


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client goes away first: then cancel it and raise ``ClientDisconnect``.

    ``work`` is an engine future (a call of a compiled function, a Tensor,
    a submitted task's future) or any awaitable, such as a coroutine that
    waits for room and then for its call: ``await (await model.submit(x))``.
    Cancelling it cancels a call that has not started, as cancelling ``await
    call`` does: it never runs, and a batched call leaves its batch; one that
    runs already finishes, and its result is dropped.  A call still waiting
    for admission is not admitted.  The work's own error is raised as it is.

    Use it once the request's body has been read: it listens on the
    request's ``receive`` channel for the disconnect, as Starlette's
    ``StreamingResponse`` does, and drops body messages it finds there.
    """
    if isinstance(work, Future) and work.done():  # nothing to watch
        return cast(T, await work)
    finished = False
    value: T | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as watching:
        watching.start_soon(_cancel_when_gone, request, watching.cancel_scope)
        try:
            value = await work
        except Exception as exc:  # raised below, outside the task group, which would wrap it in a group
            error = exc
        finished = True
        watching.cancel_scope.cancel()
    if not finished:
        raise ClientDisconnect("the client left before its response was ready; its work was cancelled")
    if error is not None:
        raise error
    return cast(T, value)


async def _cancel_when_gone(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the request's client disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass  # a body message the handler did not read
    scope.cancel()
