"""Settings: defaults, then TOML, then SCHEDSVC_* variables, then keywords; bad values name their field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import pytest

import schedsvc as ss
from schedsvc.devices import engine_cores

REPO = Path(__file__).resolve().parent.parent


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "schedsvc.toml"
    path.write_text(text)
    return path


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cpu_workers_default_to_the_cores_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under taskset or a container's cpuset, a worker per core the process is given, not per core of the
    machine (whose count os.cpu_count() gives)."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13: it reads the affinity itself
        monkeypatch.setattr(os, "process_cpu_count", lambda: 3)
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert ss.Config().cpu_workers == 3
    assert ss.Config().sources()["cpu_workers"] == "default"


def test_defaults() -> None:
    config = ss.Config()
    assert config.cpu_workers == engine_cores()
    assert config.devices == ("cpu",)
    assert config.max_pending == 1024
    assert config.max_pending_bytes == physical_memory() // 4
    assert config.streams_per_device >= 1
    assert config.max_device_bytes is None
    assert config.sync_mode is False
    assert config.backend == "threads"
    assert config.dask_address is None


def test_keywords() -> None:
    config = ss.Config(cpu_workers=3, max_pending=5, sync_mode=True)
    assert (config.cpu_workers, config.max_pending, config.sync_mode) == (3, 5, True)


def test_config_is_immutable() -> None:
    config = ss.Config()
    with pytest.raises((pydantic.ValidationError, AttributeError, TypeError)):
        config.max_pending = 3  # type: ignore[misc]
    assert config.max_pending == 1024


def test_from_file(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'cpu_workers = 3\nmax_pending = 7\nmax_pending_bytes = "16MiB"\ndevices = ["cpu"]\nsync_mode = true\n',
    )
    config = ss.Config.from_file(path)
    assert config.cpu_workers == 3
    assert config.max_pending == 7
    assert config.max_pending_bytes == 16 * 2**20
    assert config.devices == ("cpu",)
    assert config.sync_mode is True


def test_from_file_accepts_a_string_path(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending = 9\n")
    assert ss.Config.from_file(str(path)).max_pending == 9


def test_the_shipped_default_file_loads() -> None:
    config = ss.Config.from_file(REPO / "config" / "default.toml")
    assert config.devices == ("cpu",)
    assert config.max_pending == 1024
    assert config.backend == "threads"


def test_toml_file_applies_only_to_from_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending = 7\n")
    assert ss.Config.from_file(path).max_pending == 7
    assert ss.Config().max_pending == 1024


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    monkeypatch.setenv("SCHEDSVC_SYNC_MODE", "true")
    config = ss.Config()
    assert config.max_pending == 9
    assert config.sync_mode is True


def test_environment_overrides_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_toml(tmp_path, "cpu_workers = 3\nmax_pending = 7\n")
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    config = ss.Config.from_file(path)
    assert config.max_pending == 9
    assert config.cpu_workers == 3  # not set in the environment: TOML still applies


def test_keywords_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    assert ss.Config(max_pending=11).max_pending == 11


def test_keywords_override_environment_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_toml(tmp_path, "max_pending = 7\ncpu_workers = 3\n")
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    config = ss.Config.from_file(path, max_pending=11)
    assert config.max_pending == 11
    assert config.cpu_workers == 3


def test_byte_sizes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING_BYTES", "16MiB")
    assert ss.Config().max_pending_bytes == 16 * 2**20


def test_devices_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_DEVICES", "cpu,cuda:0")
    assert ss.Config().devices == ("cpu", "cuda:0")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (16777216, 16777216),
        ("16777216", 16777216),
        ("16MiB", 16 * 2**20),
        ("16 MiB", 16 * 2**20),
        ("16mib", 16 * 2**20),
        ("1KiB", 1024),
        ("2GiB", 2 * 2**30),
        ("2GB", 2 * 10**9),
        ("3MB", 3 * 10**6),
        ("1.5KiB", 1536),
        ("512B", 512),
    ],
)
def test_byte_strings(text: int | str, expected: int) -> None:
    assert ss.Config(max_pending_bytes=text).max_pending_bytes == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2 PiB", 2 * 2**50), ("1k", 1000), ("8bit", 1), (" 16MiB ", 16 * 2**20), (1e9, 10**9)],
)
def test_byte_sizes_are_what_pydantic_bytesize_reads(text: str | float, expected: int) -> None:
    """Units are ByteSize's (case-insensitive, IEC and SI, bits too), a size rounded down to whole bytes."""
    assert ss.Config(max_pending_bytes=text).max_pending_bytes == expected == pydantic.ByteSize(expected)


@pytest.mark.parametrize("text", ["16MiB!", "16 MiB of it", "1.5B", "1.7", "-1"])
def test_a_byte_size_is_a_size_and_nothing_more(text: str) -> None:
    """ByteSize would read "16MiB!" as 16MiB and round "1.5B" down: refused here, the field named."""
    with pytest.raises(
        ss.ConfigError, match=r"max_pending_bytes: .* (is not a byte size|is not a whole number)"
    ):
        ss.Config(max_pending_bytes=text)


@pytest.mark.parametrize(
    ("value", "why"),
    [(-1, "-1 is not a byte size"), ("16 parsecs", "could not interpret byte unit: parsecs")],
)
def test_a_refused_byte_size_says_what_to_write(value: object, why: str) -> None:
    with pytest.raises(
        ss.ConfigError, match=f"max_pending_bytes: {why}; write a whole number of bytes such as"
    ):
        ss.Config(max_pending_bytes=value)


def test_byte_strings_for_device_memory() -> None:
    assert ss.Config(max_device_bytes="1GiB").max_device_bytes == 2**30


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu_workers", 0),
        ("cpu_workers", -1),
        ("cpu_workers", "many"),
        ("max_pending", 0),
        ("max_pending", -5),
        ("max_pending_bytes", 0),
        ("max_pending_bytes", -1),
        ("max_pending_bytes", "lots"),
        ("max_pending_bytes", "16 parsecs"),
        ("max_device_bytes", "-1MiB"),
        ("streams_per_device", 0),
        ("backend", "mpi"),
        ("devices", ("tpu",)),
        ("devices", ()),
        ("devices", ("cuda",)),
        ("devices", ("cpu", "gpu0")),
        ("trace_path", ""),
        ("inline_threshold_us", float("inf")),
        ("inline_threshold_us", float("nan")),
        ("dask_timeout_s", float("inf")),
        ("max_pending_bytes", float("inf")),
        ("max_pending_bytes", float("nan")),
        ("max_pending_bytes", [1]),
        ("max_device_bytes", {"size": 1}),
        ("cpu_workers", [2]),
        ("max_pending", float("inf")),
    ],
)
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ss.ConfigError) as info:
        ss.Config(**{field: value})
    assert field in str(info.value)


@pytest.mark.parametrize(
    "field", ["cpu_workers", "streams_per_device", "max_pending", "max_pending_bytes", "max_device_bytes"]
)
@pytest.mark.parametrize(
    ("value", "why"),
    [(1.7, "1.7 is not a whole number"), ("1.7", "1.7 is not a whole number"), (True, "True is not a")],
)
def test_integer_fields_refuse_fractions_and_bools(field: str, value: object, why: str) -> None:
    """A fraction used to be cut to an int (1.7 -> 1) and True taken for 1, silently."""
    with pytest.raises(ss.ConfigError, match=f"{field}: .*{why}.*write a whole number"):
        ss.Config(**{field: value})


@pytest.mark.parametrize("field", ["inline_threshold_us", "dask_timeout_s"])
def test_float_fields_refuse_bools(field: str) -> None:
    with pytest.raises(ss.ConfigError, match=f"{field}: True is not a number; write a number"):
        ss.Config(**{field: True})


@pytest.mark.parametrize(
    "field", ["cpu_workers", "streams_per_device", "max_pending", "max_pending_bytes", "max_device_bytes"]
)
def test_integer_fields_take_a_whole_float(field: str) -> None:
    assert getattr(ss.Config(**{field: 4.0}), field) == 4


def test_a_whole_float_from_toml_is_a_byte_count(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending_bytes = 1e9\nmax_pending = 2e3\n")
    config = ss.Config.from_file(path)
    assert (config.max_pending_bytes, config.max_pending) == (10**9, 2000)
    assert isinstance(config.max_pending_bytes, int)


def test_a_size_with_a_unit_is_rounded_down_to_whole_bytes() -> None:
    assert ss.Config(max_pending_bytes="1.3MiB").max_pending_bytes == int(1.3 * 2**20)
    with pytest.raises(ss.ConfigError, match=r"max_pending_bytes: 1\.5 is not a whole number"):
        ss.Config(max_pending_bytes="1.5B")


@pytest.mark.parametrize("value", ["unlimited", " Unlimited ", float("inf"), None])
def test_device_bytes_can_be_unlimited(value: object) -> None:
    assert ss.Config(max_device_bytes=value).max_device_bytes is None


@pytest.mark.parametrize("value", ["unlimited", float("inf")])
def test_pending_bytes_cannot_be_unlimited_and_says_why(value: object) -> None:
    """Infinity used to raise a raw OverflowError; "unlimited" is refused with the reason and a fix."""
    with pytest.raises(ss.ConfigError, match=r"max_pending_bytes: it cannot be unlimited: .* such as '1TiB'"):
        ss.Config(max_pending_bytes=value)


@pytest.mark.parametrize("text", ["inf", "INF", " Infinity ", "+inf", "unlimited", "none"])
def test_device_bytes_from_the_environment_can_be_unlimited(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCHEDSVC_MAX_DEVICE_BYTES=inf was refused as "not a byte size", though the documentation allows it."""
    monkeypatch.setenv("SCHEDSVC_MAX_DEVICE_BYTES", text)
    config = ss.Config()
    assert config.max_device_bytes is None
    assert config.sources()["max_device_bytes"] == "environment SCHEDSVC_MAX_DEVICE_BYTES"


def test_pending_bytes_from_the_environment_cannot_be_unlimited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING_BYTES", "inf")
    with pytest.raises(ss.ConfigError, match="max_pending_bytes: it cannot be unlimited"):
        ss.Config()


def test_a_trace_path_with_a_nul_character_is_refused_at_construction() -> None:
    """It used to pass engine start and fail with a raw ValueError at aclose(), after all the work."""
    with pytest.raises(ss.ConfigError, match=r"trace_path: a path cannot contain a NUL character"):
        ss.Config(trace_path="run\0.json")
    with pytest.raises(ss.ConfigError, match="trace_path"):
        ss.Engine(cpu_workers=1, trace_path="runs/\0/run.json")


def test_infinity_in_toml_names_the_field(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending_bytes = inf\n")
    with pytest.raises(ss.ConfigError, match="max_pending_bytes: it cannot be unlimited"):
        ss.Config.from_file(path)


def test_a_misspelt_environment_variable_warns_naming_the_one_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHEDSVC_CPU_WORKER=7 used to be ignored without a word."""
    monkeypatch.setenv("SCHEDSVC_CPU_WORKER", "7")
    with pytest.warns(
        ss.ConfigWarning,
        match="SCHEDSVC_CPU_WORKER names no schedsvc setting and is ignored; did you mean SCHEDSVC_CPU_WORKERS?",
    ):
        config = ss.Config()
    assert config.cpu_workers == engine_cores()


def test_an_unknown_environment_variable_warns_listing_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("schedsvc_zzz", "1")
    with pytest.warns(
        UserWarning,
        match="schedsvc_zzz names no schedsvc setting and is ignored; the settings are SCHEDSVC_CPU_WORKERS",
    ):
        ss.Config()


def test_known_environment_variables_do_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_CPU_WORKERS", "3")
    monkeypatch.setenv("schedsvc_max_pending", "5")
    monkeypatch.setenv("SCHEDSVCX_CPU_WORKERS", "9")  # another program's prefix
    assert ss.Config().cpu_workers == 3  # warnings are errors in this test suite


def test_invalid_environment_value_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_CPU_WORKERS", "abc")
    with pytest.raises(ss.ConfigError, match="cpu_workers"):
        ss.Config()


def test_invalid_toml_value_names_the_field(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending = -3\n")
    with pytest.raises(ss.ConfigError, match="max_pending"):
        ss.Config.from_file(path)


def test_config_error_is_a_value_error_and_a_schedsvc_error() -> None:
    with pytest.raises(ValueError):
        ss.Config(max_pending=0)
    with pytest.raises(ss.SchedsvcError):
        ss.Config(max_pending=0)


def test_extra_fields_are_rejected() -> None:
    with pytest.raises(ss.ConfigError, match="bogus: there is no such setting; the settings are cpu_workers"):
        ss.Config(bogus=1)


def test_a_misspelt_field_names_the_setting_meant() -> None:
    with pytest.raises(
        ss.ConfigError, match="cpu_worker: there is no such setting; did you mean 'cpu_workers'"
    ):
        ss.Engine(cpu_worker=2)


def test_extra_fields_in_toml_are_rejected(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending = 7\nbogus = 3\n")
    with pytest.raises(ss.ConfigError, match="bogus"):
        ss.Config.from_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ss.ConfigError, match="does-not-exist"):
        ss.Config.from_file(tmp_path / "does-not-exist.toml")


def test_a_directory_is_not_said_to_be_missing(tmp_path: Path) -> None:
    with pytest.raises(ss.ConfigError, match="is a directory; name a TOML file"):
        ss.Config.from_file(tmp_path)


def test_a_file_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "schedsvc.toml"
    path.write_bytes(b"max_pending = 3\n\xff\xfe")
    with pytest.raises(ss.ConfigError, match="is not valid TOML: it is not UTF-8 text"):
        ss.Config.from_file(path)


def test_malformed_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_pending = = 3\n")
    with pytest.raises(ss.ConfigError, match="TOML"):
        ss.Config.from_file(path)


def test_devices_are_validated_and_deduplicated() -> None:
    assert ss.Config(devices=["cpu", "cuda:0", "cpu"]).devices == ("cpu", "cuda:0")
    assert ss.Config(devices=("cuda:1",)).devices == ("cuda:1",)


def test_engine_takes_a_config_and_keyword_overrides() -> None:
    config = ss.Config(cpu_workers=3, max_pending=7)
    eng = ss.Engine(config, max_pending=8)
    assert eng.config.cpu_workers == 3
    assert eng.config.max_pending == 8
    assert ss.Engine(max_pending=5).config.max_pending == 5
    assert ss.Engine(config).config is config


def test_engine_rejects_bad_configuration_at_construction() -> None:
    with pytest.raises(ss.ConfigError, match="max_pending"):
        ss.Engine(max_pending=-1)
    with pytest.raises(ss.ConfigError, match="cpu_workers"):
        ss.Engine(ss.Config(), cpu_workers=0)
    with pytest.raises(ss.ConfigError, match="bogus"):
        ss.Engine(bogus=True)


def test_engine_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "13")
    assert ss.Engine().config.max_pending == 13


# -- where each value came from ---------------------------------------------------------------------------


@pytest.mark.parametrize("in_file", [False, True])
@pytest.mark.parametrize("in_env", [False, True])
@pytest.mark.parametrize("by_keyword", [False, True])
def test_sources_follow_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_file: bool, in_env: bool, by_keyword: bool
) -> None:
    """Every combination of file, environment and keyword: the highest one present gives value and source."""
    path = write_toml(tmp_path, "max_pending = 7\n" if in_file else "cpu_workers = 3\n")
    if in_env:
        monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    config = ss.Config.from_file(path, **({"max_pending": 11} if by_keyword else {}))
    expected = (
        (11, "keyword")
        if by_keyword
        else (9, "environment SCHEDSVC_MAX_PENDING")
        if in_env
        else (7, f"file {path}")
        if in_file
        else (1024, "default")
    )
    assert (config.max_pending, config.sources()["max_pending"]) == expected


def test_sources_name_every_field_and_default_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_toml(tmp_path, "cpu_workers = 3\n")
    monkeypatch.setenv("SCHEDSVC_DEVICES", "cpu")
    config = ss.Config.from_file(path, max_pending=5)
    sources = config.sources()
    assert list(sources) == list(ss.Config.model_fields)
    assert sources.pop("cpu_workers") == f"file {path}"
    assert sources.pop("devices") == "environment SCHEDSVC_DEVICES"
    assert sources.pop("max_pending") == "keyword"
    assert set(sources.values()) == {"default"}


def test_sources_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_SYNC_MODE", "1")
    sources = ss.Config(cpu_workers=2).sources()
    assert sources["sync_mode"] == "environment SCHEDSVC_SYNC_MODE"
    assert sources["cpu_workers"] == "keyword"
    assert sources["max_pending"] == "default"


def test_a_lowercase_environment_variable_is_named_in_upper_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("schedsvc_max_pending", "9")  # settings names are case-insensitive
    config = ss.Config()
    assert (config.max_pending, config.sources()["max_pending"]) == (9, "environment SCHEDSVC_MAX_PENDING")


def test_a_keyword_equal_to_the_default_is_still_a_keyword() -> None:
    assert ss.Config(max_pending=1024).sources()["max_pending"] == "keyword"


def test_sources_is_a_copy() -> None:
    config = ss.Config(max_pending=5)
    config.sources()["max_pending"] = "default"
    assert config.sources()["max_pending"] == "keyword"


def test_equal_settings_are_equal_configs_wherever_they_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "1024")
    from_env, by_default = ss.Config(), ss.Config(max_pending=1024)
    assert from_env.sources()["max_pending"] != by_default.sources()["max_pending"]
    assert from_env == by_default
    assert hash(from_env) == hash(by_default)
    assert from_env != ss.Config(max_pending=5)


def test_replace_keeps_the_other_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_toml(tmp_path, "cpu_workers = 3\n")
    monkeypatch.setenv("SCHEDSVC_MAX_PENDING", "9")
    config = ss.Config.from_file(path).replace(max_pending_bytes="1MiB", sync_mode=True)
    assert (config.cpu_workers, config.max_pending, config.max_pending_bytes) == (3, 9, 2**20)
    sources = config.sources()
    assert sources["cpu_workers"] == f"file {path}"
    assert sources["max_pending"] == "environment SCHEDSVC_MAX_PENDING"
    assert sources["max_pending_bytes"] == sources["sync_mode"] == "keyword"
    assert sources["devices"] == "default"


def test_replace_validates_and_ignores_a_changed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ss.Config()
    with pytest.raises(ss.ConfigError, match="max_pending"):
        config.replace(max_pending=0)
    with pytest.raises(ss.ConfigError, match="bogus"):
        config.replace(bogus=1)
    monkeypatch.setenv("SCHEDSVC_CPU_WORKERS", "7")  # set after config was made: not read again
    assert config.replace(max_pending=3).cpu_workers == config.cpu_workers
    assert config.replace() is config


def test_engine_keywords_keep_the_sources_of_the_config(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "cpu_workers = 3\n")
    eng = ss.Engine(ss.Config.from_file(path), max_pending=7)  # not started: no threads
    assert (eng.config.cpu_workers, eng.config.max_pending) == (3, 7)
    sources = eng.config.sources()
    assert (sources["cpu_workers"], sources["max_pending"]) == (f"file {path}", "keyword")


# -- blas_threads: BLAS threads per CPU worker --------------------------------------------------------------


def test_blas_threads_defaults_to_auto_and_takes_its_words_numbers_and_none() -> None:
    assert ss.Config().blas_threads is None  # auto
    taken = {None: None, "auto": None, " AUTO ": None, "none": None, "leave": 0, 0: 0, 3: 3, "4": 4, 2.0: 2}
    for given, expected in taken.items():
        assert ss.Config(blas_threads=given).blas_threads == expected, given


@pytest.mark.parametrize("bad", [True, -1, 1.5, "2.5", "many", "", 1025])
def test_blas_threads_refuses_what_is_not_a_count_naming_the_field_and_its_words(bad: Any) -> None:
    with pytest.raises(ss.ConfigError, match=r"blas_threads: .*SCHEDSVC_BLAS_THREADS") as caught:
        ss.Config(blas_threads=bad)
    if not isinstance(bad, int) or isinstance(bad, bool):
        assert "'auto'" in str(caught.value) and "'leave'" in str(caught.value)


@pytest.mark.parametrize(("variable", "expected"), [("auto", None), ("leave", 0), ("3", 3)])
def test_blas_threads_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, variable: str, expected: int | None
) -> None:
    monkeypatch.setenv("SCHEDSVC_BLAS_THREADS", variable)
    config = ss.Config()
    assert config.blas_threads == expected
    assert config.sources()["blas_threads"] == "environment SCHEDSVC_BLAS_THREADS"
    monkeypatch.setenv("SCHEDSVC_BLAS_THREADS", "lots")
    with pytest.raises(ss.ConfigError, match="SCHEDSVC_BLAS_THREADS"):
        ss.Config()


def test_blas_threads_from_a_toml_file_which_has_no_none(tmp_path: Path) -> None:
    assert ss.Config.from_file(write_toml(tmp_path, 'blas_threads = "auto"\n')).blas_threads is None
    assert ss.Config.from_file(write_toml(tmp_path, 'blas_threads = "leave"\n')).blas_threads == 0
    assert ss.Config.from_file(write_toml(tmp_path, "blas_threads = 2\n")).blas_threads == 2
