"""``schedsvc info``: version, devices found, the settings in force with where each came from, extras."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import schedsvc as ss
from schedsvc.cli import main
from schedsvc.devices import engine_cores

FIELDS = list(ss.Config.model_fields)


def info_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["info", *argv, "--json", "-"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def table_rows(text: str) -> dict[str, list[str]]:
    """Rows of the printed tables: first cell -> the other cells, stripped."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            rows[cells[0]] = cells[1:]
    return rows


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


def fake_cupy(monkeypatch: pytest.MonkeyPatch, count: int | Exception) -> None:
    """Stand in for CuPy's device count, so the per-device report is tested without a GPU."""

    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)


# -- plain output -------------------------------------------------------------------------------------------


def test_plain_output_names_version_devices_each_setting_and_its_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"schedsvc {ss.__version__}, ")
    assert f"{os.cpu_count()} CPU cores" in out
    rows = table_rows(out)
    config = ss.Config()
    for field in FIELDS:
        assert rows[field][-1] == "default", field
    assert rows["max_pending"][0] == "1024"
    assert rows["devices"][0] == "cpu"
    assert rows["max_pending_bytes"][0].startswith(f"{config.max_pending_bytes} (")
    assert rows["cpu"][:3] == ["available", "yes", f"{config.cpu_workers} worker threads"]
    assert any(name.startswith("cuda") for name in rows)  # availability is reported either way
    assert {"matplotlib", "prometheus-client", "cupy", "dask"} <= set(rows)


def test_plain_output_shows_file_environment_and_keyword_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_toml(tmp_path, "cpu_workers = 3\nmax_pending = 7\n")
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    assert main(["info", "--config", str(path), "--set", "sync_mode=true"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["cpu_workers"] == ["3", f"file {path}"]
    assert rows["max_pending"] == ["9", "environment SCHEDSVC_MAX_PENDING"]
    assert rows["sync_mode"] == ["True", "keyword"]
    assert rows["backend"] == ["threads", "default"]
    assert rows["cpu"][2] == "3 worker threads"
    assert f"settings in force (from {path})" in out


def test_without_rich_the_tables_are_plain_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rich is the cli extra's: without it the same tables are printed as plain columns."""
    monkeypatch.setitem(sys.modules, "rich", None)
    assert main(["info", "--set", "max_pending=7"]) == 0
    out = capsys.readouterr().out
    assert not any(box in out for box in "─━│┃")
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())}
    assert rows["setting"] == ["value", "source"]
    assert rows["max_pending"] == ["7", "keyword"]
    assert rows["backend"] == ["threads", "default"]
    assert rows["cpu"][:2] == ["available", "yes"]
    assert rows["rich"][0] == metadata.version("rich")  # installed, only hidden from this process
    assert "settings in force (no config file)" in out


# -- JSON ---------------------------------------------------------------------------------------------------


def test_json_parses_and_shows_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_toml(tmp_path, 'cpu_workers = 3\nmax_pending = 7\ntrace_path = "t.json"\n')
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    monkeypatch.setenv("SCHEDSVC_DEVICES", "cpu")
    report = info_json(
        capsys, "--config", str(path), "--set", "max_pending_bytes=16MiB", "--set", "trace_path=none"
    )
    settings = report["settings"]
    assert list(settings) == FIELDS
    assert settings["cpu_workers"] == {"value": 3, "source": f"file {path}"}
    assert settings["max_pending"] == {"value": 9, "source": "environment SCHEDSVC_MAX_PENDING"}
    assert settings["devices"] == {"value": ["cpu"], "source": "environment SCHEDSVC_DEVICES"}
    assert settings["max_pending_bytes"] == {"value": 16 * 2**20, "source": "keyword"}
    assert settings["trace_path"] == {"value": None, "source": "keyword"}  # 'none' clears the file's value
    assert settings["backend"] == {"value": "threads", "source": "default"}
    assert report["config_file"] == str(path)
    assert report["schedsvc"] == ss.__version__
    assert report["cpu_cores"] == os.cpu_count()
    assert report["engine_cores"] == engine_cores() == ss.Config().cpu_workers


def test_a_narrowed_affinity_shows_the_cores_this_process_may_run_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if hasattr(os, "process_cpu_count"):  # Python 3.13: it reads the affinity itself
        monkeypatch.setattr(os, "process_cpu_count", lambda: 3)
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert main(["info"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith("64 CPU cores, 3 for this process")


def test_json_matches_config_sources(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCHEDSVC_STREAMS_PER_DEVICE", "4")
    report = info_json(capsys, "--set", "cpu_workers=2")
    config = ss.Config(cpu_workers=2)
    assert {k: v["source"] for k, v in report["settings"].items()} == config.sources()
    assert {k: v["value"] for k, v in report["settings"].items()} == config.model_dump(mode="json")


def test_json_to_a_file_also_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "info.json"
    assert main(["info", "--set", "max_pending=5", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert table_rows(out)["max_pending"] == ["5", "keyword"]
    assert f"wrote {path}" in out
    assert json.loads(path.read_text())["settings"]["max_pending"] == {"value": 5, "source": "keyword"}


def test_extras_say_whether_installed_and_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    extras = info_json(capsys)["extras"]
    assert list(extras) == [
        "matplotlib",
        "prometheus-client",
        "cupy",
        "dask",
        "rich",
    ]  # threadpoolctl: a dependency
    pytest.importorskip("prometheus_client")
    assert extras["prometheus-client"]["installed"] is True
    assert extras["prometheus-client"]["version"] == metadata.version("prometheus-client")
    assert extras["matplotlib"]["install"] == "pip install 'schedsvc[plot]'"
    assert extras["dask"]["install"] == "pip install 'schedsvc[dask]'"
    assert extras["rich"]["install"] == "pip install 'schedsvc[cli]'"
    for extra in extras.values():
        assert (extra["version"] is not None) == extra["installed"]


# -- the CPU budget: BLAS ------------------------------------------------------------------------------------


def _blas_libraries() -> list[dict[str, Any]]:
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture
def no_blas_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """What "auto" does is not decided by a BLAS variable of the shell that runs pytest."""
    from schedsvc.devices import BLAS_VARIABLES

    for name in BLAS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_blas_variables")
def test_json_shows_each_blas_library_its_threads_and_what_an_engine_sets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cores = engine_cores()
    blas = info_json(capsys, "--set", "cpu_workers=1")["blas"]
    assert (blas["cores"], blas["cpu_workers"], blas["threads_per_worker"]) == (cores, 1, cores)
    assert blas["exact"] is False and blas["reason"] == f"auto: at most {cores} cores // 1 workers"
    loaded = _blas_libraries()
    assert [lib["filepath"] for lib in blas["libraries"]] == [lib["filepath"] for lib in loaded]
    for shown, lib in zip(blas["libraries"], loaded, strict=True):
        assert (shown["library"], shown["threads"]) == (lib["internal_api"], lib["num_threads"])
        assert shown["engine_sets"] == min(lib["num_threads"], cores)  # auto only lowers a count
    blas = info_json(capsys, "--set", f"cpu_workers={cores}", "--set", "blas_threads=3")["blas"]
    assert (blas["threads_per_worker"], blas["exact"]) == (3, True)
    assert all(lib["engine_sets"] == 3 for lib in blas["libraries"])


@pytest.mark.usefixtures("no_blas_variables")
def test_left_alone_by_the_setting_or_by_the_user_s_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blas = info_json(capsys, "--set", "blas_threads=leave")["blas"]
    assert blas["threads_per_worker"] is None and blas["reason"] == "left alone: blas_threads='leave'"
    assert all(lib["engine_sets"] is None for lib in blas["libraries"])
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    blas = info_json(capsys)["blas"]
    assert blas["threads_per_worker"] is None
    assert blas["reason"] == "left alone: OPENBLAS_NUM_THREADS=1 is set"
    assert info_json(capsys, "--set", "blas_threads=2")["blas"]["threads_per_worker"] == 2  # explicit wins


@pytest.mark.usefixtures("no_blas_variables")
def test_plain_output_shows_the_cpu_budget(capsys: pytest.CaptureFixture[str]) -> None:
    cores = engine_cores()
    assert main(["info", "--set", f"cpu_workers={cores}"]) == 0
    out = capsys.readouterr().out
    assert (
        f"BLAS: {cores} cores given, {cores} CPU workers, BLAS threads per worker 1 "
        f"(auto: at most {cores} cores // {cores} workers)"
    ) in out
    rows = table_rows(out)
    assert rows["blas_threads"] == ["auto", "default"]
    for lib in _blas_libraries():
        assert rows[lib["internal_api"]][2:4] == [str(lib["num_threads"]), "1"]


# -- devices ------------------------------------------------------------------------------------------------


def test_without_cupy_cuda_is_unavailable_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail
    devices = info_json(capsys, "--set", "cpu_workers=3")["devices"]
    assert devices[0] == {"name": "cpu", "available": True, "detail": "3 worker threads", "in_config": True}
    assert devices[1]["name"] == "cuda"
    assert devices[1]["available"] is False
    assert "CuPy is not installed" in devices[1]["detail"]
    assert "schedsvc[cuda12]" in devices[1]["detail"]
    assert len(devices) == 2


def test_a_configured_cuda_device_says_why_it_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["info", "--set", "devices=cpu,cuda:1"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows["cuda:1"][:2] == ["unavailable", "yes"]
    assert "cuda:1 is unavailable: CuPy is not installed" in rows["cuda:1"][2]
    assert "schedsvc[cuda12]" in rows["cuda:1"][2]  # text in brackets is not taken for rich markup
    assert "cuda" not in rows  # the configured device carries the reason


def test_each_cuda_device_is_listed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cupy(monkeypatch, 2)
    devices = info_json(capsys, "--set", "devices=cpu,cuda:1,cuda:3")["devices"]
    by_name = {d["name"]: d for d in devices}
    assert [d["name"] for d in devices] == ["cpu", "cuda:0", "cuda:1", "cuda:3"]
    assert by_name["cuda:0"]["available"] and not by_name["cuda:0"]["in_config"]
    assert by_name["cuda:1"]["available"] and by_name["cuda:1"]["in_config"]
    assert not by_name["cuda:3"]["available"] and by_name["cuda:3"]["in_config"]
    assert "this machine has 2 CUDA device(s)" in by_name["cuda:3"]["detail"]


def test_a_broken_cuda_driver_is_a_reason_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cupy(monkeypatch, RuntimeError("cudaErrorInsufficientDriver"))
    devices = info_json(capsys)["devices"]
    assert devices[1]["name"] == "cuda"
    assert devices[1]["available"] is False
    assert "cudaErrorInsufficientDriver" in devices[1]["detail"]


# -- bad input: exit 2 and a message, never a traceback -----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "max_pending"], "--set takes FIELD=VALUE"),
        (["--set", "=3"], "--set takes FIELD=VALUE"),
        (["--set", "bogus=1"], "there is no setting 'bogus'; settings: cpu_workers"),
        (["--set", "max_pending=0"], "max_pending"),
        (["--set", "max_pending=many"], "max_pending"),
        (["--set", "max_pending_bytes=16 parsecs"], "max_pending_bytes"),
        (["--set", "devices=tpu"], "devices"),
        (["--set", "max_pending=none"], "max_pending"),  # only optional settings can be cleared
        (["--config", "does-not-exist.toml"], "does-not-exist.toml' does not exist"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("schedsvc info: ")
    assert message in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_pending = = 3\n", "is not valid TOML"),
        ("max_pending = -3\n", "max_pending"),
        ("bogus = 1\n", "bogus"),
        ("max_pending_bytes = inf\n", "max_pending_bytes: it cannot be unlimited"),
        ("max_pending_bytes = 1.7\n", "max_pending_bytes: 1.7 is not a whole number"),
        ("cpu_workers = true\n", "cpu_workers: True is not a number"),
    ],
)
def test_a_bad_config_file_exits_2_with_a_message(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_toml(tmp_path, text)
    assert main(["info", "--config", str(path), "--json", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_a_bad_environment_variable_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCHEDSVC_CPU_WORKERS", "abc")
    assert main(["info"]) == 2
    assert "SCHEDSVC_CPU_WORKERS" in capsys.readouterr().err


def test_a_directory_given_as_config_exits_2_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", "--config", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "is a directory; name a TOML file" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
