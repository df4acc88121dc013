"""The connection to a Dask cluster: reach (or start) one, and close it.

``connect`` gives an asynchronous ``Client`` on the running loop: to the
scheduler at ``dask_address``, or to a ``LocalCluster`` of ``cpu_workers``
processes started here when no address is set.  A local cluster's worker
processes start by running the main module again (the ``spawn`` method): a
program without a main guard, or read from standard input, gets one error
that says what to do, not a traceback per worker.  ``close`` ends the client
(and the local cluster) within ``CLOSE_TIMEOUT_S``; a close that hangs or
fails is a warning, never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import warnings
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .._errors import DeviceError, SchedsvcError

if TYPE_CHECKING:
    from .._config import Config

__all__ = ["CLOSE_TIMEOUT_S", "Client", "DaskFuture", "LocalCluster", "close", "connect", "worker_threads"]

# Dask's objects, as the dask device's modules see them (distributed is untyped, and optional)
Client = Any
DaskFuture = Any
LocalCluster = Any

CLOSE_TIMEOUT_S = 20.0
_MAIN_GUARD = '`if __name__ == "__main__":`'
_START_A_CLUSTER = "start one with: dask scheduler, and dask worker tcp://HOST:8786 on each machine"


async def connect(config: Config) -> tuple[Client, LocalCluster | None]:
    """An async Client on the running loop, and the LocalCluster started for it if no address is given."""
    distributed = _import_distributed()
    cluster = None
    if config.dask_address is None:
        cluster = await _start_local_cluster(distributed, config)
        address = cluster.scheduler_address
    else:
        address = config.dask_address
    try:
        client = await distributed.Client(
            address, asynchronous=True, set_as_default=False, timeout=config.dask_timeout_s
        )
    except BaseException as exc:
        if cluster is not None:
            await cluster.close()
        if isinstance(exc, OSError | TimeoutError):
            raise SchedsvcError(
                f"backend='dask': could not reach the Dask scheduler at {address!r} ({exc}); "
                "start one (dask scheduler), fix dask_address, or leave it unset for a local cluster"
            ) from exc
        raise
    return client, cluster


async def worker_threads(client: Client, config: Config) -> int:
    """The cluster's worker threads now; ``cpu_workers`` if none has joined yet."""
    try:
        count = sum((await client.nthreads()).values())
    except Exception:  # the scheduler went away just now: the first task will say so; this is a default
        return config.cpu_workers
    return count if count > 0 else config.cpu_workers


async def close(client: Client, cluster: LocalCluster | None) -> None:
    """Close the client, and the local cluster if this engine started it."""
    await _close_quietly(
        "the Dask client",
        client.close(),
        "the scheduler forgets this client's tasks when it notices the client is gone",
    )
    if cluster is not None:
        await _close_quietly(
            "the local Dask cluster",
            cluster.close(),
            "its worker processes end with this process at the latest",
        )


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise SchedsvcError(
            "backend='dask' needs Dask distributed, which is not installed; pip install 'schedsvc[dask]'"
        ) from exc
    return distributed


async def _start_local_cluster(distributed: Any, config: Config) -> LocalCluster:
    """A cluster of ``cpu_workers`` processes here; if its workers cannot start, one error says why."""
    method = _start_method()
    if method != "fork":
        _leave_if_importing_main()
        _check_main_can_run_again(method)
    cluster = distributed.LocalCluster(
        n_workers=config.cpu_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",  # any free port: 8787 may be taken by another cluster
        asynchronous=True,
    )
    try:
        return await cluster
    except Exception as exc:
        with contextlib.suppress(Exception):  # what did start (the scheduler, some workers) stops
            await asyncio.wait_for(cluster.close(), CLOSE_TIMEOUT_S)
        raise DeviceError(_workers_failed(exc, config, method)) from _without_tracebacks(exc)


def _start_method() -> str:
    """How Dask starts worker processes: spawn and forkserver run the main module again in each."""
    import dask

    return str(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))


def _main_module() -> str | None:
    """What a spawned worker runs again before it starts: the main module's file or name, if any."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return None if path is None else str(path)


def _leave_if_importing_main() -> None:
    """In a worker process that is still running the main module, an engine can never start: leave.

    That is a program without a main guard, run again in each worker of the
    cluster its main process is starting.  A traceback per worker would bury
    the main process's error, which says what to do; this is one line each.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # what multiprocessing checks
        main = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main module"
        raise SystemExit(
            f"schedsvc: a Dask worker process ran {main} again, and it starts an engine: "
            "this worker exits (the main process says what to do)"
        )


def _check_main_can_run_again(method: str) -> None:
    """A main module read from standard input (``python -``) cannot be run again in the workers."""
    main = _main_module()
    if main is None or getattr(sys.modules.get("__main__"), "__spec__", None) is not None:
        return  # nothing to run again (python -c, a notebook), or a module run with -m: imported by name
    start_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or ""  # where spawn looks, as it does
    if not os.path.isfile(os.path.join(start_dir, main)):
        raise DeviceError(
            f"backend='dask' cannot start a local cluster from this program: Dask starts each worker with the "
            f"{method!r} method, which runs the main module again from its file, and {main!r} is no file "
            "(a program read from standard input, python -). Run the program from a file, with the code that "
            f"starts the engine under {_MAIN_GUARD}, or connect to a running cluster with "
            f"dask_address='tcp://HOST:8786' ({_START_A_CLUSTER})"
        )


def _workers_failed(exc: Exception, config: Config, method: str) -> str:
    """What to say when the local cluster's workers did not start."""
    text = f"backend='dask' could not start a local cluster of {config.cpu_workers} worker processes ({exc})."
    main = _main_module()
    if main is not None and method != "fork":
        text += (
            f" The usual cause: Dask starts each worker with the {method!r} method, which runs the main module "
            f"({main}) again in it, and a program without a main guard starts the engine again there. Put the "
            f"code that starts the engine under {_MAIN_GUARD}, or connect"
        )
    else:
        text += " Connect"
    return text + f" to a running cluster with dask_address='tcp://HOST:8786' ({_START_A_CLUSTER})"


def _without_tracebacks(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it, without their frames: Dask's internals, dozens of lines each."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    return exc


async def _close_quietly(what: str, closing: Coroutine[Any, Any, Any], after: str) -> None:
    """Await a close for at most ``CLOSE_TIMEOUT_S``; a close that hangs or fails is a warning.

    The engine's own work is over by then: a slow scheduler must not turn
    ``aclose()`` into an error after every result was delivered.
    """
    try:
        await asyncio.wait_for(closing, CLOSE_TIMEOUT_S)
    except TimeoutError:
        problem = f"did not close within {CLOSE_TIMEOUT_S:g} s"
    except Exception as exc:
        problem = f"failed to close ({type(exc).__name__}: {exc})"
    else:
        return
    warnings.warn(
        f"schedsvc: {what} {problem}; the engine closed anyway ({after})",
        RuntimeWarning,
        stacklevel=2,
    )
