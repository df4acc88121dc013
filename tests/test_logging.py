"""The ``schedsvc`` loggers: no handler of the library's own, an engine's start and close, no record per task,
and warnings that come in floods logged once, then counted."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc import _logging
from tests.helpers import within

#: the public logger names, as the observing guide lists them
NAMES = (
    "schedsvc.engine",
    "schedsvc.serving",
    "schedsvc.compile",
    "schedsvc.devices.cuda",
    "schedsvc.devices.dask",
)


def schedsvc_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "schedsvc" or r.name.startswith("schedsvc.")]


def test_the_library_adds_no_handler() -> None:
    """The application decides what is shown (until it does, Python's last resort prints warnings)."""
    import schedsvc.compile
    import schedsvc.devices.cuda  # noqa: F401 - every part that logs is imported

    top = logging.getLogger("schedsvc")
    assert top.handlers == []
    assert top.propagate and top.level == logging.NOTSET  # records reach the root logger's handlers
    for name in NAMES:
        logger = logging.getLogger(name)
        assert logger.handlers == [] and logger.propagate and logger.level == logging.NOTSET, name


def test_the_logger_names_are_the_documented_ones() -> None:
    """The observing guide's Logging table lists every logger the library writes to, and no other."""
    named = {
        _logging.ENGINE,
        _logging.SERVING,
        _logging.COMPILE,
        _logging.DEVICES_CUDA,
        _logging.DEVICES_DASK,
    }
    assert named == set(NAMES)
    guide = (Path(__file__).parent.parent / "docs" / "guide" / "observing.md").read_text()
    section = guide.split("## Logging", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(schedsvc[.\w]*)` \|", section, re.M))
    assert documented == named
    written = set(re.findall(r"getLogger\((\w+)\)", _source()))
    assert {getattr(_logging, name) for name in written if name.isupper()} <= named


def _source() -> str:
    """The library's source, every module."""
    package = Path(ss.__file__).parent
    return "\n".join(path.read_text() for path in sorted(package.rglob("*.py")))


async def test_start_and_close_are_logged_with_the_settings_and_a_tally_and_no_task_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between the start record and the close record, 100 tasks (one of them failing) log nothing."""
    caplog.set_level(logging.DEBUG, logger="schedsvc")

    def fail() -> None:
        raise ValueError("bad row")

    async with ss.Engine(cpu_workers=2, max_pending=64, inline_threshold_us=0) as eng:
        futures = [await eng.submit(np.add, i, 1) for i in range(99)]
        futures.append(await eng.submit(fail))
        await within(eng.waitall())
        assert [f.result() for f in futures[:99]] == [i + 1 for i in range(99)]
    started, closed = schedsvc_records(caplog)
    assert (started.name, started.levelno) == ("schedsvc.engine", logging.INFO)
    said = started.getMessage()
    assert said.startswith("engine started: ")
    for setting in (
        "devices=cpu",
        "cpu_workers=2",
        "max_pending=64 ",
        "max_pending_bytes=",
        "backend=threads",
    ):
        assert setting in said, said
    assert "inline_threshold_us=0.0" in said  # a setting given, not left at its default
    assert "sync_mode" not in said  # one left at its default
    assert (closed.name, closed.levelno) == ("schedsvc.engine", logging.INFO)
    assert closed.getMessage().startswith(
        "engine closed: 100 tasks submitted, 99 completed, 1 failed, 0 cancelled; peak pending bytes "
    )


async def test_an_engine_logs_nothing_at_warning_or_above_when_all_goes_well(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="schedsvc")
    async with ss.Engine(cpu_workers=2) as eng:
        assert await within(eng.run(np.add, 1, 2)) == 3
    assert schedsvc_records(caplog) == []


def test_a_throttled_warning_is_logged_at_once_then_counted(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood is a few records: the first, then one per interval that says how many it stands for."""
    caplog.set_level(logging.WARNING, logger="schedsvc")
    monkeypatch.setattr(_logging, "INTERVAL_S", math.inf)  # (no interval passes during the test)
    flood = _logging.Throttled(logging.getLogger("schedsvc.serving"))
    for i in range(5):
        flood.warning("refused %d", i)
    assert [r.getMessage() for r in schedsvc_records(caplog)] == ["refused 0"]
    assert schedsvc_records(caplog)[0].funcName == "test_a_throttled_warning_is_logged_at_once_then_counted"
    monkeypatch.setattr(_logging, "INTERVAL_S", 0.0)  # the interval has passed
    flood.warning("refused %d", 5)
    flood.warning("refused %d", 6)
    said = [r.getMessage() for r in schedsvc_records(caplog)]
    assert said[1].startswith("refused 5 (and 4 more like it in the ") and said[1].endswith(
        " s since the last one logged)"
    )
    assert said[2:] == ["refused 6"]


def test_the_tally_counts_batches_in_words() -> None:
    one = SimpleNamespace(**dict.fromkeys(("submitted", "completed", "failed", "cancelled"), 3))
    one.peak_pending_bytes, one.batches, one.batch_rows = 96, 1, 3
    assert _logging.tally(one).endswith("; 1 batch of 3 rows")
    one.batches = 2
    assert _logging.tally(one).endswith("; 2 batches of 3 rows")


def test_the_settings_shown_are_the_main_ones_and_every_one_not_left_at_its_default() -> None:
    config: Any = ss.Config(devices=("cpu", "cuda:0"), cuda_simulator=True, max_device_bytes="1MiB")
    said = _logging.settings(config)
    assert "devices=cpu,cuda:0" in said and "cpu_workers=" in said and "max_pending=" in said
    assert "max_device_bytes=1048576(1.0MiB)" in said and "cuda_simulator=True" in said
    assert "streams_per_device" not in said  # left at its default
