"""Engine settings: defaults, then a TOML file, then ``SCHEDSVC_*`` variables, then keywords."""

from __future__ import annotations

import contextvars
import difflib
import math
import os
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, PrivateAttr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._errors import ConfigError, ConfigWarning
from .devices import engine_cores, is_device_name

__all__ = ["Config"]

#: the words ``blas_threads`` takes for its two special values
_BLAS_WORDS = {"auto": None, "none": None, "leave": 0}
_WRITE_BYTES = "write a whole number of bytes such as 16777216, or a size such as '16MiB' or '2GB'"
_PREFIX = "SCHEDSVC_"
_toml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("schedsvc_toml", default=None)
# field -> where its value came from, filled by the sources of the Config being built in this context
_found: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("schedsvc_found")


def _byte_size(value: Any) -> Any:
    """What pydantic's ``ByteSize`` takes (``16777216``, ``"16MiB"``, ``"2 GB"``), held to whole bytes.

    ``ByteSize`` parses the number and the unit; here a plain count of bytes must be a whole number
    (``1e9`` is, ``1.7`` and ``"1.5B"`` are not, where ``ByteSize`` would round them down), and a string
    must be a size and nothing more (``ByteSize`` ignores what follows one: ``"16MiB!"``).  A size with
    a unit is rounded down to whole bytes (``"1.3MiB"``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{_kind(value)} is not a byte size; {_WRITE_BYTES}")
    if isinstance(value, float):
        return _whole(value, _WRITE_BYTES)
    if isinstance(value, int):
        return value
    match = ByteSize.byte_string_re.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a byte size; {_WRITE_BYTES}")
    number, unit = match.groups()
    if unit is None or unit.lower() == "b":  # a count of bytes
        return _whole(float(number) if "." in number else int(number), _WRITE_BYTES)
    return value.strip()


def byte_count(value: int | float | str) -> int:
    """``value`` in bytes, read as the settings read sizes (``16777216``, ``"16MiB"``, ``"2 GB"``).

    Raises ValueError saying what to write when ``value`` is not a size.
    """
    from pydantic import TypeAdapter

    try:
        return int(TypeAdapter(ByteSize).validate_python(_byte_size(value)))
    except ValidationError as exc:  # a negative count, or an unknown unit ("64parsecs")
        raise ValueError(f"{value!r} is not a byte size; {_WRITE_BYTES}") from exc


def _whole(value: int | float, how: str) -> int:
    """An int, or a float that is a whole number (``1e9`` from TOML); anything else is refused."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number; {how}")
        if not value.is_integer():
            raise ValueError(f"{value} is not a whole number; {how}")
    return int(value)


def _number_in(text: str) -> int | float | str:
    """The int or float ``text`` spells, or ``text`` itself for pydantic to refuse."""
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _kind(value: Any) -> str:
    """How a value of the wrong type is named in a message: a bool or a list is not a number."""
    return repr(value) if isinstance(value, bool) else f"a {type(value).__name__}"


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a modest machine
        return 8 * 2**30


class Config(BaseSettings):
    """Validated, immutable engine settings.

    Precedence, lowest first: field defaults, the TOML file given to
    ``Config.from_file``, ``SCHEDSVC_<FIELD>`` environment variables, keywords.
    ``config.sources()`` says which of these gave each field its value.
    """

    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="forbid", frozen=True)

    cpu_workers: int = Field(default_factory=lambda: engine_cores(), ge=1, le=1024)
    """CPU worker threads; by default one per core this process may run on (its CPU affinity:
    ``os.sched_getaffinity``, or ``os.process_cpu_count()`` on Python 3.13), so that a process limited to
    some cores (``taskset``, a container's cpuset) does not start a worker for each core of the machine."""
    blas_threads: int | None = Field(default=None, ge=0, le=1024)
    """BLAS threads per CPU worker (OpenBLAS, MKL, BLIS), held while the engine is open and restored when it
    closes; the setting is process-wide, so it applies to code on the event loop too.  None (``"auto"``):
    at most cores // ``cpu_workers``, at least 1 (a lower count is kept), unless ``OPENBLAS_NUM_THREADS``,
    ``OMP_NUM_THREADS`` (or MKL's, BLIS's) is set; a number: exactly that; 0 (``"leave"``): BLAS is left
    alone."""
    devices: Annotated[tuple[str, ...], NoDecode] = ("cpu",)
    """Devices the engine may run on: ``cpu`` and ``cuda:N``."""
    streams_per_device: int = Field(default=2, ge=1, le=64)
    """Compute streams per CUDA device."""
    max_pending: int = Field(default=1024, ge=1)
    """Tasks admitted and not yet finished; ``await submit`` waits beyond this."""
    max_pending_bytes: ByteSize = Field(default_factory=lambda: ByteSize(_physical_memory() // 4), ge=1)
    """Bytes that unfinished tasks hold (array and other buffer arguments -- ``bytes``, ``memoryview`` --
    once each, plus declared outputs)."""
    max_device_bytes: ByteSize | None = Field(default=None, ge=1)
    """Per-CUDA-device byte budget; None (or ``"unlimited"``, ``inf``): no limit beyond the device's memory.
    It counts the bytes of the device's unfinished tasks and what its memory pool holds (results still
    referenced included); a submission that only dropping referenced results could make room for raises
    MemoryLimitError."""
    cuda_simulator: bool = False
    """Run ``cuda:N`` devices on the CUDA simulator: strict, asynchronous simulated streams, for
    testing GPU pipelines where there is no GPU (``schedsvc.devices.cudasim``)."""
    inline_threshold_us: float = Field(default=20.0, ge=0.0, allow_inf_nan=False)
    """An awaited task of a kind known to take less than this runs in the awaiting
    coroutine, since handing it to a thread and back costs more -- NumPy's functions, the engine's own
    operations and a module's builtins only: never a user's function, which might wait for the loop; 0
    turns this off."""
    cuda_launch_inline_us: float = Field(default=1000.0, ge=0.0, allow_inf_nan=False)
    """A task on a CUDA device is launched on the thread that made it ready (the event loop's, for a Tensor
    op) once the last launch of its kind -- its function, and its arguments' dtypes and ranks -- took less
    than this; a kind not launched before (CuPy compiles a kernel at its first use), a slower one, and the
    wait for device memory go to the device's own thread.  0: every launch on the device's thread."""
    sync_mode: bool = False
    """Debugging: run each task in the caller at submission and raise its error there."""
    latency_histograms: bool = False
    """Record every task's queue wait and run time into histograms (``Stats.queue_wait_histogram`` and
    ``run_time_histogram``, exported by ``PrometheusCollector``); off, they stay empty.  It costs about 4%
    of the engine's own time per task."""
    trace_path: str | None = Field(default=None, min_length=1)
    """Record a Chrome/Perfetto trace of the engine's whole life to this JSON file (see ``eng.trace``)."""
    backend: Literal["threads", "dask"] = "threads"
    """Where CPU tasks run: this process's threads, or a Dask cluster."""
    dask_address: str | None = None
    """Scheduler address for ``backend="dask"``; None starts a local cluster (``cpu_workers`` processes)."""
    dask_timeout_s: float = Field(default=30.0, gt=0.0, allow_inf_nan=False)
    """``backend="dask"``: how long to try to reach the scheduler before giving up."""

    _sources: MappingProxyType[str, str] = PrivateAttr(default_factory=lambda: MappingProxyType({}))

    def __init__(self, **values: Any) -> None:
        _warn_unknown_variables()
        found: dict[str, str] = {}
        token = _found.set(found)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from exc
        finally:
            _found.reset(token)
        self._sources = MappingProxyType(found)

    def sources(self) -> dict[str, str]:
        """Where each field's value came from: ``"default"``, ``"file <path>"``,
        ``"environment SCHEDSVC_<FIELD>"`` or ``"keyword"``."""
        found = self._sources
        return {name: found.get(name, "default") for name in type(self).model_fields}

    @property
    def default_device(self) -> str:
        """Where a task or Tensor runs when it names no device: ``cpu`` if it is one of the
        ``devices``, else the first."""
        return "cpu" if "cpu" in self.devices else self.devices[0]

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (validated); the other fields keep their values and sources."""
        if not changes:
            return self
        new = type(self)(**{**self.model_dump(), **changes})
        new._sources = MappingProxyType({**self._sources, **dict.fromkeys(changes, "keyword")})
        return new

    def __eq__(self, other: object) -> bool:
        # equal settings are equal configs, wherever their values came from
        return type(other) is type(self) and self.__dict__ == other.__dict__

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> Config:
        """Settings from a TOML file; environment variables and ``overrides`` still win."""
        path = Path(path)
        _check_toml(path)
        token = _toml_file.set(path)
        try:
            return cls(**overrides)
        finally:
            _toml_file.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        keyword = _Recorded(init_settings, lambda _: "keyword")
        environment = _Recorded(env_settings, lambda name: f"environment SCHEDSVC_{name.upper()}")
        path = _toml_file.get()
        if path is None:
            return (keyword, environment)
        toml = TomlConfigSettingsSource(settings_cls, toml_file=path)
        return (keyword, environment, _Recorded(toml, lambda _: f"file {path}"))

    @field_validator("cpu_workers", "streams_per_device", "max_pending", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would take True for 1
            raise ValueError(f"{value!r} is not a number; write a whole number such as 4")
        if isinstance(value, str):  # from the environment or `schedsvc info --set`: "4", "1e3", "1.7"
            value = _number_in(value)
        return _whole(value, "write a whole number such as 4") if isinstance(value, float) else value

    @field_validator("blas_threads", mode="before")
    @classmethod
    def _blas_threads(cls, value: Any) -> Any:
        how = "write a whole number such as 1, 'auto' (or None) or 'leave' (or 0)"
        if isinstance(value, bool):  # pydantic would take True for 1
            raise ValueError(f"{value!r} is not a number; {how}")
        if isinstance(value, str):  # from TOML (which has no None), the environment or `schedsvc info --set`
            word = value.strip().lower()
            if word in _BLAS_WORDS:
                return _BLAS_WORDS[word]
            value = _number_in(value)
            if isinstance(value, str):
                raise ValueError(f"{value!r} is not a number of threads; {how}")
        return _whole(value, how) if isinstance(value, float) else value

    @field_validator("inline_threshold_us", "cuda_launch_inline_us", "dask_timeout_s", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would take True for 1.0
            raise ValueError(f"{value!r} is not a number; write a number such as 2.5")
        return value

    @field_validator("max_pending_bytes", mode="before")
    @classmethod
    def _pending_bytes(cls, value: Any) -> Any:
        if _means_unlimited(value):
            raise ValueError(
                "it cannot be unlimited: it is what keeps queued memory bounded; "
                "write a large size such as '1TiB' instead"
            )
        return _byte_size(value)

    @field_validator("max_device_bytes", mode="before")
    @classmethod
    def _device_bytes(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "none":  # None from the environment
            return None
        return None if value is None or _means_unlimited(value) else _byte_size(value)

    @field_validator("trace_path")
    @classmethod
    def _trace_file(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:  # else refused only when the trace is written, at close
            raise ValueError(
                "a path cannot contain a NUL character ('\\x00'); name a .json file, e.g. 'run.json'"
            )
        return value

    @field_validator("devices", mode="before")
    @classmethod
    def _split_devices(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("devices")
    @classmethod
    def _known_devices(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one device, e.g. ('cpu',)")
        for device in value:
            if not is_device_name(device):
                raise ValueError(f"{device!r} is not a device; use 'cpu' or 'cuda:N'")
        return tuple(dict.fromkeys(value))


def _check_toml(path: Path) -> None:
    """A ConfigError unless ``path`` is a readable TOML file: say what it is instead."""
    if path.is_dir():
        raise ConfigError(
            f"config file {str(path)!r} is a directory; name a TOML file, e.g. {str(path / 'default.toml')!r}"
        )
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist; check the path")
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not valid TOML: it is not UTF-8 text ({exc})"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc


def _warn_unknown_variables() -> None:
    """A ``SCHEDSVC_*`` variable that names no setting is ignored: say so (a typo, most often)."""
    names = list(Config.model_fields)
    for variable in os.environ:
        name = variable.upper().removeprefix(_PREFIX).lower()
        if variable.upper().startswith(_PREFIX) and name not in names:
            close = _closest(name)
            hint = f"did you mean {_PREFIX}{close.upper()}? " if close else ""
            warnings.warn(
                f"environment variable {variable} names no schedsvc setting and is ignored; {hint}"
                f"the settings are {', '.join(_PREFIX + n.upper() for n in names)}",
                ConfigWarning,
                stacklevel=3,
            )


#: how a string says "no limit": the word, or infinity as Python and TOML spell it (``SCHEDSVC_*=inf``)
_UNLIMITED_WORDS = frozenset({"unlimited", "inf", "+inf", "infinity", "+infinity"})


def _means_unlimited(value: Any) -> bool:
    """``"unlimited"`` or ``"inf"`` (any case), or infinity: no byte limit."""
    if isinstance(value, str):
        return value.strip().lower() in _UNLIMITED_WORDS
    return isinstance(value, float) and value == math.inf


class _Recorded(PydanticBaseSettingsSource):
    """A settings source that notes, for the Config being built, which fields it gave a value."""

    def __init__(self, source: PydanticBaseSettingsSource, label: Callable[[str], str]) -> None:
        super().__init__(source.settings_cls)
        self.source = source
        self.label = label

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self.source()
        found = _found.get(None)
        if found is not None:
            for name in values:  # sources run highest precedence first: the first to give a value wins
                found.setdefault(name, self.label(name))
        return values


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "config"
        if err["type"] == "extra_forbidden":
            lines.append(_unknown(field))
            continue
        env = f"SCHEDSVC_{str(err['loc'][0]).upper()}" if err["loc"] else "SCHEDSVC_*"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "byte_size":  # ByteSize's own refusal (of a negative count): say it our way
            message = f"{err.get('input')!r} is not a byte size; {_WRITE_BYTES}"
        elif err["type"] == "byte_size_unit":  # "could not interpret byte unit: parsecs": say what to write
            message = f"{message}; {_WRITE_BYTES}"
        lines.append(f"{field}: {message} (got {err.get('input')!r}; set it by keyword, {env} or TOML)")
    return "invalid schedsvc configuration: " + "; ".join(lines)


def _unknown(field: str) -> str:
    """An unknown setting: say so, and name the closest real one (a typo, most often)."""
    close = _closest(field)
    hint = f"did you mean {close!r}? " if close else ""
    return f"{field}: there is no such setting; {hint}the settings are {', '.join(Config.model_fields)}"


def _closest(name: str) -> str | None:
    """The setting ``name`` most likely meant (keyword, TOML key or environment variable); None if none is close."""
    close = difflib.get_close_matches(name, list(Config.model_fields), n=1)
    return close[0] if close else None
