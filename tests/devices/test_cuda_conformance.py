"""One set of expectations for both bindings of the narrow CUDA API: the simulator and CuPy.

Each test states what CuPy 14.2 did on an H100 (``docs/cuda-facts.md``), or,
where its docstring says so or for the array module's results, what CuPy's
documentation and NumPy's results say; the simulator must do the same.  The ``api`` fixture runs every test on the
simulator, and on CuPy where a GPU is present (``-m gpu`` selects those).

No test sleeps to wait for something: a stream is held by a host callback
blocked on a ``threading.Event`` (``hold``), and every wait is bounded
(``threading.Event.wait(timeout)``, asserted True).  Only one stream is held
at a time: host callbacks may share one driver thread.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from schedsvc.devices import CudaApi, load_cuda_api

#: bound of every wait: far above any real wait, far below the per-test timeout
WAIT_S = 10.0
MiB = 1 << 20
#: CuPy 14.2's messages (docs/cuda-facts.md)
NO_HOST_VIEW = r"^Implicit conversion to a NumPy array is not allowed"
D2H_IN_CAPTURE = r"^the current stream is capturing, so D2H transfers are disallowed"
CUBLAS_IN_CAPTURE = r"^calling cuBLAS API during stream capture is currently unsupported"


def _cupy_available() -> str | None:
    """Why the CuPy binding cannot run here, or None when it can."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    if not cupy.cuda.is_available():
        return "CuPy finds no CUDA device"
    return None


@pytest.fixture(params=["simulator", pytest.param("cupy", marks=pytest.mark.gpu)])
def api(request: pytest.FixtureRequest) -> Iterator[CudaApi]:
    """The binding under test, with no pool limit left behind."""
    if request.param == "cupy" and (reason := _cupy_available()) is not None:
        pytest.skip(reason)
    binding = load_cuda_api(request.param == "simulator")
    _reset(binding)
    binding.use_device(0)  # (the tests' kernels and allocations run on device 0)
    yield binding
    _reset(binding)


def _reset(api: CudaApi) -> None:
    """Knobs off and pools empty (simulator), or no pool limit (CuPy)."""
    if api.name == "simulator":
        from schedsvc.devices.cudasim import simulator

        simulator().reset()
    else:
        api.set_pool_limit(0, None)


# -- helpers -------------------------------------------------------------------------


class Held:
    """A stream held by a host callback until ``release()``; ``entered`` is set once it blocks."""

    def __init__(self, stream: Any) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        stream.launch_host_func(self._block, 0)

    def _block(self, _: object) -> None:
        self.entered.set()
        self.gate.wait(WAIT_S)

    def release(self) -> None:
        self.gate.set()


@contextlib.contextmanager
def hold(stream: Any) -> Iterator[Held]:
    """Hold ``stream`` in the block; released on the way out, also when an assertion fails."""
    held = Held(stream)
    try:
        yield held
    finally:
        held.release()


def synced(event: Any, timeout: float = WAIT_S) -> bool:
    """Whether ``event.synchronize()`` returned within ``timeout`` (it runs on a helper thread)."""
    finished = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            event.synchronize()
        except BaseException as exc:
            errors.append(exc)
        finished.set()

    threading.Thread(target=wait, name="conformance-sync", daemon=True).start()
    ok = finished.wait(timeout)
    if errors:
        raise errors[0]
    return ok


def recorded(api: CudaApi, stream: Any) -> Any:
    """A new event recorded on ``stream`` now."""
    event = api.event()
    event.record(stream)
    return event


def fetch(api: CudaApi, array: Any, stream: Any) -> np.ndarray[Any, Any]:
    """``array``'s contents read after everything enqueued on ``stream`` so far (bounded)."""
    out = api.empty_pinned(array.shape, array.dtype)
    api.d2h(array, out, stream)
    assert synced(recorded(api, stream))
    return np.array(out)


# -- asynchrony and ordering -----------------------------------------------------------


def test_work_is_asynchronous(api: CudaApi) -> None:
    """Enqueueing returns at once; a kernel behind a held callback has not run until released."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((4,), dtype=np.float32)
        a + 1  # loads the kernel: with lazy loading, a first launch may synchronise the device
    with hold(s) as held, s:
        b = a + 1
        done = recorded(api, s)
        assert held.entered.wait(WAIT_S)
        assert not done.done
    assert synced(done)
    assert done.done
    np.testing.assert_array_equal(fetch(api, b, s), np.ones(4, np.float32))


def test_a_stream_runs_its_work_in_order(api: CudaApi) -> None:
    """Kernels and host callbacks of one stream run in the order they were enqueued."""
    s = api.stream(0)
    seen: list[int] = []
    with hold(s), s:
        x = api.xp.full((8,), 2.0, dtype=np.float32)
        s.launch_host_func(seen.append, 0)
        x *= 3
        s.launch_host_func(seen.append, 1)
        x += 1
        s.launch_host_func(seen.append, 2)
        x **= 2
        for i in range(3, 10):
            s.launch_host_func(seen.append, i)
    np.testing.assert_array_equal(fetch(api, x, s), np.full(8, 49.0, np.float32))
    assert seen == list(range(10))


def test_wait_event_orders_a_second_stream_after_the_first(api: CudaApi) -> None:
    """After ``s2.wait_event(e)``, s2's work runs after s1's work before ``e`` (result correct)."""
    s1, s2 = api.stream(0), api.stream(0)
    with s1:
        a = api.xp.full((1000,), 3.0, dtype=np.float32)
    with hold(s1) as held:
        with s1:
            a *= 2
        s2.wait_event(recorded(api, s1))
        with s2:
            b = a + 1
        done = recorded(api, s2)
        assert held.entered.wait(WAIT_S)
        assert not done.done
    assert synced(done)
    np.testing.assert_array_equal(fetch(api, b, s2), np.full(1000, 7.0, np.float32))


def test_wait_event_waits_for_the_record_made_before_the_call(api: CudaApi) -> None:
    """Re-recording the event after ``wait_event`` does not make the waiting stream wait longer."""
    s1, s2 = api.stream(0), api.stream(0)
    e = api.event()
    with hold(s1) as first:
        # s2 first waits for s1's first hold, so it reaches its wait on ``e`` only after the re-record
        s2.wait_event(recorded(api, s1))
        e.record(s1)
        s2.wait_event(e)
        with hold(s1) as second:
            e.record(s1)
            after_wait = recorded(api, s2)
            assert first.entered.wait(WAIT_S)
            assert not after_wait.done
            first.release()
            assert second.entered.wait(WAIT_S)
            assert synced(after_wait)  # s1 is still held, behind the second record
            assert not e.done
    assert synced(e)


def test_a_never_recorded_event_is_done_and_waiting_on_it_is_a_no_op(api: CudaApi) -> None:
    """``done`` is True, ``synchronize`` returns, and a stream waiting on it does not wait."""
    s1, s2 = api.stream(0), api.stream(0)
    never = api.event()
    assert never.done
    assert synced(never)
    with hold(s1) as held:
        busy = recorded(api, s1)
        s2.wait_event(never)
        after = recorded(api, s2)
        assert held.entered.wait(WAIT_S)
        assert synced(after)
        assert not busy.done


def test_event_synchronize_waits_for_the_record(api: CudaApi) -> None:
    """``Event.synchronize`` returns only once the work before the record ran."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((4,), dtype=np.float32)
    returned = threading.Event()
    when: list[bool] = []
    with hold(s) as held:
        with s:
            a += 5
        e = recorded(api, s)

        def wait() -> None:
            e.synchronize()
            when.append(held.gate.is_set())
            returned.set()

        threading.Thread(target=wait, name="conformance-sync", daemon=True).start()
        assert held.entered.wait(WAIT_S)
        assert not returned.wait(0.2)
    assert returned.wait(WAIT_S)
    assert when == [True]
    assert e.done
    np.testing.assert_array_equal(fetch(api, a, s), np.full(4, 5.0, np.float32))


def test_stream_synchronize_waits_for_the_streams_work(api: CudaApi) -> None:
    """``Stream.synchronize`` returns only once the stream's work before the call ran."""
    s = api.stream(0)
    with hold(s) as held:
        waiting = _synchronizing(s)
        assert held.entered.wait(WAIT_S)
        assert not waiting.wait(0.2)
    assert waiting.wait(WAIT_S)


def _synchronizing(stream: Any) -> threading.Event:
    """Set once ``stream.synchronize()``, called on a helper thread, returned."""
    returned = threading.Event()

    def wait() -> None:
        stream.synchronize()
        returned.set()

    threading.Thread(target=wait, name="conformance-sync", daemon=True).start()
    return returned


def test_record_without_a_stream_records_on_the_current_stream(api: CudaApi) -> None:
    """``event.record()`` inside ``with s:`` marks s's work so far."""
    s = api.stream(0)
    e = api.event()
    with hold(s) as held:
        with s:
            e.record()
        assert held.entered.wait(WAIT_S)
        assert not e.done
    assert synced(e)


# -- no host view; host reads ---------------------------------------------------------


def test_numpy_asarray_of_a_device_array_raises_type_error(api: CudaApi) -> None:
    """Device memory has no host view: ``numpy.asarray``/``numpy.array`` raise TypeError."""
    a = api.xp.ones((3,), dtype=np.float32)
    # NumPy 2 warns that CuPy's __array__ takes no ``copy`` before CuPy raises; the warning is not
    # what is checked here (and this suite turns warnings into errors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=NO_HOST_VIEW):
            np.asarray(a)
        with pytest.raises(TypeError, match=NO_HOST_VIEW):
            np.array(a)


def test_int_converts_a_0d_array_only(api: CudaApi) -> None:
    """``int()`` of a size-1 1-d array raises TypeError (CuPy 14.2 with NumPy 2); of a 0-d works."""
    a = api.xp.full((1,), 7, dtype=np.int64)
    with pytest.raises(TypeError, match="only 0-dimensional arrays can be converted to Python scalars"):
        int(a)
    assert int(a[0]) == 7
    assert int(a.reshape(())) == 7


def test_get_item_and_float_return_the_value(api: CudaApi) -> None:
    """``get()`` gives a NumPy array, ``item()`` and ``float()`` the Python value."""
    a = api.xp.arange(4, dtype=np.float32) * 2
    got = a.get()
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) * 2)
    assert a[1].item() == 2.0
    assert float(a[3]) == 6.0
    assert a.sum().item() == 12.0
    assert bool(a[1])


def test_host_reads_wait_for_the_current_stream(api: CudaApi) -> None:
    """``get()``, ``item()``, ``float()`` and ``asnumpy`` inside ``with s:`` see s's kernels."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((2,), dtype=np.float32)
        a += 5
        assert a.get().tolist() == [5.0, 5.0]
        a *= 2
        assert a[0].item() == 10.0
        a -= 1
        assert float(a[1]) == 9.0
        a += 1
        assert api.xp.asnumpy(a).tolist() == [10.0, 10.0]
    assert a.get(stream=s).tolist() == [10.0, 10.0]


# -- copies through pinned memory -------------------------------------------------------


def test_h2d_and_d2h_through_pinned_memory_round_trip(api: CudaApi) -> None:
    """``h2d`` from pinned memory, a kernel, ``d2h`` to pinned memory: the data after the event."""
    s = api.stream(0)
    src = api.empty_pinned((256,), np.float32)
    assert isinstance(src, np.ndarray)
    src[:] = np.arange(256, dtype=np.float32)
    with s:
        dev = api.empty((256,), np.float32)
    api.h2d(dev, src, s)
    with s:
        doubled = dev * 2
    dst = api.empty_pinned((256,), np.float32)
    dst[:] = -1
    api.d2h(doubled, dst, s)
    assert synced(recorded(api, s))
    np.testing.assert_array_equal(dst, np.arange(256, dtype=np.float32) * 2)


def test_d2h_fills_its_target_only_when_the_copy_runs(api: CudaApi) -> None:
    """Behind a held stream, ``d2h`` returns and its pinned target does not hold the data yet."""
    s = api.stream(0)
    with s:
        a = api.xp.full((64,), 3.0, dtype=np.float32)
    dst = api.empty_pinned((64,), np.float32)
    dst[:] = -1
    with hold(s) as held:
        api.d2h(a, dst, s)
        done = recorded(api, s)
        assert held.entered.wait(WAIT_S)
        assert not (dst == 3.0).any()
    assert synced(done)
    np.testing.assert_array_equal(dst, np.full(64, 3.0, np.float32))


def test_d2h_to_pageable_memory_waits_for_the_copy(api: CudaApi) -> None:
    """Into a pageable (non-pinned) target the copy is synchronous: it returns with the data."""
    s = api.stream(0)
    with s:
        a = api.xp.full((64,), 3.0, dtype=np.float32)
    dst = np.full(64, -1.0, dtype=np.float32)
    returned = threading.Event()

    def copy() -> None:
        api.d2h(a, dst, s)
        returned.set()

    with hold(s) as held:
        threading.Thread(target=copy, name="conformance-d2h", daemon=True).start()
        assert held.entered.wait(WAIT_S)
        assert not returned.wait(0.2)
    assert returned.wait(WAIT_S)
    np.testing.assert_array_equal(dst, np.full(64, 3.0, np.float32))


# -- host callbacks -----------------------------------------------------------------


def test_a_host_callback_runs_off_the_calling_thread(api: CudaApi) -> None:
    """The callback runs on another (driver) thread, with its argument."""
    s = api.stream(0)
    seen: list[tuple[int, object]] = []
    s.launch_host_func(lambda arg: seen.append((threading.get_ident(), arg)), 42)
    assert synced(recorded(api, s))
    [(ident, arg)] = seen
    assert ident != threading.get_ident()
    assert arg == 42


def test_a_host_callback_blocks_only_its_own_stream(api: CudaApi) -> None:
    """While a callback blocks s1, s1's later work waits and s2's work completes."""
    s1, s2 = api.stream(0), api.stream(0)
    with s2:
        b = api.xp.zeros((16,), dtype=np.float32)
    with hold(s1) as held:
        after_callback = recorded(api, s1)
        with s2:
            b += 4
        other = recorded(api, s2)
        assert held.entered.wait(WAIT_S)
        assert synced(other)
        assert not after_callback.done
    assert synced(after_callback)
    np.testing.assert_array_equal(fetch(api, b, s2), np.full(16, 4.0, np.float32))


#: CUDA calls a host callback may not make (each raised 800 in a callback on the H100)
CALLS_IN_CALLBACK: dict[str, Callable[[CudaApi, Any, Any], object]] = {
    "new event": lambda api, other, x: api.event(),
    "record on another stream": lambda api, other, x: api.event().record(other),
    "kernel on another stream": lambda api, other, x: _add_one_on(other, x),
    "synchronize another stream": lambda api, other, x: other.synchronize(),
}


def _add_one_on(stream: Any, x: Any) -> None:
    with stream:
        x += 1


@pytest.mark.parametrize("call", list(CALLS_IN_CALLBACK))
def test_a_cuda_call_in_a_host_callback_raises_status_800(api: CudaApi, call: str) -> None:
    """No CUDA call may be made in a callback: it raises ``CUDARuntimeError`` 800 at once."""
    s, other = api.stream(0), api.stream(0)
    with other:
        x = api.xp.zeros((4,), dtype=np.float32)
    assert synced(recorded(api, other))
    caught: list[BaseException] = []

    def call_cuda(_: object) -> None:
        try:
            CALLS_IN_CALLBACK[call](api, other, x)
        except BaseException as exc:
            caught.append(exc)

    s.launch_host_func(call_cuda, 0)
    assert synced(recorded(api, s))
    [error] = caught
    assert isinstance(error, api.CUDARuntimeError)
    assert isinstance(error, RuntimeError)
    assert getattr(error, "status", None) == 800
    assert str(error).startswith("cudaErrorNotPermitted: ")
    assert fetch(api, x, other).tolist() == [0.0] * 4  # the process goes on; nothing ran


def test_dropping_a_device_array_in_a_host_callback_is_allowed(api: CudaApi) -> None:
    """The last reference to a device array may go in a callback: its block goes back to the pool."""
    s = api.stream(0)
    gc.collect()
    base = api.pool_used(0)
    with s:
        kept = {"array": api.xp.ones((MiB,), dtype=np.float32)}
    assert synced(recorded(api, s))
    assert api.pool_used(0) == base + 4 * MiB
    caught: list[BaseException] = []

    def drop(_: object) -> None:
        try:
            del kept["array"]
        except BaseException as exc:
            caught.append(exc)

    s.launch_host_func(drop, 0)
    assert synced(recorded(api, s))
    assert caught == []
    assert kept == {}
    assert api.pool_used(0) == base


def test_a_host_callback_exception_is_lost_and_the_stream_goes_on(api: CudaApi) -> None:
    """An exception raised in a callback reaches nobody; the stream's later work runs."""
    s = api.stream(0)

    def fail(_: object) -> None:
        raise ValueError("lost")

    with s:
        a = api.xp.zeros((4,), dtype=np.float32)
        s.launch_host_func(fail, 0)
        a += 1
    assert synced(recorded(api, s))
    np.testing.assert_array_equal(fetch(api, a, s), np.ones(4, np.float32))


# -- the memory pool -----------------------------------------------------------------


def test_allocating_over_the_pool_limit_raises_out_of_memory(api: CudaApi) -> None:
    """Over the limit: ``OutOfMemoryError``, a ``MemoryError``, "Out of memory allocating ..."."""
    gc.collect()  # no garbage array freed behind the test's back
    limit = api.pool_used(0) + 64 * MiB
    api.set_pool_limit(0, limit)
    with pytest.raises(api.OutOfMemoryError, match=r"^Out of memory allocating ") as info:
        api.empty((128 * MiB,), np.uint8)
    assert isinstance(info.value, MemoryError)
    assert re.fullmatch(
        rf"Out of memory allocating 134,217,728 bytes \(allocated so far: [\d,]+ bytes, "
        rf"limit set to: {limit:,} bytes\)\.",
        str(info.value),
    )


def test_cached_blocks_are_freed_and_the_allocation_retried_under_the_limit(api: CudaApi) -> None:
    """A freed block stays cached; an allocation it would push over the limit frees it and succeeds."""
    gc.collect()  # CuPy's retry collects garbage: none may be left to change pool_used
    base = api.pool_used(0)
    api.set_pool_limit(0, base + 64 * MiB)
    first = api.empty((40 * MiB,), np.uint8)
    assert api.pool_used(0) == base + 40 * MiB
    del first
    assert api.pool_used(0) == base
    second = api.empty((48 * MiB,), np.uint8)
    assert second.nbytes == 48 * MiB
    assert api.pool_used(0) == base + 48 * MiB
    api.free_cached(0)  # live arrays are not cached blocks
    assert api.pool_used(0) == base + 48 * MiB


def test_a_freed_block_is_reused_at_once_on_its_own_streams_arena_only(api: CudaApi) -> None:
    """One arena per stream: a freed block goes to the stream it was allocated on; an allocation of
    its size on another stream does not get it, the next one on that stream does."""
    s1, s2 = api.stream(0), api.stream(0)
    with s1:
        freed = api.xp.empty((4 * MiB,), dtype=np.uint8)
    address = freed.data.ptr
    del freed
    with s2:
        elsewhere = api.xp.empty((4 * MiB,), dtype=np.uint8)
    with s1:
        again = api.xp.empty((4 * MiB,), dtype=np.uint8)
    assert elsewhere.data.ptr != address
    assert again.data.ptr == address


# -- graph capture -------------------------------------------------------------------


def test_captured_work_runs_only_when_the_graph_is_launched(api: CudaApi) -> None:
    """Capture records ``a += 1`` without running it; each ``launch`` replays it once."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((1,), dtype=np.float32)
    assert synced(recorded(api, s))
    with s, api.capturing(s) as captured:
        a += 1
    [graph] = captured
    assert fetch(api, a, s)[0] == 0.0
    for _ in range(3):
        graph.launch(s)
    assert fetch(api, a, s)[0] == 3.0


def test_host_callbacks_of_a_graph_run_on_each_replay_only(api: CudaApi) -> None:
    """A callback captured in a graph does not run at capture, and runs once per ``launch``."""
    s = api.stream(0)
    calls: list[object] = []
    with s, api.capturing(s) as captured:
        s.launch_host_func(calls.append, 7)
    [graph] = captured
    assert synced(recorded(api, s))
    assert calls == []
    for _ in range(3):
        graph.launch(s)
    assert synced(recorded(api, s))
    assert calls == [7, 7, 7]


def test_reading_a_device_array_during_capture_raises_and_keeps_the_capture(api: CudaApi) -> None:
    """``get()``/``item()`` on the capturing stream raise CuPy's RuntimeError; the capture stays valid,
    and syncing another stream or its event, or querying the event, is allowed (relaxed mode)."""
    s, other = api.stream(0), api.stream(0)
    with s:
        a = api.xp.zeros((1,), dtype=np.float32)
    assert synced(recorded(api, s))
    other_done = recorded(api, other)
    with s, api.capturing(s) as captured:
        a += 1
        with pytest.raises(RuntimeError, match=D2H_IN_CAPTURE):
            a.get()
        with pytest.raises(RuntimeError, match=D2H_IN_CAPTURE):
            a.item()
        other.synchronize()
        other_done.synchronize()
        assert other_done.done
    [graph] = captured
    graph.launch(s)
    assert fetch(api, a, s)[0] == 1.0


def test_synchronizing_the_capturing_stream_raises_900_then_end_capture_901(api: CudaApi) -> None:
    """A sync of the capturing stream fails (900) and invalidates the capture (901); the stream
    works afterwards."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((1,), dtype=np.float32)
    assert synced(recorded(api, s))
    ended = False
    try:
        with s:
            s.begin_capture()
            a += 1
            with pytest.raises(api.CUDARuntimeError) as sync_error:
                s.synchronize()
            assert getattr(sync_error.value, "status", None) == 900
            assert str(sync_error.value).startswith("cudaErrorStreamCaptureUnsupported: ")
            ended = True
            with pytest.raises(api.CUDARuntimeError) as end_error:
                s.end_capture()
            assert getattr(end_error.value, "status", None) == 901
            assert str(end_error.value).startswith("cudaErrorStreamCaptureInvalidated: ")
    finally:
        if not ended:
            with contextlib.suppress(Exception):
                s.end_capture()
    with s:
        b = a + 2
    np.testing.assert_array_equal(fetch(api, b, s), np.full(1, 2.0, np.float32))


def test_matmul_during_capture_raises_not_implemented(api: CudaApi) -> None:
    """cuBLAS cannot be captured on CuPy 14.2 (even warmed up): ``@`` and ``matmul`` raise."""
    s = api.stream(0)
    with s:
        m = api.xp.ones((8, 8), dtype=np.float32)
        (m @ m).sum()  # warm-up: it does not help
    assert synced(recorded(api, s))
    with s:
        s.begin_capture()
        try:
            with pytest.raises(NotImplementedError, match=CUBLAS_IN_CAPTURE):
                m @ m
            with pytest.raises(NotImplementedError, match=CUBLAS_IN_CAPTURE):
                api.xp.matmul(m, m)
        finally:
            s.end_capture()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_captured_gemm_gives_matmuls_bits_in_each_layout(api: CudaApi, dtype: Any) -> None:
    """``capture_gemm``: cuBLAS through its C API on a handle of its own (its products are CuPy matmul's
    bits, or it is not offered at all); each operand C- or F-contiguous."""
    gemm = api.capture_gemm(0)
    if isinstance(gemm, str):
        pytest.skip(gemm)
    s = api.stream(0)
    rng = np.random.default_rng(1)
    a_host, b_host = rng.standard_normal((7, 33)).astype(dtype), rng.standard_normal((33, 5)).astype(dtype)
    with s:
        a, b = api.xp.asarray(a_host), api.xp.asarray(b_host)
        for x, y in ((a, b), (a.T.copy().T, b), (a, b.T.copy().T)):
            ours, theirs = gemm(x, y, s), api.xp.matmul(x, y)
            got, want = fetch(api, ours, s), fetch(api, theirs, s)
            assert got.dtype == dtype and got.shape == (7, 5)
            assert got.tobytes() == want.tobytes()
            np.testing.assert_allclose(got, a_host @ b_host, rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_the_captured_gemm_is_held_by_a_capture_and_computes_at_each_launch(api: CudaApi) -> None:
    """Called while the stream captures (its handle made before), the product is a node of the graph: it
    runs at each launch, on the operands' values then."""
    gemm = api.capture_gemm(0)
    if isinstance(gemm, str):
        pytest.skip(gemm)
    s = api.stream(0)
    with s:
        a = api.xp.ones((4, 8), dtype=np.float32)
        b = api.xp.ones((8, 3), dtype=np.float32)
        gemm(a, b, s)  # (its handle for this stream: made outside the capture)
    assert synced(recorded(api, s))
    with s, api.capturing(s) as captured:
        c = gemm(a, b, s)
    [graph] = captured
    graph.launch(s)
    assert (fetch(api, c, s) == 8.0).all()
    with s:
        a += 1  # the next launch reads the new values
    graph.launch(s)
    assert (fetch(api, c, s) == 16.0).all()


def test_a_new_allocation_during_capture_keeps_the_capture_valid(api: CudaApi) -> None:
    """Allocating a new block while capturing is allowed; the graph then replays."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((1,), dtype=np.float32)
    assert synced(recorded(api, s))
    with s, api.capturing(s) as captured:
        fresh = api.xp.empty((64 * MiB,), dtype=np.uint8)
        a += 1
    assert fresh.nbytes == 64 * MiB
    [graph] = captured
    graph.launch(s)
    assert fetch(api, a, s)[0] == 1.0


def test_a_capture_allocating_from_a_graph_pool_takes_nothing_from_the_devices_pool(api: CudaApi) -> None:
    """``allocating_from(graph_pool(0))`` sends this thread's allocations to a pool of their own (CuPy:
    ``using_allocator(MemoryPool().malloc)``): the device's pool does not grow, the graph replays, and
    a block the capture freed is not handed out by the device's pool."""
    s = api.stream(0)
    with s:
        a = api.xp.zeros((MiB,), dtype=np.float32)
    assert synced(recorded(api, s))
    before = api.pool_used(0)
    pool = api.graph_pool(0)
    with api.allocating_from(pool), s, api.capturing(s) as captured:
        tmp = a + 1
        address = tmp.data.ptr
        a += tmp
    [graph] = captured
    assert api.pool_used(0) == before
    del tmp
    with s:
        other = api.xp.empty((MiB,), dtype=np.float32)
    assert other.data.ptr != address
    graph.launch(s)
    graph.launch(s)
    assert fetch(api, a, s)[0] == 3.0  # 0 -> 1 -> 3: tmp is a + 1 at each replay


# -- the array module ----------------------------------------------------------------

#: (name, fn(xp, a, b)): run with NumPy on host arrays and with the binding's xp on device arrays
Case = tuple[str, Callable[[Any, Any, Any], Any]]
ARRAY_CASES: list[Case] = [
    ("add", lambda xp, a, b: xp.add(a, b)),
    ("subtract", lambda xp, a, b: xp.subtract(a, b)),
    ("multiply", lambda xp, a, b: xp.multiply(a, b)),
    ("divide", lambda xp, a, b: xp.divide(a, b)),
    ("power", lambda xp, a, b: xp.power(a, 2)),
    ("maximum", lambda xp, a, b: xp.maximum(a, b)),
    ("exp", lambda xp, a, b: xp.exp(b)),
    ("log", lambda xp, a, b: xp.log(a)),
    ("sqrt", lambda xp, a, b: xp.sqrt(a)),
    ("sin", lambda xp, a, b: xp.sin(a)),
    ("negative", lambda xp, a, b: xp.negative(b)),
    ("absolute", lambda xp, a, b: xp.abs(b)),
    ("greater", lambda xp, a, b: xp.greater(a, b)),
    ("operators", lambda xp, a, b: (a + b * 2 - 1) / (a + 1)),
    ("compare_ops", lambda xp, a, b: (a >= b) & (b < 2)),
    ("scalar_first", lambda xp, a, b: 3.0 - a),
    ("matmul", lambda xp, a, b: xp.matmul(a, b.T)),
    ("matmul_op", lambda xp, a, b: a.T @ b),
    ("dot", lambda xp, a, b: xp.dot(a, b.T)),
    ("sum", lambda xp, a, b: xp.sum(a)),
    ("sum_axis", lambda xp, a, b: xp.sum(a, axis=0)),
    ("mean", lambda xp, a, b: xp.mean(a, axis=1)),
    ("prod", lambda xp, a, b: xp.prod(b, axis=0)),
    ("max", lambda xp, a, b: xp.max(b)),
    ("min_method", lambda xp, a, b: b.min(axis=1)),
    ("argmax", lambda xp, a, b: xp.argmax(b)),
    ("argmin_axis", lambda xp, a, b: xp.argmin(b, axis=0)),
    ("any", lambda xp, a, b: xp.any(b > 1)),
    ("all_axis", lambda xp, a, b: xp.all(a > 2, axis=1)),
    ("reshape", lambda xp, a, b: xp.reshape(a, (4, 3))),
    ("reshape_method", lambda xp, a, b: a.reshape(2, -1)),
    ("transpose", lambda xp, a, b: xp.transpose(a)),
    ("T", lambda xp, a, b: b.T),
    ("ravel", lambda xp, a, b: a.T.ravel()),
    ("concatenate", lambda xp, a, b: xp.concatenate([a, b])),
    ("concatenate_axis1", lambda xp, a, b: xp.concatenate([a, b], axis=1)),
    ("stack", lambda xp, a, b: xp.stack([a, b])),
    ("where", lambda xp, a, b: xp.where(a > b, a, b)),
    ("clip", lambda xp, a, b: xp.clip(b, -1, 1)),
    ("astype", lambda xp, a, b: a.astype(np.int32)),
    ("getitem", lambda xp, a, b: a[1:, ::2]),
    ("fancy_index", lambda xp, a, b: a[[0, 2]]),
    ("boolean_mask", lambda xp, a, b: a[a > 5]),
    ("setitem_row", lambda xp, a, b: _assigned(a.copy(), (1,), 5.0)),
    ("setitem_column", lambda xp, a, b: _assigned(a.copy(), (slice(None), 0), b[:, 1])),
    ("inplace", lambda xp, a, b: _added_in_place(a.copy(), b)),
    ("linspace", lambda xp, a, b: xp.linspace(0.0, 1.0, 5)),
    ("zeros", lambda xp, a, b: xp.zeros((2, 3), dtype=np.float32)),
    ("ones", lambda xp, a, b: xp.ones((5,), dtype=np.int64)),
    ("full", lambda xp, a, b: xp.full((2, 2), 7.5)),
    ("arange", lambda xp, a, b: xp.arange(10)),
    ("arange_step", lambda xp, a, b: xp.arange(1.0, 4.0, 0.5, dtype=np.float32)),
    ("zeros_like", lambda xp, a, b: xp.zeros_like(a)),
    ("ones_like", lambda xp, a, b: xp.ones_like(b)),
    ("full_like", lambda xp, a, b: xp.full_like(a, 2.5)),
    ("empty_shape", lambda xp, a, b: xp.empty((3, 2), dtype=np.float32).shape),
]


def _assigned(target: Any, index: Any, value: Any) -> Any:
    target[index] = value
    return target


def _added_in_place(target: Any, other: Any) -> Any:
    target += other
    target *= 2
    return target


def _inputs() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    return a, b


@pytest.mark.parametrize("case", ARRAY_CASES, ids=[name for name, _ in ARRAY_CASES])
def test_the_array_module_gives_numpys_results(api: CudaApi, case: Case) -> None:
    """Each operation on device arrays gives NumPy's values, shape and dtype."""
    _, fn = case
    a, b = _inputs()
    expected = fn(np, a, b)
    got = fn(api.xp, api.xp.asarray(a), api.xp.asarray(b))
    if isinstance(expected, tuple):
        assert got == expected
        return
    assert type(got) is api.ndarray
    host = api.xp.asnumpy(got)
    assert host.shape == np.shape(expected)
    assert host.dtype == np.asarray(expected).dtype
    if host.dtype.kind == "f":
        np.testing.assert_allclose(host, expected, rtol=1e-5)
    else:
        np.testing.assert_array_equal(host, expected)


def test_numpy_functions_on_device_arrays_return_device_arrays(api: CudaApi) -> None:
    """``np.add`` and ``np.sum`` dispatch to the array module: device arrays come back."""
    a, b = _inputs()
    da, db = api.xp.asarray(a), api.xp.asarray(b)
    added = np.add(da, db)
    total = np.sum(da)
    assert type(added) is api.ndarray
    assert type(total) is api.ndarray
    np.testing.assert_allclose(api.xp.asnumpy(added), a + b)
    assert float(total) == float(a.sum())


def test_mixing_a_numpy_array_with_a_device_array_raises_type_error(api: CudaApi) -> None:
    """No implicit host-to-device copy in an operation: CuPy raises TypeError ("Unsupported type";
    from CuPy's source and documentation, not from the H100 run)."""
    a, _ = _inputs()
    da = api.xp.asarray(a)
    with pytest.raises(TypeError):
        da + a
    with pytest.raises(TypeError):
        np.add(a, da)


def test_views_share_the_buffer_key_of_their_base(api: CudaApi) -> None:
    """Every view of an allocation has its ``buffer_key``; a copy has another."""
    a = api.xp.arange(12, dtype=np.float32).reshape(3, 4)
    key = api.buffer_key(a)
    assert key[1] == 48
    for view in (a[1], a[:, 1:3], a.T, a.reshape(4, 3), a[1][2:], a.ravel()):
        assert api.buffer_key(view) == key
    assert api.buffer_key(a.copy()) != key
    copied = api.copy(a)
    assert api.buffer_key(copied) != key
    assert api.xp.asnumpy(copied).tolist() == api.xp.asnumpy(a).tolist()


# -- devices ------------------------------------------------------------------------


def test_the_binding_describes_its_devices(api: CudaApi) -> None:
    """A name, a version, at least one device with a name and memory, and device arrays on it."""
    assert api.name in {"simulator", "cupy"}
    assert isinstance(api.version(), str) and api.version()
    assert api.device_count() >= 1
    assert isinstance(api.device_name(0), str) and api.device_name(0)
    assert api.device_memory(0) > 0
    assert api.device_of(api.xp.zeros((2,), dtype=np.float32)) == 0
    s = api.stream(0)
    elsewhere: list[bool] = []
    with s:
        assert api.current_stream() == s
        seen = threading.Thread(target=lambda: elsewhere.append(api.current_stream() == s))
        seen.start()
        seen.join(WAIT_S)
    assert elsewhere == [False]  # the current stream is per host thread
    assert api.current_stream() != s
