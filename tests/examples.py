"""Loading a script (an example, a tool of scripts/) as a module, and an ASGI client of an app (the web-service
examples' tests)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as a module named ``name`` (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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


async def assert_told(app: Any, body: bytes, status: int, says: str) -> None:
    """POST ``body`` to ``app``'s /predict: the response has ``status`` and an error that ``says`` so."""
    from tests.helpers import within

    async with client_of(app) as client:
        response = await within(client.post("/predict", content=body))
    assert response.status_code == status
    assert says in response.json()["detail"]
