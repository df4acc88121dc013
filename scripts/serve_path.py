"""What one served request costs the event loop, per variant of ``schedsvc bench serve``, with no sockets.

    .venv/bin/python scripts/serve_path.py time batched digits       # µs of the loop's CPU per request
    .venv/bin/python scripts/serve_path.py ops batched digits        # bytecodes per request, by thread

Drives the bench's own app (``schedsvc.cli.bench._serve_app``) in process: its lifespan starts it, then
``--concurrent`` coroutines each send ``--requests`` POSTs of the bench's row straight to the ASGI app (no
HTTP, no sockets) and check each answer is a 200.  So the figures are the app's and the engine's only, not
uvicorn's or the kernel's.

``time`` reports, over ``--rounds`` rounds, the median wall time and the median CPU time of the loop's thread
per request (``time.thread_time``): the second leaves out the time the loop waits for a worker.  ``ops``
counts the bytecodes each thread runs per request with a ``sys.settrace`` opcode tracer, the loop's and the
workers' apart, and lists the functions that run the most; compile-time work (tracing a new batch size) is
left out.  Unlike time, the loop's count hardly moves from run to run (within 1%), so a change on the path
shows as what it adds or removes; the workers' moves more (about 10%), as it depends on how the calls
happened to be batched: compare medians of a few runs there.  Compare variants, or a change against its
parent, in the same way; ``none`` is the app with no model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from typing import Any

from _opcount import OpCounter  # (beside this script)

from schedsvc.cli.bench._serve_app import MODELS, OVERLOAD, VARIANTS, create_app, request_row

#: functions of tracing and graph building: what a new batch size costs once, not what a request costs
_COMPILE_PARTS = ("compile/_trace", "compile/_graph", "compile/_rows")


class Driver:
    """The bench's app of ``variant`` and ``model``, driven in process."""

    def __init__(self, variant: str, model: str) -> None:
        self.app = create_app(variant, model)
        self.body = json.dumps({"x": request_row(model)}).encode()
        self._lifespan: asyncio.Task[None] | None = None
        self._to_app: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def start(self) -> None:
        async def receive() -> dict[str, str]:
            return await self._to_app.get()

        async def send(message: dict[str, Any]) -> None:
            await self._from_app.put(message)

        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._lifespan = asyncio.ensure_future(self.app(scope, receive, send))
        await self._to_app.put({"type": "lifespan.startup"})
        said = await asyncio.wait_for(self._from_app.get(), 60)
        if said["type"] != "lifespan.startup.complete":
            raise SystemExit(f"the app did not start: {said}")

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self._from_app.get(), 60)
        assert self._lifespan is not None
        await asyncio.wait_for(self._lifespan, 60)

    async def request(self) -> None:
        body = self.body
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/predict",
            "raw_path": b"/predict",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
            "state": {},
            "app": self.app,
        }
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await self.app(scope, receive, send)
        if statuses != [200]:
            raise SystemExit(f"/predict answered {statuses}, not 200")

    async def load(self, concurrent: int, requests: int) -> None:
        """``concurrent`` coroutines, each sending ``requests`` requests one after the other."""

        async def client() -> None:
            for _ in range(requests):
                await self.request()

        await asyncio.gather(*(client() for _ in range(concurrent)))


async def measure_time(driver: Driver, concurrent: int, requests: int, rounds: int) -> None:
    await driver.load(concurrent, max(1, requests // 4))  # warm: every batch size the load makes is traced
    walls, cpus = [], []
    n = concurrent * requests
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        await driver.load(concurrent, requests)
        walls.append((time.perf_counter() - t0) / n * 1e6)
        cpus.append((time.thread_time() - c0) / n * 1e6)
    print(
        f"{n} requests x {rounds} rounds, {concurrent} at a time: "
        f"wall {statistics.median(walls):.1f} µs/request (rounds {min(walls):.1f}-{max(walls):.1f}), "
        f"loop CPU {statistics.median(cpus):.1f} µs/request (rounds {min(cpus):.1f}-{max(cpus):.1f})"
    )


async def measure_ops(driver: Driver, concurrent: int, requests: int, top: int, counter: OpCounter) -> None:
    await driver.load(concurrent, requests)  # warm: every batch size the load makes is traced
    counter.on = True
    sys.settrace(counter.tracer)
    try:
        await driver.load(concurrent, requests)
    finally:
        sys.settrace(None)
        counter.on = False
    counter.report(concurrent * requests, "request", ("loop", "workers"), top, skip=_COMPILE_PARTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("what", choices=["time", "ops"])
    parser.add_argument("variant", choices=[v for v in VARIANTS if v != "ray"] + [OVERLOAD])
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--concurrent", type=int, default=64, help="requests in flight (default 64)")
    parser.add_argument(
        "--requests", type=int, default=32, help="requests per coroutine and round (default 32)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of time (default 5)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per thread by ops (default 25)")
    args = parser.parse_args()
    if args.variant in ("to_thread_pinned",):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    loop_thread = threading.get_ident()
    counter = OpCounter(lambda: "loop" if threading.get_ident() == loop_thread else "workers")
    if args.what == "ops":
        threading.settrace(counter.tracer)  # the engine's workers start with the app: traced while ``on``

    async def run() -> None:
        driver = Driver(args.variant, args.model)
        await driver.start()
        try:
            if args.what == "time":
                await measure_time(driver, args.concurrent, args.requests, args.rounds)
            else:
                await measure_ops(driver, args.concurrent, args.requests, args.top, counter)
        finally:
            await driver.stop()

    asyncio.run(run())


if __name__ == "__main__":
    main()
