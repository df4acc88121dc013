"""The simulator's semantics: asynchronous streams, events, strict arrays, the race detector, the pool,
host callbacks, faults and graph capture (each wait bounded; no sleep is used to synchronise)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from schedsvc.devices.cudasim import (
    CUDARuntimeError,
    HostSyncError,
    OutOfMemoryError,
    RaceError,
    SimApi,
    Simulator,
    ndarray,
)

from .conftest import Gate

GateMaker = Callable[[], Gate]


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a new thread; return its result or raise its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as exc:
            out.append(("err", exc))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert out, "thread did not finish"
    kind, value = out[0]
    if kind == "err":
        raise value
    return value


# -- streams and asynchrony -------------------------------------------------------------


def test_enqueue_returns_before_the_kernel_runs(cuda: SimApi, gate: GateMaker) -> None:
    xp, s, g = cuda.xp, cuda.stream(0), gate()
    with s:
        x = xp.zeros(4)
        g.hold(s)
        x += 1
        e = cuda.event()
        e.record(s)
    assert g.reached.wait(10)
    assert not e.done
    g.open()
    e.synchronize()
    assert e.done
    with s:
        assert x.get().tolist() == [1.0] * 4


def test_kernel_output_exists_at_once_with_shape_and_dtype(cuda: SimApi, gate: GateMaker) -> None:
    xp, s, g = cuda.xp, cuda.stream(0), gate()
    with s:
        a = xp.ones((3, 4), dtype=xp.float32)
        g.hold(s)
        b = (a @ a.T).sum(axis=0, keepdims=True)
        c = xp.concatenate([a, a], axis=1).astype(xp.int64)
    assert b.shape == (1, 3) and b.dtype == np.float32
    assert c.shape == (3, 8) and c.dtype == np.int64
    assert isinstance(b, ndarray)
    g.open()
    with s:
        assert b.get().tolist() == [[12.0, 12.0, 12.0]]


def test_current_stream_is_per_thread(cuda: SimApi) -> None:
    s = cuda.stream(0)
    main_null = cuda.current_stream()
    with s:
        assert cuda.current_stream() is s
        other = in_thread(cuda.current_stream)
        assert other is not s and other is not main_null
        assert other.null
    assert cuda.current_stream() is main_null


def test_current_device_is_per_thread(cuda: SimApi) -> None:
    cuda.use_device(1)
    assert cuda.xp.zeros(2).device.id == 1
    assert in_thread(lambda: cuda.xp.zeros(2).device.id) == 0
    with pytest.raises(CUDARuntimeError) as info:
        cuda.use_device(7)
    assert info.value.status == 101


def test_arrays_of_another_device_raise_value_error(cuda: SimApi) -> None:
    xp = cuda.xp
    a = xp.ones(3)
    cuda.use_device(1)
    with pytest.raises(ValueError, match=r"resides \(0\) is different from the current device \(1\)"):
        a + 1
    cuda.use_device(0)
    cuda.current_stream().synchronize()  # the peer copy's source must be complete
    cuda.use_device(1)
    b = xp.array(a)  # a peer copy onto device 1, on its current stream
    assert b.device.id == 1
    assert b.get().tolist() == [1.0, 1.0, 1.0]


# -- events ------------------------------------------------------------------------------


def test_never_recorded_event_is_done(cuda: SimApi) -> None:
    e = cuda.event()
    assert e.done
    e.synchronize()


def test_wait_event_snapshots_the_current_record(cuda: SimApi, gate: GateMaker) -> None:
    a, b = cuda.stream(0), cuda.stream(0)
    g1, g2 = gate(), gate()
    e, f = cuda.event(), cuda.event()
    g1.hold(a)
    e.record(a)
    b.wait_event(e)
    f.record(b)
    g2.hold(a)
    e.record(a)  # a later record: b must not wait for it
    assert not f.done
    g1.open()
    f.synchronize()  # returns although a is held at g2
    assert f.done and not e.done
    g2.open()
    e.synchronize()
    assert e.done


def test_event_record_defaults_to_the_current_stream(cuda: SimApi, gate: GateMaker) -> None:
    s, g, e = cuda.stream(0), gate(), cuda.event()
    g.hold(s)
    with s:
        e.record()
    assert not e.done
    g.open()
    e.synchronize()
    assert e.done


# -- no host view and host syncs -------------------------------------------------------------


def test_no_host_view(cuda: SimApi) -> None:
    a = cuda.xp.arange(4)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    with pytest.raises(TypeError):
        np.array(a)
    with pytest.raises(TypeError):
        a + np.ones(4)
    with pytest.raises(TypeError):
        np.ones(4) + a


def test_numpy_functions_dispatch_to_the_simulator(cuda: SimApi) -> None:
    a = cuda.xp.arange(6, dtype=cuda.xp.float64).reshape(2, 3)
    total = np.sum(a)
    assert isinstance(total, ndarray) and float(total) == 15.0
    assert isinstance(np.add(a, 1), ndarray)
    assert np.matmul(a, a.T).get().tolist() == [[5.0, 14.0], [14.0, 50.0]]


def test_scalar_conversions(cuda: SimApi) -> None:
    xp = cuda.xp
    with pytest.raises(TypeError, match="only 0-dimensional arrays can be converted to Python scalars"):
        int(xp.ones(1))
    assert int(xp.ones(1)[0]) == 1
    assert float(xp.full((), 2.5)) == 2.5
    assert bool(xp.ones(1))
    assert xp.arange(3)[1].item() == 1
    assert repr(xp.arange(3)) == "array([0, 1, 2])"
    assert xp.arange(3).tolist() == [0, 1, 2]


def test_host_syncs_are_counted_by_thread(cuda: SimApi, sim: Simulator) -> None:
    a = cuda.xp.ones(3)
    sim.reset_counters()
    a.get()
    a[0].item()
    float(a[1])
    repr(a)
    cuda.current_stream().synchronize()
    assert sim.host_syncs() == {"MainThread": 5}
    in_thread(lambda: a.sum().item())
    assert sum(sim.host_syncs().values()) == 6


def test_forbid_host_sync(cuda: SimApi, sim: Simulator) -> None:
    a = cuda.xp.ones(3)
    cuda.current_stream().synchronize()
    sim.reset_counters()
    with sim.forbid_host_sync():
        with pytest.raises(HostSyncError):
            a.get()
        in_thread(lambda: a.sum().item())  # another thread, not a launcher: allowed

        def launcher() -> None:
            cuda.launching_thread()
            with pytest.raises(HostSyncError):
                cuda.current_stream().synchronize()

        in_thread(launcher)
    assert sim.launcher_syncs() == 1
    assert sum(sim.host_syncs().values()) == 3
    a.get()  # allowed again


# -- the race detector ---------------------------------------------------------------------------


def test_missing_wait_event_is_a_race_naming_both_sites(cuda: SimApi, sim: Simulator) -> None:
    xp, a, b = cuda.xp, cuda.stream(0), cuda.stream(0)
    with a:
        x = xp.ones(8)
    with b, pytest.raises(RaceError) as info:
        x * 2
    message = str(info.value)
    assert message.count("test_sim.py:") == 2
    assert "in test_missing_wait_event_is_a_race_naming_both_sites" in message
    assert sim.races == [info.value]


def test_wait_event_orders_the_reader(cuda: SimApi, sim: Simulator) -> None:
    xp, a, b, e = cuda.xp, cuda.stream(0), cuda.stream(0), cuda.event()
    with a:
        x = xp.ones(8)
    e.record(a)
    b.wait_event(e)
    with b:
        y = x * 2
        assert y.get().tolist() == [2.0] * 8
    assert sim.races == []


def test_write_after_unordered_read_is_a_race(cuda: SimApi) -> None:
    xp, a, b, e = cuda.xp, cuda.stream(0), cuda.stream(0), cuda.event()
    with a:
        x = xp.ones(8)
    e.record(a)
    b.wait_event(e)
    with b:
        x * 2
    with a, pytest.raises(RaceError):
        x += 1


def test_host_sync_orders_later_work(cuda: SimApi, sim: Simulator) -> None:
    xp, a, b = cuda.xp, cuda.stream(0), cuda.stream(0)
    with a:
        x = xp.ones(8)
    a.synchronize()
    with b:
        x += 1
    assert sim.races == []


def test_block_reuse_across_streams_is_a_race(cuda: SimApi, sim: Simulator) -> None:
    xp, a, b, e = cuda.xp, cuda.stream(0), cuda.stream(0), cuda.event()
    with a:
        x = xp.ones(1024)
        ptr = x.data.ptr
    e.record(a)
    b.wait_event(e)
    with b:
        y = x * 2
    del x
    gc.collect()
    with a, pytest.raises(RaceError, match="pool reuse"):
        xp.empty(1024)
    # ordered: a waits for b's read first; the block is reused, at the same address
    f = cuda.event()
    f.record(b)
    a.wait_event(f)
    with a:
        z = xp.empty(1024)
    assert z.data.ptr == ptr
    assert len(sim.races) == 1
    del y


def test_views_share_a_block(cuda: SimApi) -> None:
    xp, a, b = cuda.xp, cuda.stream(0), cuda.stream(0)
    with a:
        x = xp.zeros((4, 4))
    v = x[1:3, ::2]
    assert v.base is x and cuda.buffer_key(v) == cuda.buffer_key(x)
    assert v.data.ptr == x.data.ptr + 4 * 8
    with b, pytest.raises(RaceError):
        v + 1


# -- copies -------------------------------------------------------------------------------------


def test_d2h_poisons_its_target_until_it_runs(cuda: SimApi, gate: GateMaker, sim: Simulator) -> None:
    s, g = cuda.stream(0), gate()
    with s:
        x = cuda.xp.arange(4, dtype=cuda.xp.float32)
    out = cuda.empty_pinned((4,), np.float32)
    assert type(out) is np.ndarray
    g.hold(s)
    sim.reset_counters()
    cuda.d2h(x, out, s)
    assert np.isnan(out).all()
    assert sim.host_syncs() == {}
    g.open()
    s.synchronize()
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    ints = cuda.empty_pinned((2,), np.int32)
    g2 = gate()
    g2.hold(s)
    with s:
        cuda.xp.zeros(2, dtype=np.int32).get(out=ints, blocking=False, stream=s)
    assert ints.tolist() == [np.iinfo(np.int32).max] * 2
    g2.open()


def test_h2d_from_pinned_is_asynchronous_and_checked(cuda: SimApi, gate: GateMaker, sim: Simulator) -> None:
    s, g = cuda.stream(0), gate()
    with s:
        x = cuda.xp.zeros(4)
    src = cuda.empty_pinned((4,), np.float64)
    src[:] = 1.0
    g.hold(s)
    sim.reset_counters()
    cuda.h2d(x, src, s)
    assert sim.host_syncs() == {}
    src[0] = 5.0  # written before the copy ran
    g.open()
    with pytest.raises(CUDARuntimeError) as info:
        s.synchronize()
    assert info.value.status == 719
    assert len(sim.faults) == 1 and "changed before the copy ran" in sim.faults[0]


def test_h2d_from_pageable_is_a_host_sync(cuda: SimApi, sim: Simulator) -> None:
    x = cuda.xp.zeros(3)
    sim.reset_counters()
    x.set(np.arange(3.0))
    assert sim.host_syncs() == {"MainThread": 1}
    assert x.tolist() == [0.0, 1.0, 2.0]


# -- the memory pool ----------------------------------------------------------------------------


def test_pool_limit_and_out_of_memory_message(cuda: SimApi) -> None:
    xp = cuda.xp
    small = xp.empty(1, dtype=xp.uint8)
    assert cuda.pool_used(0) == 512
    cuda.set_pool_limit(0, 512 + (64 << 20))
    with pytest.raises(OutOfMemoryError) as info:
        xp.empty(128 << 20, dtype=xp.uint8)
    assert str(info.value) == (
        "Out of memory allocating 134,217,728 bytes (allocated so far: 512 bytes, limit set to: 67,109,376 bytes)."
    )
    assert isinstance(info.value, MemoryError)
    del small


def test_pool_frees_cached_blocks_and_retries(cuda: SimApi, sim: Simulator) -> None:
    xp = cuda.xp
    cuda.set_pool_limit(0, 64 << 20)
    x = xp.empty(40 << 20, dtype=xp.uint8)
    del x
    gc.collect()
    assert cuda.pool_used(0) == 0
    sim.reset_counters()
    y = xp.empty(48 << 20, dtype=xp.uint8)
    assert cuda.pool_used(0) == 48 << 20
    assert sim.host_syncs() == {"MainThread": 1}
    del y


def test_freed_block_is_reused_on_its_arena_only(cuda: SimApi) -> None:
    xp, a, b = cuda.xp, cuda.stream(0), cuda.stream(0)
    with a:
        x = xp.empty(1000)
    ptr = x.data.ptr
    del x
    with b:
        assert xp.empty(1000).data.ptr != ptr
    with a:
        assert xp.empty(1000).data.ptr == ptr


def test_injected_failures(cuda: SimApi, sim: Simulator) -> None:
    xp = cuda.xp
    sim.fail_launches(1)
    with pytest.raises(CUDARuntimeError) as info:
        xp.ones(2)
    assert info.value.status == 719
    assert "cudaErrorLaunchFailure" in str(info.value)
    assert xp.ones(2).sum().item() == 2.0
    sim.fail_allocations(1, after=1)
    xp.empty(1)
    with pytest.raises(OutOfMemoryError):
        xp.empty(1)
    xp.empty(1)


# -- host callbacks ---------------------------------------------------------------------------------


def test_cuda_calls_in_a_host_callback_raise_800(cuda: SimApi) -> None:
    s = cuda.stream(0)
    seen: list[Any] = []

    def callback(_: object) -> None:
        seen.append(threading.current_thread().name)
        for call in (cuda.event, lambda: cuda.stream(0), lambda: cuda.use_device(0), s.synchronize):
            try:
                call()
            except CUDARuntimeError as exc:
                seen.append(exc.status)

    s.launch_host_func(callback, None)
    s.synchronize()
    assert seen == ["cuda-driver", 800, 800, 800, 800]


def test_host_callback_exception_is_lost(cuda: SimApi, capsys: pytest.CaptureFixture[str]) -> None:
    s = cuda.stream(0)

    def boom(_: object) -> None:
        raise ValueError("lost")

    s.launch_host_func(boom, None)
    e = cuda.event()
    e.record(s)
    e.synchronize()
    assert e.done
    assert capsys.readouterr().err == "Exception ignored in: 'cupy_backends.cuda.api.runtime._HostFnFunc'\n"


# -- faults -------------------------------------------------------------------------------------------


def test_a_fault_is_sticky_until_reset(cuda: SimApi, sim: Simulator) -> None:
    xp, s = cuda.xp, cuda.stream(0)
    never = cuda.event()
    with s:
        x = xp.arange(3)
        x[xp.asarray([10])]  # out of bounds: fails on the stream
    e = cuda.event()
    e.record(s)
    with pytest.raises(CUDARuntimeError) as info:
        e.synchronize()
    assert info.value.status == 719
    assert not e.done and not never.done
    for call in (s.synchronize, cuda.event, lambda: xp.ones(1)):
        with pytest.raises(CUDARuntimeError):
            call()
    assert len(sim.faults) == 1
    sim.reset()
    assert never.done and sim.faults == []
    assert xp.ones(2).sum().item() == 2.0


# -- capture -------------------------------------------------------------------------------------------


def test_capture_records_and_replays(cuda: SimApi) -> None:
    xp, s = cuda.xp, cuda.stream(0)
    with s:
        a = xp.zeros(2)
    s.synchronize()
    calls: list[int] = []
    with cuda.capturing(s) as graph:
        with s:
            a += 1
            tmp = xp.ones(2)
            a += tmp
        s.launch_host_func(calls.append, 1)
    s.synchronize()
    assert calls == []
    with s:
        assert a.tolist() == [0.0, 0.0]
    for _ in range(3):
        graph[0].launch(s)
    s.synchronize()
    assert calls == [1, 1, 1]
    with s:
        assert a.tolist() == [6.0, 6.0]


def test_sync_during_capture_invalidates_it(cuda: SimApi) -> None:
    s = cuda.stream(0)
    s.begin_capture()
    with pytest.raises(CUDARuntimeError) as info:
        s.synchronize()
    assert info.value.status == 900
    with pytest.raises(CUDARuntimeError) as info:
        s.end_capture()
    assert info.value.status == 901
    s.synchronize()  # the stream works again


def test_d2h_and_cublas_during_capture(cuda: SimApi) -> None:
    xp, s = cuda.xp, cuda.stream(0)
    with s:
        a = xp.ones((2, 2))
    s.begin_capture()
    with s:
        with pytest.raises(
            RuntimeError, match="the current stream is capturing, so D2H transfers are disallowed"
        ):
            a.get()
        with pytest.raises(NotImplementedError, match="calling cuBLAS API during stream capture"):
            a @ a
        a *= 3
    s.end_capture().launch(s)
    with s:
        assert a.sum().item() == 12.0


# -- knobs ---------------------------------------------------------------------------------------------


def test_seeded_delays_keep_results(cuda: SimApi, sim: Simulator) -> None:
    sim.configure(seed=3, max_delay_s=0.002)
    xp, a, b, e = cuda.xp, cuda.stream(0), cuda.stream(0), cuda.event()
    with a:
        x = xp.arange(5.0)
        x *= 2
    e.record(a)
    b.wait_event(e)
    with b:
        y = x + 1
        assert y.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert sim.races == []


def test_reset_clears_knobs_and_state(cuda: SimApi, sim: Simulator) -> None:
    sim.configure(devices=3, memory_bytes=1 << 20, seed=1, max_delay_s=0.01)
    assert cuda.device_count() == 3 and cuda.device_memory(0) == 1 << 20
    sim.fail_launches(5)
    cuda.set_pool_limit(0, 1024)
    sim.reset()
    assert cuda.device_count() == 2 and cuda.device_memory(0) == 16 << 30
    assert sim.max_delay_s is None
    assert cuda.xp.ones(1000).sum().item() == 1000.0


def test_api_defaults(cuda: SimApi) -> None:
    assert cuda.name == "simulator"
    assert cuda.device_name(1) == "simulated device 1"
    assert "cudasim" in cuda.version()
    x = cuda.empty((2, 3), np.float32)
    assert x.shape == (2, 3) and cuda.device_of(x) == 0
    y = cuda.copy(cuda.xp.ones(3))
    assert y.tolist() == [1.0, 1.0, 1.0]
    assert cuda.buffer_key(y.reshape(3, 1))[0] == y.data.ptr


# -- more: threads, graphs, indexing, reset -------------------------------------------------------------


def test_stream_threads_end_with_their_streams(cuda: SimApi) -> None:
    s = cuda.stream(0)
    with s:
        cuda.xp.ones(3).sum()
    thread = s._worker.thread
    assert thread.is_alive() and thread.daemon
    del s
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def test_host_callbacks_share_one_driver_thread(cuda: SimApi) -> None:
    seen: list[int] = []
    streams = [cuda.stream(0), cuda.stream(1)]
    for s in streams:
        s.launch_host_func(lambda _: seen.append(threading.get_ident()), None)
    for s in streams:
        s.synchronize()
    assert len(seen) == 2 and seen[0] == seen[1] != threading.get_ident()


def test_a_closed_stream_ends_its_thread_and_refuses_work(cuda: SimApi) -> None:
    s = cuda.stream(0)
    with s:
        doubled = cuda.xp.arange(3.0) * 2
    event = cuda.event()
    event.record(s)
    thread = s.close()
    thread.join(10)
    assert not thread.is_alive()  # after the work queued on it ran
    assert event.done
    with pytest.raises(CUDARuntimeError) as info, s:
        doubled * 2
    assert info.value.status == 400
    event.synchronize()
    np.testing.assert_array_equal(doubled.get(), [0.0, 2.0, 4.0])


def test_an_idle_driver_thread_stops_and_the_next_callback_starts_it(cuda: SimApi, sim: Simulator) -> None:
    seen: list[str] = []
    s = cuda.stream(0)
    s.launch_host_func(lambda _: seen.append(threading.current_thread().name), None)
    s.synchronize()
    assert sim.driver.stop_idle(10) == []
    assert not any(t.name == "cuda-driver" for t in threading.enumerate())
    s.launch_host_func(lambda _: seen.append(threading.current_thread().name), None)
    s.synchronize()
    assert seen == ["cuda-driver", "cuda-driver"]


def test_graph_replay_is_race_checked(cuda: SimApi, sim: Simulator) -> None:
    xp, a, s = cuda.xp, cuda.stream(0), cuda.stream(0)
    with s:
        x = xp.zeros(4)
    s.synchronize()
    s.begin_capture()
    with s:
        x += 1
    graph = s.end_capture()
    with a:
        x *= 2  # a writes x, and s is not ordered after it
    with pytest.raises(RaceError, match=r"graph node captured at test_sim\.py"):
        graph.launch(s)
    assert len(sim.races) == 1


def test_a_graph_launched_after_an_array_of_its_capture_died_raises(cuda: SimApi, sim: Simulator) -> None:
    """CuPy gives a freed block to the next allocation, which each replay then overwrites: the simulator
    refuses the launch instead, naming the capture."""
    xp, s = cuda.xp, cuda.stream(0)
    s.begin_capture()
    with s:
        tmp = xp.zeros(8)
        tmp += 1
    graph = s.end_capture()
    graph.launch(s)  # alive: fine
    del tmp
    gc.collect()
    with pytest.raises(RaceError, match=r"after an array allocated during its capture .* was freed"):
        graph.launch(s)
    assert len(sim.races) == 1
    sim.races.clear()


def test_a_private_pool_keeps_a_captures_memory_from_other_allocations(cuda: SimApi) -> None:
    """Allocated from a graph pool, a capture's temporaries may die: the block goes back to that pool, not
    to the device's, so launching stays safe and the shared pool never hands it out."""
    xp, s = cuda.xp, cuda.stream(0)
    pool = cuda.graph_pool(0)
    before = cuda.pool_used(0)
    with cuda.allocating_from(pool):
        s.begin_capture()
        with s:
            tmp = xp.zeros(1 << 10)
            tmp += 1
            address = tmp.data.ptr
        graph = s.end_capture()
    assert cuda.pool_used(0) == before  # none of it from the device's pool
    del tmp
    gc.collect()
    with s:
        other = xp.empty(1 << 10)
    assert other.data.ptr != address
    graph.launch(s)
    s.synchronize()


def test_device_synchronize_during_capture_invalidates_it(cuda: SimApi) -> None:
    s = cuda.stream(0)
    s.begin_capture()
    with pytest.raises(CUDARuntimeError) as info:
        cuda.xp.cuda.Device(0).synchronize()
    assert info.value.status == 900
    with pytest.raises(CUDARuntimeError) as info:
        s.end_capture()
    assert info.value.status == 901


def test_other_syncs_do_not_invalidate_a_capture(cuda: SimApi) -> None:
    s, other, e = cuda.stream(0), cuda.stream(0), cuda.event()
    e.record(other)
    s.begin_capture()
    other.synchronize()
    e.synchronize()
    assert e.done
    s.end_capture()


def test_indexing(cuda: SimApi) -> None:
    xp = cuda.xp
    a = xp.arange(10) * 10
    assert a[xp.asarray([3, 1])].tolist() == [30, 10]
    assert a[a > 60].tolist() == [70, 80, 90]
    a[xp.asarray([0, 9])] = -1
    a[2:4] = xp.asarray([5, 6])
    assert a.tolist() == [-1, 10, 5, 6, 40, 50, 60, 70, 80, -1]
    with pytest.raises(ValueError, match="could not broadcast"):
        a[0:3] = xp.ones(2, dtype=a.dtype)
    m = xp.zeros((2, 3))
    m[1] = 7
    assert m.sum().item() == 21.0 and len(m) == 2


def test_shape_errors_raise_at_enqueue(cuda: SimApi, sim: Simulator) -> None:
    xp = cuda.xp
    with pytest.raises(ValueError):
        xp.ones((2, 3)) @ xp.ones((2, 3))
    with pytest.raises(ValueError):
        xp.ones(2) + xp.ones(3)
    with pytest.raises(ValueError):
        xp.ones(0).max()
    assert sim.faults == []


def test_reset_releases_a_stream_waiting_on_dropped_work(
    cuda: SimApi, gate: GateMaker, sim: Simulator
) -> None:
    a, b, e = cuda.stream(0), cuda.stream(0), cuda.event()
    g = gate()
    g.hold(a)
    e.record(a)
    b.wait_event(e)
    assert g.reached.wait(10)
    sim.reset()
    b.synchronize()  # does not hang: the record b waited for was dropped
    g.open()
    a.synchronize()


def test_captured_copies_check_their_host_memory_at_each_launch(cuda: SimApi, sim: Simulator) -> None:
    s = cuda.stream(0)
    with s:
        x = cuda.xp.zeros(3)
    s.synchronize()
    src = cuda.empty_pinned((3,), np.float64)
    out = cuda.empty_pinned((3,), np.float64)
    src[:] = 1.0
    out[:] = 0.0
    with cuda.capturing(s) as graph:
        cuda.h2d(x, src, s)
        with s:
            y = x * 2
        with pytest.raises(RuntimeError, match="D2H transfers are disallowed"):
            cuda.d2h(y, out, s)  # CuPy refuses even an asynchronous D2H during capture
    assert out.tolist() == [0.0, 0.0, 0.0]
    for value in (1.0, 4.0):
        src[:] = value  # a new input between launches is no fault: the checksum is taken at launch
        graph[0].launch(s)
        cuda.d2h(y, out, s)
        s.synchronize()
        assert out.tolist() == [2 * value] * 3
    assert sim.faults == []


def test_empty_arrays_take_no_memory(cuda: SimApi) -> None:
    before = cuda.pool_used(0)
    a = cuda.xp.zeros((0, 3))
    assert a.data.ptr == 0 and cuda.pool_used(0) == before
    assert a.sum(axis=0).tolist() == [0.0, 0.0, 0.0]
