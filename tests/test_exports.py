"""The public surface: a sorted ``__all__`` of names that exist, and the names DESIGN.md promises."""

from __future__ import annotations

import inspect

import pytest

import schedsvc as ss

DESIGN_NAMES = [
    "Compiled",
    "Config",
    "DependencyError",
    "DeviceError",
    "Engine",
    "EngineClosed",
    "Future",
    "MemoryLimitError",
    "QueueFull",
    "SchedsvcError",
    "Tensor",
    "load",
]

ERRORS = [
    "ConfigError",
    "DependencyError",
    "DeviceError",
    "EngineClosed",
    "InvalidTask",
    "LoadError",
    "MemoryLimitError",
    "QueueFull",
    "TraceError",
]


def test_all_is_sorted() -> None:
    assert list(ss.__all__) == sorted(ss.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(set(ss.__all__)) == len(ss.__all__)


@pytest.mark.parametrize("name", ss.__all__)
def test_every_exported_name_exists(name: str) -> None:
    assert hasattr(ss, name)


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_design_names_are_exported(name: str) -> None:
    assert name in ss.__all__
    assert hasattr(ss, name)


def test_public_modules_are_private_implementation() -> None:
    """Names live in ``_``-modules and are re-exported; nothing public leaks from the implementation."""
    for name in ss.__all__:
        obj = getattr(ss, name)
        if not inspect.isclass(obj):
            continue
        module = obj.__module__
        assert module.startswith("schedsvc."), (name, module)
        # schedsvc._engine, schedsvc.tensor._tensor: the defining module is private
        assert module.split(".")[-1].startswith("_"), (name, module)


@pytest.mark.parametrize("name", ERRORS)
def test_errors_share_one_base(name: str) -> None:
    error = getattr(ss, name)
    assert issubclass(error, ss.SchedsvcError)
    assert issubclass(ss.SchedsvcError, Exception)


def test_error_flavours() -> None:
    """Errors that are also builtin kinds can be caught as those."""
    assert issubclass(ss.ConfigError, ValueError)
    assert issubclass(ss.InvalidTask, TypeError)
    assert issubclass(ss.TraceError, TypeError)


@pytest.mark.parametrize(
    "method",
    [
        "start",
        "aclose",
        "submit",
        "submit_nowait",
        "run",
        "waitall",
        "throttle",
        "stats",
        "has_room",
        "asarray",
        "zeros",
        "ones",
        "full",
        "empty",
        "arange",
        "compile",
    ],
)
def test_engine_methods(method: str) -> None:
    assert callable(getattr(ss.Engine, method))


@pytest.mark.parametrize("method", ["aclose", "run", "waitall", "throttle", "start"])
def test_engine_async_methods_are_coroutines(method: str) -> None:
    assert inspect.iscoroutinefunction(getattr(ss.Engine, method))


async def test_submit_returns_a_coroutine_to_await() -> None:
    """``submit`` checks its caller at once (no submitting while tracing), then gives a coroutine."""
    async with ss.Engine(cpu_workers=1) as eng:
        pending = eng.submit(abs, -1)
        assert inspect.iscoroutine(pending)
        assert await (await pending) == 1


def test_engine_sync_methods_are_plain() -> None:
    assert not inspect.iscoroutinefunction(ss.Engine.submit_nowait)
    assert not inspect.iscoroutinefunction(ss.Engine.stats)


def test_engine_is_an_async_context_manager() -> None:
    assert hasattr(ss.Engine, "__aenter__")
    assert hasattr(ss.Engine, "__aexit__")


@pytest.mark.parametrize(
    "method", ["done", "result", "exception", "cancel", "wait", "add_done_callback", "__await__"]
)
def test_future_methods(method: str) -> None:
    assert callable(getattr(ss.Future, method))


def test_version_is_a_string() -> None:
    assert isinstance(ss.__version__, str)
    assert ss.__version__


def test_optional_extras_are_not_imported_with_schedsvc() -> None:
    """``ss.PrometheusCollector`` is exported, yet ``import schedsvc`` works without the extras it needs."""
    import subprocess
    import sys

    code = "import sys, schedsvc; print(sorted(m for m in ('prometheus_client', 'matplotlib', 'rich') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
    assert "PrometheusCollector" in ss.__all__


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    import subprocess
    import sys

    script = f"import sys\n{code}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    return set(out.split())


#: what only the command, its plots and the benchmarks use (the cli, plot and prometheus extras)
CLI_ONLY = {"rich", "matplotlib", "prometheus_client", "schedsvc.cli"}
#: what is imported on first use of a name: pydantic with Config, the compiler with Compiled, ...
DEFERRED = {
    "pydantic",
    "pydantic_settings",
    "schedsvc._config",
    "schedsvc._executor",
    "schedsvc.compile._compiled",
    "asyncio",  # with TaskCancelled (an asyncio.CancelledError), or when an engine starts
    "schedsvc._cancelled",
    "threadpoolctl",  # when an engine starts (it holds BLAS's threads per worker), or by the command
}


def test_import_schedsvc_leaves_the_command_s_and_the_deferred_modules_unimported() -> None:
    """``import schedsvc`` costs about what ``import numpy`` does: the cli extra's packages, pydantic (for
    Config) and the compiler are imported when first used, not with the package."""
    loaded = _modules_after("import schedsvc")
    assert "schedsvc._engine" in loaded and "numpy" in loaded
    assert not loaded & (CLI_ONLY | DEFERRED)


def test_a_deferred_name_imports_its_module_on_first_use() -> None:
    loaded = _modules_after("import schedsvc\nschedsvc.Config()")
    assert {"pydantic", "pydantic_settings", "schedsvc._config"} <= loaded
    assert not loaded & CLI_ONLY
    loaded = _modules_after(
        "import schedsvc, asyncio\nassert issubclass(schedsvc.TaskCancelled, asyncio.CancelledError)"
    )
    assert "schedsvc._cancelled" in loaded


def test_an_engine_under_trio_or_asyncio_imports_asyncio_when_it_starts() -> None:
    """The bridge loads asyncio at the engine's start, under either library (a future may be awaited on
    an asyncio loop in another thread): it works the same as when asyncio was imported first."""
    code = (
        "import schedsvc, trio\n"
        "async def main():\n"
        "    async with schedsvc.Engine(cpu_workers=1) as eng:\n"
        "        assert await eng.run(abs, -3) == 3\n"
        "trio.run(main)"
    )
    pytest.importorskip("trio")
    assert "asyncio" in _modules_after(code)


def test_every_exported_name_imports_from_a_fresh_interpreter() -> None:
    """``from schedsvc import X`` works for each name of ``__all__``, the deferred ones included."""
    names = ", ".join(name for name in ss.__all__ if name != "__version__")
    loaded = _modules_after(f"from schedsvc import {names}\nfrom schedsvc import __version__")
    assert "schedsvc._config" in loaded and "schedsvc.compile._compiled" in loaded


def test_dir_lists_every_exported_name() -> None:
    assert set(ss.__all__) <= set(dir(ss))
