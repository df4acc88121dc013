"""``schedsvc info``: version, devices found, the settings in force and where each came from, the CPU budget
(BLAS libraries and the threads an engine would hold them at), extras."""

from __future__ import annotations

import argparse
import os
import platform
from importlib import metadata
from typing import TYPE_CHECKING, Any

from ._common import emit, fail, has_rich, output_problem, text_table

if TYPE_CHECKING:
    from rich.table import Table as RichTable

    from .._config import Config

__all__ = ["collect", "format_report", "register", "run"]

#: name shown -> (distributions that provide it, all needed; the extra that installs it)
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "matplotlib": (("matplotlib",), "plot"),
    "prometheus-client": (("prometheus-client",), "prometheus"),
    "cupy": (("cupy-cuda12x",), "cuda12"),
    "dask": (("dask", "distributed"), "dask"),
    "rich": (("rich",), "cli"),
}
_CUPY_DISTRIBUTIONS = ("cupy-cuda12x", "cupy-cuda13x", "cupy")
_MAX_CUDA_DEVICES = 256  # probing stops at the first index CUDA says does not exist


class InfoError(Exception):
    """A bad ``--set`` argument; the message says what to write instead."""


def register(sub: Any) -> None:
    info = sub.add_parser(
        "info",
        help="version, devices and the settings in force, with where each came from",
        description="Print the version, the devices found, the settings in force and where each came "
        "from (default, file, environment, keyword), and the optional extras installed.",
    )
    info.add_argument("--config", metavar="FILE", help="read settings from this TOML file (Config.from_file)")
    info.add_argument(
        "--set",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="a setting given as a keyword (wins over file and environment); repeat for more; "
        "VALUE 'none' clears an optional setting",
    )
    info.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout only)")
    info.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .._errors import ConfigError

    try:
        if problem := output_problem("--json", args.json):
            raise InfoError(problem)
        config = _config(args.config, args.overrides)
    except (InfoError, ConfigError) as exc:
        return fail("info", str(exc))
    emit(collect(config, args.config), args.json, format_report)
    return 0


def _config(path: str | None, overrides: list[str]) -> Config:
    from .._config import Config

    keywords = _keywords(overrides)
    return Config.from_file(path, **keywords) if path is not None else Config(**keywords)


def _keywords(overrides: list[str]) -> dict[str, Any]:
    """``["max_pending=8", ...]`` -> ``{"max_pending": "8"}``; Config converts and validates the values."""
    from .._config import Config

    fields = Config.model_fields
    keywords: dict[str, Any] = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InfoError(f"--set takes FIELD=VALUE, e.g. --set max_pending=64; got {item!r}")
        if name not in fields:
            raise InfoError(f"--set {item!r}: there is no setting {name!r}; settings: {', '.join(fields)}")
        clears = value.strip().lower() == "none" and fields[name].default is None
        keywords[name] = None if clears else value
    return keywords


# -- the report ------------------------------------------------------------------------------------------


def collect(config: Config, config_file: str | None = None) -> dict[str, Any]:
    """The report as plain JSON-ready data."""
    import schedsvc

    from ..devices import engine_cores

    values, sources = config.model_dump(mode="json"), config.sources()
    return {
        "schedsvc": schedsvc.__version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "engine_cores": engine_cores(),  # (those it may run on: an engine's workers and BLAS budget)
        "config_file": config_file,
        "devices": _devices(config),
        "settings": {name: {"value": values[name], "source": sources[name]} for name in values},
        "blas": _blas(config),
        "extras": {name: _extra(*spec) for name, spec in EXTRAS.items()},
    }


def _blas(config: Config) -> dict[str, Any]:
    """The CPU budget: the cores an engine is given, its workers, the BLAS threads per worker it would hold
    each BLAS library at (None: it leaves BLAS alone) and why, and the libraries with their threads now."""
    from ..devices import blas_libraries, plan_blas

    plan = plan_blas(config)
    libraries = [
        {
            "library": lib["internal_api"],
            "version": lib["version"],
            "threading_layer": lib.get("threading_layer"),
            "filepath": lib["filepath"],
            "threads": lib["num_threads"],
            "engine_sets": None if plan.threads is None else plan.wanted(lib["num_threads"]),
        }
        for lib in blas_libraries()
    ]
    return {
        "cores": plan.cores,
        "cpu_workers": plan.workers,
        "threads_per_worker": plan.threads,
        "exact": plan.exact,
        "reason": plan.reason,
        "libraries": libraries,
    }


def _devices(config: Config) -> list[dict[str, Any]]:
    cpu = {"name": "cpu", "available": True, "detail": f"{config.cpu_workers} worker threads"}
    if config.cuda_simulator:  # cuda:N run on the simulator: the devices named are the ones there are
        simulated = [
            {
                "name": name,
                "available": True,
                "detail": f"simulated by the CUDA simulator (no GPU used); {config.streams_per_device} "
                "compute streams + H2D + D2H",
            }
            for name in config.devices
            if name.startswith("cuda:")
        ]
        found = [cpu, *simulated]
        for device in found:
            device["in_config"] = device["name"] in config.devices
        return found
    found = [cpu, *_cuda_devices()]
    names = {d["name"] for d in found}
    missing = [_probe(name) for name in config.devices if name not in names]  # configured, not found: why
    if missing and found[-1]["name"] == "cuda":  # no CUDA at all: the configured devices say why instead
        found.pop()
    for device in (found := found + missing):
        device["in_config"] = device["name"] in config.devices
    return found


def _cuda_devices() -> list[dict[str, Any]]:
    """Every CUDA device CuPy finds, or one entry saying why there is none."""
    first = _probe("cuda:0")
    if not first["available"]:
        return [{**first, "name": "cuda"}]
    found = [first]
    for index in range(1, _MAX_CUDA_DEVICES):
        device = _probe(f"cuda:{index}")
        if not device["available"]:
            break
        found.append(device)
    return found


def _probe(name: str) -> dict[str, Any]:
    from .._errors import DeviceError
    from ..devices import check_device

    try:
        check_device(name)
    except DeviceError as exc:
        return {"name": name, "available": False, "detail": str(exc)}
    return {"name": name, "available": True, "detail": "found by CuPy"}


def _extra(distributions: tuple[str, ...], extra: str) -> dict[str, Any]:
    if distributions == ("cupy-cuda12x",):
        distributions = (_cupy_distribution(),)
    versions = [_version(d) for d in distributions]
    installed = all(v is not None for v in versions)
    return {
        "installed": installed,
        "version": versions[0] if installed else None,
        "install": f"pip install 'schedsvc[{extra}]'" + (" (or [cuda13])" if extra == "cuda12" else ""),
    }


def _cupy_distribution() -> str:
    """The CuPy wheel that is installed (one per CUDA major), or the usual one to suggest."""
    return next((d for d in _CUPY_DISTRIBUTIONS if _version(d) is not None), "cupy-cuda12x")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# -- rendering -------------------------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> str:
    """The report as tables: rich's when rich is installed (the cli extra), plain text otherwise."""
    cores = f"{report['cpu_cores']} CPU cores"
    if report["engine_cores"] != report["cpu_cores"]:  # a narrowed affinity (taskset, a container's cpuset)
        cores += f", {report['engine_cores']} for this process"
    head = f"schedsvc {report['schedsvc']}, {report['python']}, {report['platform']}, {cores}"
    tables = [_devices_table(report), _settings_table(report), _blas_table(report), _extras_table(report)]
    if not has_rich():
        return "\n\n".join([head, *(text_table(headers, rows, title) for title, headers, rows in tables)])
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or a file has no width: never wrap a path
        console.width = max(console.width, 240)
    with console.capture() as captured:
        console.print(head)
        for table in tables:
            console.print(_rich_table(*table))
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


#: a table of the report: title, column headers, rows of cells
Table = tuple[str, list[str], list[list[str]]]
#: how rich shows a cell that says one of these (the other cells: as they are)
_STYLES = {"available": "green", "unavailable": "red", "default": "dim", "no": "dim"}


def _rich_table(title: str, headers: list[str], rows: list[list[str]]) -> RichTable:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title), title_justify="left")
    for column in headers:
        table.add_column(column)
    for row in rows:  # Text, not markup: "pip install 'schedsvc[cuda12]'" keeps its brackets
        table.add_row(*(Text(cell, _STYLES.get(cell, "")) for cell in row))
    return table


def _devices_table(report: dict[str, Any]) -> Table:
    rows = [
        [
            d["name"],
            "available" if d["available"] else "unavailable",
            "yes" if d["in_config"] else "no",
            d["detail"],
        ]
        for d in report["devices"]
    ]
    return "devices", ["device", "status", "in config", "detail"], rows


def _settings_table(report: dict[str, Any]) -> Table:
    origin = f"from {report['config_file']}" if report["config_file"] else "no config file"
    rows = [
        [name, _value(name, setting["value"]), setting["source"]]
        for name, setting in report["settings"].items()
    ]
    return f"settings in force ({origin})", ["setting", "value", "source"], rows


def _blas_table(report: dict[str, Any]) -> Table:
    blas = report["blas"]
    per_worker = "left alone" if blas["threads_per_worker"] is None else blas["threads_per_worker"]
    title = (
        f"BLAS: {blas['cores']} cores given, {blas['cpu_workers']} CPU workers, BLAS threads per worker "
        f"{per_worker} ({blas['reason']})"
    )
    rows = [
        [
            lib["library"],
            lib["version"] or "",
            lib["threading_layer"] or "",
            str(lib["threads"]),
            "unchanged" if lib["engine_sets"] is None else str(lib["engine_sets"]),
            lib["filepath"],
        ]
        for lib in blas["libraries"]
    ]
    if not rows:
        rows = [["none found", "", "", "", "", ""]]
    return title, ["library", "version", "threading", "threads now", "an engine sets", "path"], rows


def _value(name: str, value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if value is None:
        return "auto" if name == "blas_threads" else "none"
    if name.endswith("_bytes"):
        from pydantic import ByteSize

        return f"{value} ({ByteSize(value).human_readable(separator=' ')})"
    return str(value)


def _extras_table(report: dict[str, Any]) -> Table:
    rows = [
        [
            name,
            extra["version"] if extra["installed"] else "no",
            "" if extra["installed"] else extra["install"],
        ]
        for name, extra in report["extras"].items()
    ]
    return "optional extras", ["package", "installed", "install with"], rows
