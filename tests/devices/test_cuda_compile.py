"""``eng.compile`` on cuda devices: CUDA graphs where CuPy can capture, bit for bit the eager results.

On the CUDA simulator (or CuPy and a real GPU: ``SCHEDSVC_TEST_CUDA=cupy``).  Each test starts from a
reset simulator and ends with no race and no fault recorded; the simulator refuses cuBLAS during
capture as CuPy 14.2 does, fails a sync during capture with CUDA's 900/901, and refuses to launch a
graph whose capture's memory went back to the shared pool.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc.cli import make_mlp, mlp_weights
from schedsvc.tensor import OPS, Op
from tests.devices.cuda_helpers import (
    ON_CUPY,
    checked_simulator,
    cuda_api,
    cuda_engine,
    host,
    sim,
    simulator_only,
)
from tests.helpers import within

DEVICE = "cuda:0"


@pytest.fixture(autouse=True)
def _simulator(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from checked_simulator(request)


@pytest.fixture
def delays() -> None:
    """Seeded random delays on every stream operation (the simulator only)."""
    if not ON_CUPY:
        sim().configure(seed=4321, max_delay_s=0.001)


def _rows(seed: int, n: int = 4) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, 512))


def _mlp_args(eng: ss.Engine) -> list[ss.Tensor]:
    return [eng.asarray(w, device=DEVICE) for w in mlp_weights()]


def _mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, w3: Any, b3: Any) -> Any:
    return make_mlp([w1, b1, w2, b2, w3, b3])(x)


async def _value(t: Any) -> np.ndarray[Any, Any]:
    value = await within(t)
    assert isinstance(value, cuda_api().ndarray), type(value)
    return host(value)


async def test_the_mlp_replays_as_one_cuda_graph_bit_for_bit_the_eager_tensors() -> None:
    """One stream: the first call warms up, the second captures the whole MLP -- its three matrix products
    through cuBLAS's C API (``capture_gemm``) in the graph --, the rest launch it; every result equals the
    eager Tensors' bits."""
    async with cuda_engine(streams_per_device=1) as eng:
        weights = _mlp_args(eng)
        x = eng.asarray(_rows(1), device=DEVICE)
        eager = await _value(_mlp(x, *weights))
        compiled = eng.compile(_mlp)
        for _ in range(5):
            got = await _value(compiled(x, *weights))
            np.testing.assert_array_equal(got, eager)
            assert got.tobytes() == eager.tobytes()
        stats = compiled.stats()
        assert stats["stream_replays"] == 1  # the warm-up
        assert stats["cuda_graphs"] == 1  # matmul, add, relu, matmul, add, relu, matmul, add
        assert stats["graph_replays"] == 4
        assert compiled.capture_off is None


async def test_without_a_capturable_gemm_the_products_run_between_the_graphs_and_capture_off_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where cuBLAS's C API is not usable (an old CUDA, another BLAS), the matrix products run eagerly
    between graphs, as CuPy's own calls: one graph per run of the other ops; the results are the same."""
    api = type(cuda_api())
    monkeypatch.setattr(api, "capture_gemm", lambda self, device: "cuBLAS's C API is not usable here (test)")
    async with cuda_engine(streams_per_device=1) as eng:
        weights = _mlp_args(eng)
        x = eng.asarray(_rows(1), device=DEVICE)
        eager = await _value(_mlp(x, *weights))
        compiled = eng.compile(_mlp)
        for _ in range(4):
            assert (await _value(compiled(x, *weights))).tobytes() == eager.tobytes()
        assert compiled.stats()["cuda_graphs"] == 3  # add+relu, add+relu, add
        assert compiled.capture_off is not None
        assert (
            "between the graphs" in compiled.capture_off and "not usable here (test)" in compiled.capture_off
        )


async def test_a_capture_fallback_is_one_warning_on_schedsvc_compile_per_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Products split off (no capturable gemm), and a function that returns its argument (no graph at
    all): each said once, however many replays and streams, with the reason ``capture_off`` gives."""
    caplog.set_level(logging.DEBUG, logger="schedsvc.compile")
    api = type(cuda_api())
    monkeypatch.setattr(api, "capture_gemm", lambda self, device: "cuBLAS's C API is not usable here (test)")
    async with cuda_engine(streams_per_device=2) as eng:
        weights = _mlp_args(eng)
        x = eng.asarray(_rows(1), device=DEVICE)
        split = eng.compile(_mlp)
        same = eng.compile(lambda x: (x, x + 1.0))
        for _ in range(4):
            await _value(split(x, *weights))
            await _value(same(x)[1])
    said = [r for r in caplog.records if r.name == "schedsvc.compile"]
    assert [r.levelno for r in said] == [logging.WARNING] * 2, [r.getMessage() for r in said]
    assert {r.getMessage() for r in said} == {
        f"compiled function mlp runs some of its ops between its CUDA graphs: {split.capture_off}",
        f"compiled function lambda replays without CUDA graphs, as CuPy calls on its stream: {same.capture_off}",
    }


async def test_a_product_the_captured_gemm_does_not_take_runs_between_the_graphs() -> None:
    """A batched (3-D) product is split off, and capture_off says so; the rest is captured."""
    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.arange(24.0).reshape(2, 3, 4), device=DEVICE)
        w = eng.asarray(np.ones((2, 4, 5)), device=DEVICE)
        compiled = eng.compile(lambda x, w: np.tanh(x @ w + 1.0))
        want = await _value(np.tanh(x @ w + 1.0))
        for _ in range(3):
            assert (await _value(compiled(x, w))).tobytes() == want.tobytes()
        assert compiled.stats()["cuda_graphs"] == 1  # add, tanh
        assert compiled.capture_off is not None and "between the graphs" in compiled.capture_off


async def test_new_inputs_each_call_are_staged_and_every_result_stays_its_own() -> None:
    """A new x per call: the capture copies it in, and copies each result out, so results held at once
    are each their own call's (the next replay writes the capture's memory, not theirs)."""
    async with cuda_engine(streams_per_device=1) as eng:
        weights = _mlp_args(eng)
        compiled = eng.compile(_mlp)
        xs = [eng.asarray(_rows(seed), device=DEVICE) for seed in range(12)]
        results = [compiled(x, *weights) for x in xs]  # queued at once, none awaited
        for x, result in zip(xs, results, strict=True):
            want = await _value(_mlp(x, *weights))
            assert (await _value(result)).tobytes() == want.tobytes()
        stats = compiled.stats()
        assert stats["cuda_graphs"] == 1 and stats["graph_replays"] == 11, stats


async def test_an_argument_read_in_place_that_moves_is_captured_again_staged() -> None:
    """Two calls with the same x capture it in place; a third with another x retires that capture and
    captures again with x staged, after which x may change freely."""
    async with cuda_engine(streams_per_device=1) as eng:
        a = eng.asarray(np.arange(6.0), device=DEVICE)
        b = eng.asarray(np.arange(6.0) * 10, device=DEVICE)
        compiled = eng.compile(lambda x: np.sqrt(x * 2.0 + 1.0).sum())
        for x in (a, a, b, a, b):
            want = np.sqrt(host(await within(x)) * 2.0 + 1.0).sum()
            got = await _value(compiled(x))
            eager = await _value(np.sqrt(x * 2.0 + 1.0).sum())
            assert got.tobytes() == eager.tobytes() and np.isclose(got, want)
        stats = compiled.stats()
        assert stats["cuda_graphs"] == 2 and stats["graph_replays"] == 4, stats


async def test_weights_closed_over_as_numpy_arrays_go_to_the_device_once() -> None:
    """Constants of a cuda signature are copied to the device by the first call (not per call), and the
    replay uses them there (no 'Unsupported type ndarray')."""
    async with cuda_engine(streams_per_device=1) as eng:
        model = eng.compile(make_mlp(mlp_weights()))
        weights = _mlp_args(eng)
        x = eng.asarray(_rows(3), device=DEVICE)
        want = await _value(_mlp(x, *weights))
        before = eng.stats().submitted
        for _ in range(4):
            assert (await _value(model(x))).tobytes() == want.tobytes()
        assert eng.stats().submitted - before == 4 + 6  # four replays, six weights copied in once
        assert model.stats()["graph_replays"] == 3


async def test_views_reductions_and_writes_inside_the_graph_match_eager() -> None:
    def fn(x: Any, y: Any) -> Any:
        t = x.T * 2.0  # a view, then a kernel
        t[0] = -1.0  # a write into the graph's own memory
        s = np.exp(t).sum(axis=1) + np.tanh(y[1:3]).max()
        u = x[:, ::2]  # a strided view, read by the next kernel
        return s * 0.5, u + 1.0

    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.random.default_rng(5).standard_normal((3, 4)), device=DEVICE)
        y = eng.asarray(np.random.default_rng(6).standard_normal(5), device=DEVICE)
        compiled = eng.compile(fn)
        eager = [await _value(t) for t in fn(x, y)]
        for _ in range(4):
            got = [await _value(t) for t in compiled(x, y)]
            assert [g.tobytes() for g in got] == [e.tobytes() for e in eager]
        assert compiled.stats()["cuda_graphs"] == 1  # no cuBLAS op: one graph
        assert compiled.stats()["graph_replays"] == 3


async def test_returning_an_argument_replays_on_the_stream_and_says_why() -> None:
    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.arange(4.0), device=DEVICE)
        compiled = eng.compile(lambda x: (x, x + 1.0))
        for _ in range(3):
            same, plus = compiled(x)
            np.testing.assert_array_equal(await _value(plus), np.arange(4.0) + 1)
            np.testing.assert_array_equal(await _value(same), np.arange(4.0))
        stats = compiled.stats()
        assert stats["stream_replays"] == 3 and stats["cuda_graphs"] == 0
        assert compiled.capture_off is not None and "returns an argument" in compiled.capture_off


@pytest.mark.usefixtures("delays")
async def test_replays_on_several_streams_race_free_and_exact() -> None:
    """Replays queued at once spread over three streams, each with its own capture; the simulator's
    race detector (with random delays) checks every replay's copies, graphs and matmuls."""
    async with cuda_engine(streams_per_device=3) as eng:
        weights = _mlp_args(eng)
        compiled = eng.compile(_mlp)
        xs = [eng.asarray(_rows(seed, 2), device=DEVICE) for seed in range(24)]
        results = [compiled(x, *weights) for x in xs]
        wants = [_mlp(x, *weights) for x in xs]
        for result, want in zip(results, wants, strict=True):
            assert (await _value(result)).tobytes() == (await _value(want)).tobytes()
        stats = compiled.stats()
        assert stats["stream_replays"] + stats["graph_replays"] == 24
        assert stats["graph_replays"] > 0


@simulator_only
async def test_a_host_sync_during_capture_falls_back_to_the_stream_replay_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An op that synchronises its stream invalidates the capture (900, then 901 at its end): the call
    runs as a stream replay instead, and so do the later ones, with CUDA's error as the reason."""
    api = cuda_api()

    def syncing_tanh(x: Any, **kwargs: Any) -> Any:
        api.current_stream().synchronize()
        return np.tanh(x, **kwargs)

    monkeypatch.setitem(OPS, "tanh", Op("tanh", syncing_tanh, OPS["tanh"].infer))
    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.linspace(-2.0, 2.0, 8), device=DEVICE)
        compiled = eng.compile(lambda x: np.tanh(x * 3.0) + 1.0)
        for _ in range(4):
            np.testing.assert_array_equal(
                await _value(compiled(x)), np.tanh(np.linspace(-2.0, 2.0, 8) * 3.0) + 1.0
            )
        stats = compiled.stats()
        assert stats["cuda_graphs"] == 0 and stats["stream_replays"] == 4, stats
        assert compiled.capture_off is not None
        assert "cudaErrorStreamCaptureUnsupported" in compiled.capture_off


async def test_a_captured_cuda_tensor_is_a_device_constant() -> None:
    """A finished cuda Tensor captured by a compiled function is snapshotted as every capture is: a cuda
    call gets it copied to its device, a cpu call uses it on the host."""
    w = np.linspace(-1.0, 1.0, 6)
    async with cuda_engine(streams_per_device=1) as eng:
        weight = eng.asarray(w, device=DEVICE)
        shift = weight * 3.0
        await within(shift)
        compiled = eng.compile(lambda x: x * weight + shift)
        x = np.arange(6.0)
        for _ in range(3):
            got = await _value(compiled(eng.asarray(x, device=DEVICE)))
            np.testing.assert_array_equal(got, x * w + w * 3.0)
        on_host = await within(compiled(eng.asarray(x)))
        assert type(on_host) is np.ndarray
        np.testing.assert_array_equal(on_host, x * w + w * 3.0)


async def test_the_cpu_signature_of_the_same_function_keeps_its_own_replay() -> None:
    """The graph cache is keyed by devices as on the CPU: a cpu call and a cuda call are two signatures."""
    async with cuda_engine(streams_per_device=1) as eng:
        compiled = eng.compile(lambda x: x * 2.0 + 1.0)
        host_x = eng.asarray(np.arange(3.0))
        dev_x = eng.asarray(np.arange(3.0), device=DEVICE)
        for _ in range(3):
            np.testing.assert_array_equal(await within(compiled(host_x)), np.arange(3.0) * 2 + 1)
            np.testing.assert_array_equal(await _value(compiled(dev_x)), np.arange(3.0) * 2 + 1)
        stats = compiled.stats()
        assert stats["signatures"] == 2 and stats["traces"] == 2
        assert stats["stream_replays"] == 1 and stats["graph_replays"] == 2, stats


async def test_outputs_keep_the_eager_layout_and_share_memory_as_eager_ones_do() -> None:
    """A captured replay's outputs are laid out as the stream replay returns them: a transposed result
    stays transposed (a reduction over it then adds in the eager order, bit for bit), and outputs that
    are views of one array still share it (a write into one shows in the others, as eager)."""

    def fn(x: Any) -> Any:
        t = x * 2.0
        return t.T, t, t[1]

    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.random.default_rng(7).standard_normal((40, 300)), device=DEVICE)
        compiled = eng.compile(fn)
        eager = fn(x)
        want_strides = [(await within(t)).strides for t in eager]
        want_sum = await _value(eager[0].sum(axis=0))
        eager[1][1] = 7.0
        want_row = await _value(eager[2])
        for _ in range(3):
            got = compiled(x)
            assert [(await within(t)).strides for t in got] == want_strides
            assert (await _value(got[0].sum(axis=0))).tobytes() == want_sum.tobytes()
            got[1][1] = 7.0
            assert (await _value(got[2])).tobytes() == want_row.tobytes()
        assert compiled.stats()["graph_replays"] == 2


def test_an_output_copied_out_keeps_its_axis_order() -> None:
    """The copy of a dense array whose axes are permuted (CuPy lays a ufunc's result out like its
    operand, order 'K') has its strides, not C order's."""
    from schedsvc.compile._cuda import _copy_like

    permuted = cuda_api().xp.empty((2, 3, 4)).transpose(1, 2, 0)
    assert not permuted.flags.c_contiguous and not permuted.flags.f_contiguous
    assert _copy_like(permuted).strides == permuted.strides


async def test_numpy_arguments_replay_on_the_device_the_call_runs_on() -> None:
    """A call runs on its first Tensor's device (a NumPy array names none), or on the engine's default
    device: a NumPy argument before a cuda Tensor, or NumPy arguments alone on an engine whose default is
    cuda:0, still make a cuda signature (its closed-over constants went unconverted: 'Unsupported type
    ndarray').  A cpu Tensor has the same signature as a NumPy array: that call runs on cuda:0 too."""
    weights = np.random.default_rng(1).standard_normal(4)
    h = np.random.default_rng(2).standard_normal((3, 4))

    def fn(h: Any, x: Any) -> Any:
        return x * h + weights

    async with cuda_engine(streams_per_device=1) as eng:
        x = eng.asarray(np.random.default_rng(3).standard_normal((3, 4)), device=DEVICE)
        want = await _value(fn(h, x))
        compiled = eng.compile(fn)
        for _ in range(3):
            assert (await _value(compiled(h, x))).tobytes() == want.tobytes()
        assert compiled.stats()["graph_replays"] == 2
        assert (await _value(compiled(eng.asarray(h), x))).tobytes() == want.tobytes()
        assert compiled.stats()["graph_replays"] == 3
    async with cuda_engine(devices=(DEVICE,), streams_per_device=1) as eng:
        x_host = np.random.default_rng(3).standard_normal((3, 4))
        compiled = eng.compile(fn)
        for _ in range(3):
            assert (await _value(compiled(h, x_host))).tobytes() == want.tobytes()
        assert compiled.stats()["graph_replays"] == 2
