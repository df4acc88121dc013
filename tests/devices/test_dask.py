"""The Dask backend's own behaviour: where values live, what is refused, cancel, close, lost workers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc._runtime import Remote
from tests.conftest import start_local_cluster
from tests.helpers import FileGate, until, within
from tests.test_trace import check_well_formed, load

pytestmark = pytest.mark.dask
distributed = pytest.importorskip("distributed")


def engine(address: str, **options: Any) -> ss.Engine:
    return ss.Engine(backend="dask", dask_address=address, cpu_workers=2, **options)


def worker_pid() -> int:
    return os.getpid()


def die() -> None:
    os._exit(1)  # the worker process dies while running this task


async def test_intermediate_values_stay_on_the_cluster_until_awaited(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        a = await eng.submit(np.arange, 1000)
        b = eng.submit_nowait(np.multiply, a, 2)
        total = eng.submit_nowait(np.sum, b)
        await within(eng.waitall())
        # finished, but only handles to the workers' data are here
        for fut in (a, b, total):
            assert isinstance(fut.value, Remote)
        assert await within(total) == 999 * 1000
        assert isinstance(a.value, Remote)  # never fetched: a and b stayed on the workers


async def test_tasks_run_in_the_worker_processes(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        pids = await within(asyncio.gather(*[eng.run(worker_pid) for _ in range(4)]))
    assert os.getpid() not in pids


async def test_writes_through_a_closure_are_refused_with_what_to_do(dask_address: str) -> None:
    buf = np.zeros(3)
    async with engine(dask_address) as eng:
        with pytest.raises(ss.InvalidTask, match=r"writes=.*another process.*Return the new array"):
            eng.submit_nowait(buf.fill, 1.0, writes=buf)
        with pytest.raises(ss.InvalidTask, match="out= must be a NumPy array"):
            eng.submit_nowait(np.add, 1, 1, out=[0])


async def test_tensors_and_compile_are_refused(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        with pytest.raises(ss.InvalidTask, match="not available with backend='dask'"):
            eng.asarray(np.ones(3))
        with pytest.raises(ss.InvalidTask, match="not available with backend='dask'"):
            eng.zeros(3)
        with pytest.raises(ss.InvalidTask, match="not available with backend='dask'"):
            eng.compile(lambda x: x + 1)


async def test_settings_that_cannot_apply_fail_at_start(dask_address: str) -> None:
    with pytest.raises(ss.SchedsvcError, match="sync_mode"):
        await engine(dask_address, sync_mode=True).start()
    with pytest.raises(ss.DeviceError, match="CPU tasks only"):
        await engine(dask_address, devices=("cpu", "cuda:0")).start()


async def test_an_unreachable_scheduler_says_what_to_do() -> None:
    eng = ss.Engine(backend="dask", dask_address="tcp://127.0.0.1:1", dask_timeout_s=1.0)
    with pytest.raises(ss.SchedsvcError, match="could not reach the Dask scheduler"):
        await within(eng.start(), 60)


async def test_result_on_the_event_loop_thread_is_refused(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        fut = eng.submit_nowait(np.add, 1, 1)
        with pytest.raises(ss.SchedsvcError, match="use 'await fut'"):
            fut.result()
        assert await within(fut) == 2


async def test_cancel_of_a_task_sent_to_dask_cancels_its_dask_future(
    dask_address: str, tmp_path: Path
) -> None:
    gate = FileGate(str(tmp_path))
    async with engine(dask_address) as eng:
        held = [eng.submit_nowait(gate.hold(i)) for i in range(2)]
        await gate.wait_started(2)  # both workers busy: the next task waits on the cluster
        sent = eng.submit_nowait(np.add, 1, 1)
        child = eng.submit_nowait(np.add, sent, 1)  # forwarded to the cluster behind it
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        await until(lambda: sent in device.sent)
        assert sent.running()  # in schedsvc's terms it has started: Dask has it
        assert sent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(sent)
        # cancelled, as a task cancelled before it started is; and so is what takes its value
        assert sent.cancelled() and sent.error is None
        assert (await within(child.wait())).cancelled()
        gate.open()
        assert [await within(f) for f in held] == [0, 1]
        stats = eng.stats()
        assert (stats.cancelled, stats.failed) == (2, 0)


async def test_a_chain_goes_to_the_cluster_before_its_head_finishes(
    dask_address: str, tmp_path: Path
) -> None:
    gate = FileGate(str(tmp_path))
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        head = eng.submit_nowait(gate.hold(1))
        chain = [head]
        for _ in range(3):
            chain.append(eng.submit_nowait(np.add, chain[-1], 1))
        await gate.wait_started(1)
        # Dask orders the links itself: each went out as soon as it was submitted
        assert all(f in device.sent for f in chain)
        assert [f.state for f in chain[1:]] == ["waiting"] * 3
        gate.open()
        assert await within(chain[-1]) == 4


async def test_a_task_behind_a_buffer_hazard_waits_for_the_core(dask_address: str, tmp_path: Path) -> None:
    gate = FileGate(str(tmp_path))
    buf = np.zeros(2)
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        head = eng.submit_nowait(gate.hold(1))
        writer = eng.submit_nowait(np.add, buf, head, out=buf)  # written back here, in order
        reader = eng.submit_nowait(np.sum, buf)  # must see the write: held by the core, not sent
        await gate.wait_started(1)
        assert writer not in device.sent and reader not in device.sent
        gate.open()
        assert await within(reader) == 2


async def test_embedded_local_cluster_is_started_and_closed() -> None:
    eng = ss.Engine(backend="dask", cpu_workers=2)  # no address: a LocalCluster on 127.0.0.1
    await within(eng.start(), 60)
    try:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        assert device.cluster is not None
        assert device.cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert await within(eng.run(np.add, 2, 3)) == 5
    finally:
        await within(eng.aclose(), 60)
    assert device.client.status == "closed"
    assert device.cluster.status.name == "closed"


@pytest.fixture(scope="module")
def fragile_address() -> Iterator[str]:
    """A cluster of its own for killing workers: a task may be retried once, then it fails."""
    cluster = start_local_cluster(**{"distributed.scheduler.allowed-failures": 1})
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


async def test_a_worker_killed_mid_task_is_retried_elsewhere(fragile_address: str, tmp_path: Path) -> None:
    gate = FileGate(str(tmp_path))
    async with engine(fragile_address) as eng:
        held = eng.submit_nowait(gate.hold(21))
        doubled = eng.submit_nowait(np.multiply, held, 2)
        await gate.wait_started(1)
        os.kill(gate.started()[0], signal.SIGKILL)  # the worker dies while the task runs
        gate.open()
        assert await within(doubled, 60) == 42  # Dask ran it again on a live worker
        assert len(gate.started()) == 2


async def test_a_task_that_keeps_killing_workers_fails_clearly(fragile_address: str) -> None:
    async with engine(fragile_address) as eng:
        fut = eng.submit_nowait(die)
        child = eng.submit_nowait(np.add, fut, 1)
        with pytest.raises(distributed.KilledWorker):
            await within(fut, 60)
        with pytest.raises(ss.DependencyError, match="KilledWorker"):
            await within(child)
        assert await within(eng.run(np.add, 1, 1), 60) == 2  # the engine keeps serving


async def test_a_traced_run_has_a_span_per_task_on_a_track_per_dask_worker(
    dask_address: str, tmp_path: Path
) -> None:
    path = tmp_path / "dask.json"
    buf = np.zeros(4)
    async with engine(dask_address) as eng:
        with eng.trace(path):
            a = await eng.submit(np.ones, (32, 32))
            b = await eng.submit(np.dot, a, a)  # a data edge across the cluster
            c = await eng.submit(np.add, b, 1.0)
            w = await eng.submit(np.add, buf, 1.0, out=buf)  # written back here
            r = await eng.submit(np.sum, buf)  # after the write: a hazard edge
            bad = await eng.submit(np.dot, np.ones(3), np.ones(4))
            await within(eng.waitall())
        busy = dict(eng.stats().worker_busy_s)
    events = load(path)
    by_task = check_well_formed(events)  # spans closed, flows bound, dependents never overlap
    assert sorted(by_task) == sorted(f.seq for f in (a, b, c, w, r, bad))
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks and all(t.startswith("dask tcp://127.0.0.1:") for t in tracks), tracks
    assert by_task[b.seq]["name"] == "dot"
    assert by_task[b.seq]["args"]["shapes"] == [[32, 32], [32, 32]]  # the values the worker took
    assert "not aligned" in by_task[bad.seq]["args"]["error"]
    flows = {e["id"]: e for e in events if e["ph"] in "sf"}
    assert len(flows) >= 3  # a->b, b->c, w->r at least
    # the busy time of each worker is the sum of its spans
    assert busy.keys() == tracks
    assert sum(busy.values()) == pytest.approx(sum(s["dur"] for s in by_task.values()) / 1e6, rel=0.01)


async def test_untraced_tasks_log_no_spans(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        assert await within(eng.run(np.add, 1, 2)) == 3
        fut = await eng.submit(np.multiply, 3, 4)
        assert await within(fut) == 12
        assert device.spans.traced == {} and eng.stats().worker_busy_s == {}


async def test_a_lost_span_event_does_not_hold_the_task(
    dask_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from schedsvc.devices import _dask_spans

    monkeypatch.setattr(_dask_spans, "SPAN_WAIT_S", 0.2)
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        device.spans.topic = "nobody-listens"  # the worker logs the span where this engine does not hear it
        with eng.trace(tmp_path / "lost.json"):
            assert await within(eng.run(np.add, 2, 2)) == 4  # done after the short wait, without a span
        assert device.spans.traced == {}
    assert [e for e in load(tmp_path / "lost.json") if e["ph"] == "X"] == []


def spy_on_gather(device: Any) -> list[int]:
    """Record the number of futures in each ``client.gather`` the engine makes."""
    calls: list[int] = []
    real = device.client.gather

    async def gather(futures: list[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(futures))
        return await real(futures, *args, **kwargs)

    device.client.gather = gather
    return calls


async def test_values_awaited_together_come_back_in_one_gather(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        futures = [eng.submit_nowait(np.add, 0.5, i) for i in range(50)]
        await within(eng.waitall())
        calls = spy_on_gather(device)
        assert await within(asyncio.gather(*futures)) == [0.5 + i for i in range(50)]
        assert calls == [50]  # one round trip for the lot
        assert await within(futures[0]) == 0.5 and calls == [50]  # kept: not fetched again
        assert await within(eng.run(np.add, 1, 1)) == 2
        assert calls == [50, 1]  # awaited alone: a gather of one


async def test_a_value_that_cannot_be_fetched_fails_alone(dask_address: str) -> None:
    async with engine(dask_address) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        lost, kept = eng.submit_nowait(np.add, 1, 1), eng.submit_nowait(np.add, 2, 2)
        await within(eng.waitall())
        await within(device.client.cancel([lost.value.handle]))  # the cluster drops its value
        outcomes = await within(asyncio.gather(lost, kept, return_exceptions=True))
        assert isinstance(outcomes[0], distributed.client.FutureCancelledError)
        assert outcomes[1] == 4  # the batch's failure is not its neighbour's


async def test_an_outcome_the_cluster_cannot_give_fails_the_task_and_is_a_warning(
    dask_address: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def lost(self: Any) -> None:
        raise OSError("connection to the scheduler lost")

    async with engine(dask_address) as eng:
        monkeypatch.setattr(distributed.Future, "_exception", lost)
        with caplog.at_level(logging.WARNING, logger="schedsvc.devices.dask"):
            fut = eng.submit_nowait(np.add, 1, 1)
            with pytest.raises(OSError, match="scheduler lost"):
                await within(fut)
        monkeypatch.undo()
    (record,) = [r for r in caplog.records if r.name == "schedsvc.devices.dask"]
    said = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "could not be read from the cluster (OSError: connection to the scheduler lost)" in said


# -- issue 15: regressions of the bad-input sweep -----------------------------------------------------


async def test_map_without_max_inflight_pulls_at_most_its_window_ahead(dask_address: str) -> None:
    """``eng.map`` on Dask had no default window: the device's size (1 << 30) made it two billion, so
    with a large ``max_pending`` the whole source was pulled and submitted before the first result
    (100,000 items, 1.1 GiB).  The window is now twice the cluster's worker threads."""
    pulled = 0

    def source() -> Iterator[int]:
        nonlocal pulled
        for i in range(40):
            pulled += 1
            yield i

    async with engine(dask_address, max_pending=10**6) as eng:
        device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
        assert device.concurrency == 2  # the cluster's 2 single-threaded workers
        window = 2 * device.concurrency
        results = eng.map(np.negative, source())
        got = []
        while len(got) < 40:
            got.append(await within(anext(results)))
            # never more than the window past what was yielded (this result's slot is free again)
            assert pulled <= len(got) + window, (len(got), pulled)
        await results.aclose()
    assert got == [-i for i in range(40)]


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("hangs", "did not close within 0.1 s"),
        ("times out", "did not close within 0.1 s"),
        ("fails", r"failed to close \(OSError: connection reset\)"),
    ],
)
async def test_a_client_that_will_not_close_is_a_warning_not_an_error(
    dask_address: str, monkeypatch: pytest.MonkeyPatch, how: str, said: str
) -> None:
    """``aclose()`` raised ``TimeoutError`` from ``client.close()`` when the scheduler was slow to
    answer (after a large map), although every result had been delivered; now the close of the client
    is bounded and a failure is a ``RuntimeWarning``."""
    from schedsvc.devices import _dask_cluster

    monkeypatch.setattr(_dask_cluster, "CLOSE_TIMEOUT_S", 0.1)
    eng = await within(engine(dask_address).start(), 60)
    device: Any = eng._rt.devices["cpu"]  # type: ignore[union-attr]
    real_close = device.client.close

    async def stuck_close(*args: Any, **kwargs: Any) -> None:
        if how == "hangs":
            await asyncio.Event().wait()
        if how == "fails":
            raise OSError("connection reset")
        raise TimeoutError("distributed's own close timeout")

    device.client.close = stuck_close
    try:
        assert await within(eng.run(np.add, 1, 2)) == 3
        with pytest.warns(RuntimeWarning, match=f"the Dask client {said}; the engine closed anyway"):
            await within(eng.aclose())
        assert eng.closed
    finally:
        del device.client.close  # the real one again (Client.__del__ calls it)
        await within(real_close())


def locked(flag: int, lock: Any = None) -> bool:
    return bool(flag) and lock is not None and lock.locked()


async def test_an_unpicklable_argument_names_the_task_and_the_argument(dask_address: str) -> None:
    """An argument that cannot be pickled failed with Dask's "Could not serialize object of type
    LLGExpr" (the task graph), which named neither the task nor the argument nor what to do."""
    lock = threading.Lock()
    said = r"cannot be sent to the Dask workers \(cannot pickle '_thread.lock' object\)\. Pass picklable data"
    async with engine(dask_address) as eng:
        by_position = eng.submit_nowait(locked, 1, lock, name="guarded")
        by_keyword = eng.submit_nowait(locked, 1, lock=lock)
        in_a_closure = eng.submit_nowait(lambda: lock.locked())
        child = eng.submit_nowait(np.add, by_position, 1)
        with pytest.raises(ss.InvalidTask, match=rf"task 'guarded' \(#\d+\): argument 1, a lock, {said}"):
            await within(by_position)
        with pytest.raises(
            ss.InvalidTask, match=rf"task 'locked' \(#\d+\): keyword argument 'lock', a lock, {said}"
        ):
            await within(by_keyword)
        with pytest.raises(
            ss.InvalidTask, match=rf"task '<lambda>' \(#\d+\): its function, a function, {said}"
        ):
            await within(in_a_closure)
        with pytest.raises(
            ss.InvalidTask, match="or use backend='threads' to run tasks in this process"
        ) as info:
            await within(by_position)
        assert isinstance(info.value, TypeError)  # as Dask's own error was
        assert isinstance(info.value.__cause__, TypeError)  # pickle's error, about the argument itself
        with pytest.raises(ss.DependencyError):
            await within(child)
        assert await within(eng.run(np.add, 1, 1)) == 2  # the engine keeps serving


NO_MAIN_GUARD = """
import asyncio
import numpy as np
import schedsvc as ss

async def main():
    async with ss.Engine(backend="dask", cpu_workers=2) as eng:
        print(await eng.run(np.add, 1, 2))

asyncio.run(main())
"""


def run_python(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a program in a fresh interpreter that imports this checkout's schedsvc."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
    )


def test_a_script_without_a_main_guard_gets_one_error_that_says_what_to_do(tmp_path: Path) -> None:
    """Dask starts its workers with the spawn method, which runs the main module again in each; a script
    without a main guard started the engine again in every worker, and failed with 473 lines of stderr,
    12 tracebacks and "Nanny failed to start", none of it naming the cause."""
    script = tmp_path / "no_guard.py"
    script.write_text(NO_MAIN_GUARD)
    done = run_python(str(script), cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith("schedsvc._errors.DeviceError: backend='dask' could not start a local cluster"), (
        last
    )
    assert f"runs the main module ({script}) again" in last
    assert 'under `if __name__ == "__main__":`' in last and "dask_address=" in last
    assert "ran " + str(script) + " again, and it starts an engine: this worker exits" in done.stderr
    # one short notice from the worker, then one traceback (the chained ones of Dask's start, and the
    # engine's start), not one per worker
    assert len(done.stderr.splitlines()) < 50, done.stderr


def test_a_program_read_from_stdin_is_refused_before_a_cluster_starts(tmp_path: Path) -> None:
    """``python -`` with the Dask backend: every spawned worker failed to run '<stdin>' as a file, with a
    traceback each, then "Nanny failed to start"; a main guard does not help there."""
    done = run_python("-", cwd=tmp_path, stdin=NO_MAIN_GUARD)
    assert done.returncode == 1 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith("schedsvc._errors.DeviceError: backend='dask' cannot start a local cluster"), last
    assert (
        "'<stdin>' is no file" in last and "Run the program from a file" in last and "dask_address=" in last
    )
    assert "Nanny" not in done.stderr  # refused before any worker process started
    assert len(done.stderr.splitlines()) < 40, done.stderr
