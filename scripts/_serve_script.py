"""What the scripts that watch the bench's server under wrk share (``serve_timeline.py``, ``serve_ops.py``): the
bench's server run by the script itself, a route of the script's own on its app, wrk and the request it
sends, and the two commands (``serve``: one server; ``run``: servers under wrk)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def add_route(path: str, answer: Callable[[], Any]) -> None:
    """Every app the bench makes from now on also answers ``GET path`` with ``answer()``, as JSON."""
    from schedsvc.cli.bench import _serve_app as app

    create_app = app.create_app

    def with_route(variant: str, model: str, **options: Any) -> Any:
        from starlette.responses import JSONResponse

        served = create_app(variant, model, **options)

        async def route(request: Any) -> Any:
            return JSONResponse(answer())

        served.add_route(path, route, methods=["GET"])
        return served

    app.create_app = with_route


def get(port: int, path: str) -> Any:
    """What the server at ``port`` answers to ``GET path`` (JSON)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
        return json.loads(answer.read())


def servers(script: str, model: str, variants: Sequence[str], extra: Sequence[str] = ()) -> list[Any]:
    """The bench's ``Server`` of each of ``variants``, each started as ``script serve VARIANT MODEL *extra``."""
    from schedsvc.cli.bench.serve import Server

    class ScriptServer(Server):
        def command(self) -> list[str]:
            return [sys.executable, str(Path(script).resolve()), "serve", self.variant, self.model, *extra]

    return [ScriptServer(variant, model) for variant in variants]


def load_of(model: str) -> tuple[str, bytes, int] | None:
    """(wrk's path, the body of the bench's request for ``model``, the outputs its answer carries); None,
    said on stderr, without wrk."""
    from schedsvc.cli.bench._serve_app import MODELS, request_row

    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not on PATH (Debian, Ubuntu: apt-get install wrk)", file=sys.stderr)
        return None
    return wrk, json.dumps({"x": request_row(model)}).encode(), MODELS[model][-1]


def commands(
    doc: str | None, server: str, runs: str, seconds: int
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line (``serve VARIANT MODEL``; ``run MODEL VARIANT...`` with ``--seconds`` and
    ``--connections``) and its two commands, for a script to add its own options to.  ``server``: what one
    ``serve`` runs; ``runs``: what ``run`` does."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    both = parser.add_subparsers(dest="command", required=True)
    one = both.add_parser("serve", help=f"one {server} (prints 'ready PORT')")
    one.add_argument("variant")
    one.add_argument("model")
    many = both.add_parser("run", help=runs)
    many.add_argument("model")
    many.add_argument("variants", nargs="+")
    many.add_argument("--seconds", type=int, default=seconds, help=f"of load per variant (default {seconds})")
    many.add_argument("--connections", type=int, default=64, help="wrk's connections (default 64)")
    return parser, one, many
