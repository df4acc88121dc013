"""Loading a script (an example, a tool of scripts/) as a module, and an ASGI client of an app (the web-service
examples' tests)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as a module named ``name`` (scripts are not a package: the modules beside it,
    which it imports as Python does when it runs, are found while it loads)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    beside = str(path.parent)
    sys.path.insert(0, beside)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(beside)
    return module


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module."""
    return load_script(EXAMPLES / f"{name}.py", f"{name}_example")


@asynccontextmanager
async def client_of(app: Any) -> AsyncIterator[Any]:
    """An ASGI client of ``app`` inside its lifespan (httpx's ASGITransport does not run the lifespan)."""
    import httpx

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            yield client


#: levels of ``[`` in a body nested deeper than Python's JSON parser recurses (the recursion limit, 1000; a
#: parser that goes deeper leaves it to the examples' checks of the row), in 10 kB: under every body limit
NESTED = 5_000


class Upload:
    """A request body of ``count`` chunks of ``size`` bytes, sent chunked unless a Content-Length header is
    given; ``taken`` counts the chunks the app has read."""

    def __init__(self, size: int, count: int) -> None:
        self.size, self.count, self.taken = size, count, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.taken += 1
            yield b" " * self.size


async def assert_told(
    app: Any, body: bytes | Upload, status: int, says: str, headers: dict[str, str] | None = None
) -> None:
    """POST ``body`` (JSON, as its content type says) to ``app``'s /predict: the response has ``status`` and
    an error that ``says`` so."""
    from tests.helpers import within

    async with client_of(app) as client:
        headers = {"content-type": "application/json"} | (headers or {})
        response = await within(client.post("/predict", content=body, headers=headers))
    assert response.status_code == status, response.text
    assert says in response.json()["detail"]


async def assert_capped(app: Any, limit: int) -> None:
    """A body over ``limit`` bytes is refused (413, the message names the limit): by its Content-Length before
    any of it is read, and sent chunked as soon as it passes the limit."""
    size = 1024
    declared = Upload(size, limit // size + 1)
    await assert_told(app, declared, 413, str(limit), {"content-length": str(declared.size * declared.count)})
    assert declared.taken == 0
    chunked = Upload(size, 4 * limit // size)
    await assert_told(app, chunked, 413, str(limit))
    assert chunked.taken == limit // size + 1  # the first chunk past the limit, and none after it
