"""``eng.compile``: the trace/replay lifecycle, one task per call, the graph and its optimisations,
what cannot be compiled (``ss.TraceError``), and the shapes of calls (outputs, arguments, nesting)."""

from __future__ import annotations

import asyncio
import gc
import math
import warnings
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from ..helpers import occupied, state, within
from .helpers import assert_matches_eager, assert_same_bits, values

X = np.arange(6.0).reshape(2, 3) / 4 - 0.5
W1 = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
B1 = np.linspace(0.0, 0.3, 4)
W2 = np.linspace(1.0, -1.0, 8).reshape(4, 2)
B2 = np.array([0.25, -0.25])


def stats(c: ss.Compiled) -> tuple[int, int, int, int]:
    s = c.stats()
    return s["traces"], s["replays"], s["signatures"], s["evictions"]


def submitted(eng: ss.Engine) -> int:
    return eng.stats().submitted


# -- lifecycle ------------------------------------------------------------------------------------------


async def test_first_call_traces_later_calls_replay(engine: ss.Engine) -> None:
    calls = []

    def fn(x: Any) -> Any:
        calls.append(1)
        return np.exp(x) * 2 + 1

    c = engine.compile(fn)
    assert isinstance(c, ss.Compiled)
    assert stats(c) == (0, 0, 0, 0)
    x = engine.asarray(X)
    for n in range(1, 4):
        out = c(x)
        assert isinstance(out, ss.Tensor)
        assert out.shape == (2, 3) and out.dtype == np.float64  # known at once, before it runs
        assert_same_bits(await within(out), np.exp(X) * 2 + 1)
        # every call, the tracing one too, runs the graph as one replay task
        assert stats(c) == (1, n, 1, 0)
    assert len(calls) == 1, "the Python function runs only while tracing"
    s = engine.stats()
    assert (s.compile_traces, s.compile_replays) == (1, 3)


async def test_engine_counts_every_compiled_function(engine: ss.Engine) -> None:
    a = engine.compile(lambda x: x + 1)
    b = engine.compile(lambda x: x * 2)
    await a(X)
    await a(X)
    await b(X)
    await b(X[:1])
    s = engine.stats()
    assert (s.compile_traces, s.compile_replays) == (3, 4)
    assert stats(a) == (1, 2, 1, 0)
    assert stats(b) == (2, 2, 2, 0)


async def test_new_values_of_the_same_signature_replay(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: np.maximum(x, 0) - x.sum(axis=0))
    for k in range(3):
        a = X * (k - 1)
        assert_same_bits(await c(engine.asarray(a)), np.maximum(a, 0) - a.sum(axis=0))
    assert stats(c)[:3] == (1, 3, 1)


async def test_new_shape_dtype_or_static_value_retraces(engine: ss.Engine) -> None:
    c = engine.compile(lambda x, k: x * k)
    await c(X, 2)
    await c(X, 2)
    assert stats(c)[0] == 1
    await c(X[:1], 2)  # shape
    assert stats(c)[0] == 2
    await c(X.astype(np.float32), 2)  # dtype
    assert stats(c)[0] == 3
    assert_same_bits(await c(X, 3), X * 3)  # a Python scalar's value
    assert stats(c)[0] == 4
    # equal values of other types are other constants: 2.0 and True trace anew, and compute as NumPy does
    assert_same_bits(await c(X.astype(np.float32), 2.0), X.astype(np.float32) * 2.0)
    assert_same_bits(await c(X.astype(np.int64), True), X.astype(np.int64) * True)
    assert_same_bits(await c(X.astype(np.float32), np.float64(2)), X.astype(np.float32) * np.float64(2))
    assert stats(c)[:3] == (7, 8, 7)


async def test_calls_that_differ_from_the_latest_signature_do_not_replay_it(engine: ss.Engine) -> None:
    """A call with Tensors only is matched against the latest signature without building its own:
    every way of differing from it (shape, dtype, arity, a non-Tensor, a keyword) still selects its own."""
    c = engine.compile(lambda x, y=None: x * 2 if y is None else x - y)
    x, x1 = engine.asarray(X), engine.asarray(X[:1])
    x32 = engine.asarray(X.astype(np.float32))
    big = engine.asarray(X.astype(">f8"))  # same shape and kind, other byte order: another dtype
    for _ in range(2):  # the second round finds every signature cached
        assert_same_bits(await c(x), X * 2)
        assert_same_bits(await c(x1), X[:1] * 2)
        assert_same_bits(await c(x32), X.astype(np.float32) * 2)
        assert_same_bits(await c(big), X.astype(">f8") * 2)
        assert_same_bits(await c(x, x), X - X)
        assert_same_bits(await c(x, y=x1), X - X[:1])
        assert_same_bits(await c(X), X * 2)  # an ndarray of the latest Tensor's signature
        assert_same_bits(await c(x, 3.0), X - 3.0)
    assert stats(c)[:3] == (7, 16, 7)


async def test_static_strings_and_tuples_are_part_of_the_signature(engine: ss.Engine) -> None:
    def fn(x: Any, mode: str, axes: tuple[int, ...]) -> Any:
        return x.sum(axis=axes) if mode == "sum" else x.max(axis=axes)

    c = engine.compile(fn)
    assert_same_bits(await c(X, "sum", (0,)), X.sum(axis=0))
    assert_same_bits(await c(X, "max", (0,)), X.max(axis=0))
    assert_same_bits(await c(X, "max", (1,)), X.max(axis=1))
    assert_same_bits(await c(X, "max", (0, 1)), X.max(axis=(0, 1)))
    assert_same_bits(await c(X, "sum", (0,)), X.sum(axis=0))
    assert stats(c)[:3] == (4, 5, 4)


async def test_tensor_and_ndarray_arguments_of_one_shape_share_a_signature(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x - 1)
    assert_same_bits(await c(X), X - 1)
    assert_same_bits(await c(engine.asarray(X + 1)), X)
    assert stats(c)[:3] == (1, 2, 1)


# Regression (a bug at f160ac0): the signature compares static floats by ==, so 0.0 and -0.0 share a
# signature and the second call replays the first's constant
async def test_negative_zero_static_argument_retraces(engine: ss.Engine) -> None:
    c = engine.compile(lambda x, s: x * s)
    x = np.array([1.0, 2.0])
    assert_same_bits(await c(x, 0.0), x * 0.0)
    assert_same_bits(await c(x, -0.0), x * -0.0)  # [-0., -0.]: gets [0., 0.]


# Regression (a bug at f160ac0): a NaN static argument never equals itself in the signature, so every call
# with it traces again and fills the cache with copies of one signature
async def test_nan_static_argument_traces_once(engine: ss.Engine) -> None:
    c = engine.compile(lambda x, s: x + s)
    for _ in range(3):
        assert_same_bits(await c(X, float("nan")), X + float("nan"))
    assert stats(c)[:3] == (1, 3, 1)


async def test_lru_evicts_the_least_recently_used_signature(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x * 2, max_signatures=2)
    a, b, d = np.ones(1), np.ones(2), np.ones(3)
    await c(a)
    await c(b)
    assert stats(c) == (2, 2, 2, 0)
    await c(a)  # a is now the most recent; b is the oldest
    await c(d)  # evicts b
    assert stats(c) == (3, 4, 2, 1)
    assert [g.nodes[g.inputs[0]].shape for g in c.graphs] == [(1,), (3,)]  # oldest first
    await c(a)
    assert stats(c) == (3, 5, 2, 1)
    await c(b)  # traced again after its eviction; evicts d
    assert stats(c) == (4, 6, 2, 2)
    assert_same_bits(await c(d), d * 2)  # d too
    assert stats(c) == (5, 7, 2, 3)
    s = engine.stats()
    assert (s.compile_traces, s.compile_replays) == (5, 7)


def batches(n: int) -> list[np.ndarray]:
    return [np.full((size, 3), float(size)) for size in range(1, n + 1)]


# Regression (issue 15, item 12): the default max_signatures (16) was below the 32 batch sizes a loader
# gives, so cycling through them traced on every call (160 traces in 160 calls), silently
async def test_32_batch_sizes_trace_once_each_by_default(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x * 2)
    assert c.max_signatures == 64
    for _ in range(3):
        for x in batches(32):
            assert_same_bits(await c(x), x * 2)
    assert stats(c) == (32, 96, 32, 0)


async def test_a_cache_that_keeps_retracing_warns_once(engine: ss.Engine) -> None:
    c = engine.compile(lambda x, k: x * k, max_signatures=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for x in batches(32):
                assert_same_bits(await c(x, 2), x * 2)
    assert stats(c) == (64, 64, 16, 48)  # every call of the second round traced again
    assert [w.category for w in caught] == [RuntimeWarning]
    message = str(caught[0].message)
    assert "max_signatures=16" in message
    assert "argument 0 axis 0 takes 32 sizes (1, 2, 3, 4, 5, 6, 7, 8, ...)" in message
    assert "argument 1" not in message  # the same static value every call
    assert caught[0].filename == __file__  # points at the call


async def test_a_float_argument_that_changes_every_call_warns_once(engine: ss.Engine) -> None:
    """Regression: a float argument that changed every call traced every call, with no warning (each value is
    a new signature, never an evicted one, so the warning about retracing never came)."""
    c = engine.compile(lambda x, lr, *, momentum: x * lr + momentum)
    x = np.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(20):
            assert_same_bits(await c(x, 0.5 + step, momentum=0.25), x * (0.5 + step) + 0.25)
    assert c.stats()["traces"] == 20
    assert [w.category for w in caught] == [RuntimeWarning]
    message = str(caught[0].message)
    assert "8 values of argument 1 ('lr'), a float" in message
    assert "np.asarray(value)" in message and "momentum" not in message  # the same value every call
    assert caught[0].filename == __file__  # points at the call
    as_array = engine.compile(lambda x, lr: x * lr)  # what the warning says to do: one trace
    for step in range(20):
        assert_same_bits(await as_array(x, np.asarray(0.5 + step)), x * (0.5 + step))
    assert as_array.stats()["traces"] == 1


async def test_a_float_argument_of_a_few_values_does_not_warn(engine: ss.Engine) -> None:
    c = engine.compile(lambda x, scale: x * scale)
    for _ in range(3):
        for scale in (0.5, 1.0, 2.0, -1.0, 1e-3, 1e3, 3.5):  # 7 values: 7 traces, then replays
            assert_same_bits(await c(np.ones(2), scale), np.ones(2) * scale)
    assert c.stats()["traces"] == 7


async def test_retracing_a_few_evicted_signatures_does_not_warn(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x + 1, max_signatures=2)
    for x in batches(3) * 2:  # 3 retraces of evicted signatures: an LRU doing its job
        assert_same_bits(await c(x), x + 1)
    assert stats(c) == (6, 6, 2, 4)


async def test_graph_is_the_latest_signature(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x + 1)
    with pytest.raises(ss.SchedsvcError, match="not been traced"):
        c.graph  # noqa: B018
    assert c.graphs == []
    await c(np.ones(2))
    first = c.graph
    await c(np.ones(3))
    second = c.graph
    assert first is not second
    assert second.nodes[second.inputs[0]].shape == (3,)
    await c(np.ones(2))  # a replay of the older signature makes it the latest
    assert c.graph is first
    assert c.graphs == [second, first]


async def test_compile_checks_its_arguments(engine: ss.Engine) -> None:
    with pytest.raises(TypeError, match="needs a function"):
        engine.compile(42)  # type: ignore[arg-type]
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_signatures"):
            engine.compile(lambda x: x, max_signatures=bad)  # type: ignore[arg-type]
    for bad_name in (5, b"model", ["model"]):
        with pytest.raises(TypeError, match=r"name=.*must be a str"):
            engine.compile(lambda x: x, name=bad_name)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match=r"name=.*must be a str"):
            engine.compile(lambda x: x, batch_axis=0, name=bad_name)  # type: ignore[call-overload]
    c = engine.compile(lambda x, o: x)
    with pytest.raises(TypeError, match="arguments must be Tensors, arrays, or constants"):
        c(X, object())
    assert stats(c) == (0, 0, 0, 0)


async def test_names_and_repr(engine: ss.Engine) -> None:
    def my_model(x: Any) -> Any:
        return x + 1

    c = engine.compile(my_model)
    assert c.name == "my_model"
    assert engine.compile(my_model, name="fancy func!").name == "fancy_func"
    assert "my_model" in repr(c) and "signatures=0" in repr(c)
    await c(X)
    assert "signatures=1" in repr(c) and "traces=1" in repr(c) and "replays=1" in repr(c)
    assert str(c.graph).startswith("graph my_model(")


# -- one task per call -----------------------------------------------------------------------------------


def mlp_eager(engine: ss.Engine) -> Any:
    w1, b1, w2, b2 = (engine.asarray(a) for a in (W1, B1, W2, B2))

    def mlp(x: Any) -> Any:
        h = np.maximum(x @ w1 + b1, 0)
        return np.tanh(h @ w2 + b2) * 0.5

    return mlp


async def test_a_call_is_one_engine_task(engine: ss.Engine) -> None:
    mlp = mlp_eager(engine)
    c = engine.compile(mlp)
    x = engine.asarray(X)
    before = submitted(engine)
    want = await within(mlp(x))
    eager_tasks = submitted(engine) - before
    assert eager_tasks >= 6
    for _ in range(3):
        before = submitted(engine)
        got = c(x)
        assert submitted(engine) - before == 1
        assert_same_bits(await within(got), want)


async def test_a_tuple_output_adds_one_small_task_per_output(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = np.exp(x)
        return y, y.sum(axis=0), x.T

    c = engine.compile(fn)
    x = engine.asarray(X)
    for _ in range(2):
        before = submitted(engine)
        out = c(x)
        assert submitted(engine) - before == 1 + 3
        assert isinstance(out, tuple) and len(out) == 3
        assert [t.shape for t in out] == [(2, 3), (3,), (3, 2)]
    await assert_matches_eager(fn, c, x)


# -- the graph ------------------------------------------------------------------------------------------


async def test_graph_prints_its_ops_types_and_report(engine: ss.Engine) -> None:
    c = engine.compile(mlp_eager(engine), name="mlp")
    await c(engine.asarray(X))
    text = str(c.graph)
    assert repr(c.graph) == text
    lines = text.splitlines()
    assert lines[0].startswith("graph mlp(%0: float64[2, 3]) -> %")
    for op in ("matmul(", "add(", "maximum(", "tanh(", "multiply(", "const"):
        assert op in text, f"{op} missing from\n{text}"
    assert "float64[2, 4]" in text and "float64[2, 2]" in text
    assert lines[-2].startswith("  return %")
    assert lines[-1].startswith("  # traced: ")
    for key in ("traced", "folded", "merged", "kept", "reused"):
        assert f"{key}: {c.graph.report[key]}" in lines[-1]


async def test_graph_prints_index_literals(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x[None, ..., ::2][0, :1] + x.reshape(3, 2).T[:, -2:3])
    await c(X)
    text = str(c.graph)
    for literal in ("index=(None, ..., ::2)", "index=(0, :1)", "shape=(3, 2)", "index=(:, -2:3)"):
        assert literal in text, f"{literal} missing from\n{text}"


# Regression (a bug at f160ac0): Graph printing strips trailing ':' of a slice, so x[1:] prints as index=1
# (an integer index) and x[1::] the same
async def test_graph_prints_an_open_slice_as_a_slice(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x[1:] + 1)
    await c(np.ones(3))
    assert "index=1:" in str(c.graph), str(c.graph)


async def test_dead_code_is_counted_but_not_kept(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        unused = np.exp(x) * 3  # noqa: F841
        return np.sin(x) + 1

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(X))
    report = c.graph.report
    assert report["traced"] == 4
    assert report["kept"] == 2
    text = str(c.graph)
    assert "exp" not in text and "multiply" not in text


async def test_repeated_subexpression_is_merged(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        return np.sin(x * 3) + np.sin(x * 3)

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(X))
    assert c.graph.report["merged"] == 2  # x * 3 and sin(...)
    assert c.graph.report["kept"] == 3
    assert str(c.graph).count("sin(") == 1


async def test_captured_constants_and_created_arrays_fold(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        w = engine.asarray(W1)
        scale = engine.ones((4,)) * 2 + engine.arange(4)
        return x @ (w * 2) + scale

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(X))
    report = c.graph.report
    assert report["folded"] >= 5  # ones, * 2, arange, +, w * 2
    assert report["kept"] == 2  # matmul, add
    assert "ones" not in str(c.graph) and "arange" not in str(c.graph)


async def test_mlp_chain_reuses_buffers(engine: ss.Engine) -> None:
    mlp = mlp_eager(engine)
    c = engine.compile(mlp)
    x = engine.asarray(X)
    await assert_matches_eager(mlp, c, x)
    assert c.graph.report["reused"] >= 3
    assert "(reused)" in str(c.graph)
    assert_same_bits(await x, X)  # the argument is never a reuse target


async def test_an_input_is_never_written_by_reuse(engine: ss.Engine) -> None:
    a = X.copy()
    c = engine.compile(lambda x: np.exp(x) + 1)
    assert_same_bits(await c(a), np.exp(X) + 1)
    assert c.graph.report["reused"] == 1  # exp's fresh memory, never x's
    assert_same_bits(a, X)


# Regression (a bug at f160ac0): buffer reuse moves a reused node to its operand's memory but not the views
# of it made before planning, so a later op reuses that memory while a view still reads it (wrong result)
async def test_reuse_respects_a_view_of_a_reused_buffer(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        z = np.exp(x * 2)  # reuses x * 2
        v = z[0:1]
        w = np.sin(z)  # must not reuse z: v reads it below
        return w + v

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(np.array([0.5, 1.0, 1.5])))


# Regression (a bug at f160ac0): CSE keys literals by (type, ==), so x * 0.0 and x * -0.0 merge and -0.0
# becomes 0.0
async def test_cse_keeps_negative_zero_apart(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        return x * 0.0, x * -0.0

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(np.array([1.0, 2.0])))


# Regression (a bug found while building issue 3, now fixed): buffer reuse writes a ufunc result into its
# operand's memory, keeping that memory's layout (Fortran order after x.T) where NumPy gives a fresh result
# C order; a reduction over it then adds in another order, so float32 sums differ from eager in the last
# bits
async def test_reuse_keeps_the_layout_numpy_gives(engine: ss.Engine) -> None:
    def fn(x: Any, y: Any) -> Any:
        b = np.exp(x.T) + y  # the add reuses exp's memory, laid out like x.T
        return b.sum(axis=1), b

    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8) ** 3
    y = np.linspace(1, -2, 64, dtype=np.float32).reshape(8, 8)
    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(x), engine.asarray(y))
    got, want = (await values(c(x, y)))[1], (await values(fn(engine.asarray(x), engine.asarray(y))))[1]
    assert got.flags.c_contiguous == want.flags.c_contiguous


# -- equal to eager: writes, views, outputs --------------------------------------------------------------


async def test_writes_to_intermediates_match_eager(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = x * 2
        y += 1
        v = y[:, :2]
        v *= 3
        y[0] = 5
        z = y.T.copy()
        np.add(z, 1, out=z)
        z[-1, ...] = x[:, 0]
        return y, v, y.sum(axis=0), z

    c = engine.compile(fn)
    for k in range(2):
        await assert_matches_eager(fn, c, engine.asarray(X + k))
    assert stats(c)[:2] == (1, 2)


async def test_write_after_read_of_an_intermediate(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = np.exp(x)
        before = y + 0  # reads y before the write below
        y += 1
        after = y * 1
        y[...] = 0  # written, never read again: dead
        return before, after

    c = engine.compile(fn)
    await assert_matches_eager(fn, c, engine.asarray(X))


# Regression (a bug found while building issue 3, now fixed): eagerly, a ufunc whose only Tensor is out=
# (np.add(2, 1, out=y)) raises InvalidTask 'out= belongs to another engine' (there is no other engine);
# compiled, it writes y as NumPy does
async def test_ufunc_whose_only_tensor_is_out(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = x * 1
        np.add(2, 1, out=y)
        return y

    c = engine.compile(fn)
    x = engine.asarray(np.array([1.0, 2.0]))
    assert_same_bits(await c(x), np.array([3.0, 3.0]))
    await assert_matches_eager(fn, c, x)


# Regression (a bug found while building issue 3, now fixed): y[0] = v with v of shape (1,) (a single
# element of y) passes the shape rule at the call, but NumPy rejects it ('setting an array element with a
# sequence'): eager and compiled fail later, when the write runs, instead of at the assignment
async def test_a_write_numpy_rejects_fails_at_the_call(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = x * 1
        y[0] = x[0:1]
        return y + 1

    with pytest.raises(ValueError):
        np.array([1.0, 2.0])[0] = np.array([1.0])  # NumPy, for reference
    x = engine.asarray(np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        engine.compile(fn)(x)
    with pytest.raises(ValueError):
        fn(x)


# Regression (a bug found while building issue 3, now fixed): when an in-place write fails as it runs, eager
# Tensors computed from that memory afterwards still run, on the unwritten data, and succeed; the compiled
# call fails as a whole, as sequential NumPy would
async def test_eager_and_compiled_agree_when_a_write_fails(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = x * 1
        y[0] = "not a number"  # NumPy: ValueError; here only when the write runs
        return y + 1

    async def outcome(call: Any) -> Any:
        try:
            return ("value", (await within(call())).tobytes())
        except Exception as e:
            return ("error", type(e).__name__)

    x = engine.asarray(np.array([1.0, 2.0]))
    compiled = await outcome(lambda: engine.compile(fn)(x))
    assert compiled == ("error", "ValueError")
    assert await outcome(lambda: fn(x)) == compiled


async def test_captured_arrays_are_snapshotted_at_trace_time(engine: ss.Engine) -> None:
    w = W1.copy()
    t = engine.asarray(np.ones(4))
    await t
    c = engine.compile(lambda x: x @ w + t)
    want = X @ W1 + 1
    assert_same_bits(await c(X), want)
    w[...] = 100.0
    assert_same_bits(await c(X), want)  # the replay uses the copy taken when tracing
    assert stats(c)[:2] == (1, 2)


def constant_arrays(c: ss.Compiled) -> list[np.ndarray]:
    """The distinct constant arrays (by identity) held by every cached signature's graph."""
    held = {id(n.value): n.value for g in c.graphs for n in g.nodes if n.op == "const"}
    return list(held.values())


# Regression (issue 15, item 12): every signature's trace copied the captured weights again, so 32 batch
# sizes held 32 copies of them (+74 MiB for 2.3 MiB of weights)
async def test_captured_constants_are_held_once_for_all_signatures(engine: ss.Engine) -> None:
    w2_again = W2.copy()  # another object with the same bytes: shared too

    def fn(x: Any) -> Any:
        return np.maximum(x @ W1 + B1, 0) @ W2 + B2 + (x @ W1 @ w2_again) * 0

    c = engine.compile(fn, max_signatures=32)
    for n in range(1, 33):
        x = np.linspace(-1, 1, n * 3).reshape(n, 3)
        assert_same_bits(await c(x), fn(x))
    assert stats(c)[:3] == (32, 32, 32)
    held = constant_arrays(c)
    assert len(held) == 4  # W1, B1, W2 (twice captured), B2: not 32 copies of each
    assert sum(a.nbytes for a in held) == W1.nbytes + B1.nbytes + W2.nbytes + B2.nbytes
    assert all(not a.flags.writeable for a in held)


async def test_folded_constants_are_shared_and_distinct_bytes_stay_apart(engine: ss.Engine) -> None:
    zeros, negative_zeros = np.zeros(3), -np.zeros(3)  # equal values, different bytes

    def fn(x: Any) -> Any:
        return (x + zeros) * W1.T.sum(axis=0)[:3] + negative_zeros + W1[0, :3].astype(np.float32)

    c = engine.compile(fn)
    for n in (1, 2, 3):
        assert_same_bits(await c(np.ones((n, 3))), fn(np.ones((n, 3))))
    held = constant_arrays(c)
    assert len(held) == 4  # zeros, -zeros, and the two folded results, once each
    held_bytes = [a.tobytes() for a in held]
    assert zeros.tobytes() in held_bytes and negative_zeros.tobytes() in held_bytes


async def test_a_capture_changed_between_traces_is_a_new_constant(engine: ss.Engine) -> None:
    w = W1.copy()
    c = engine.compile(lambda x: x @ w)
    assert_same_bits(await c(X), X @ W1)
    w[...] = 2.0  # the next signature's trace takes the array as it is now; the first keeps its copy
    assert_same_bits(await c(X[:1]), X[:1] @ w)
    assert_same_bits(await c(X), X @ W1)
    assert len(constant_arrays(c)) == 2


async def test_tuple_list_and_single_element_outputs(engine: ss.Engine) -> None:
    def as_tuple(x: Any) -> Any:
        return x + 1, x * 2

    def as_list(x: Any) -> Any:
        return [x - 1, np.exp(x), x.sum()]

    def one(x: Any) -> Any:
        return (x + 1,)

    x = engine.asarray(X)
    for fn, kind, n in ((as_tuple, tuple, 2), (as_list, list, 3), (one, tuple, 1)):
        c = engine.compile(fn)
        for _ in range(2):
            out = c(x)
            assert type(out) is kind and len(out) == n
            await assert_matches_eager(fn, c, x)


async def test_outputs_that_are_inputs_views_or_constants(engine: ss.Engine) -> None:
    def fn(x: Any, y: Any) -> Any:
        return x, y[::-1], engine.asarray(W2), x.T @ y

    c = engine.compile(fn)
    x, y = engine.asarray(X), engine.asarray(X[:, :2] + 1)
    await assert_matches_eager(fn, c, x, y)
    got = await values(c(x, y))
    assert got[0] is await x  # the argument itself, as eagerly
    got[2][...] = 0  # a constant output is a copy: writing it leaves the graph's constant alone
    assert_same_bits((await values(c(x, y)))[2], W2)


async def test_identity_function(engine: ss.Engine) -> None:
    c = engine.compile(lambda x: x)
    x = engine.asarray(X)
    before = submitted(engine)
    out = c(x)
    assert submitted(engine) - before == 1
    assert_same_bits(await out, X)
    a = np.arange(4)
    assert_same_bits(await c(a), a)
    assert c.graph.report["kept"] == 0


async def test_writing_an_identity_output_orders_with_the_argument(engine: ss.Engine) -> None:
    """The output is the argument's memory, as eagerly: a write to it is seen by a later read of x."""
    c = engine.compile(lambda x: x)
    x = engine.asarray(np.zeros(3))
    y = c(x)
    y += 1
    assert_same_bits(await x, np.ones(3))


async def test_ndarray_arguments(engine: ss.Engine) -> None:
    def fn(x: Any, y: Any) -> Any:
        return np.where(x > 0, x, y) @ np.ones((3, 2))

    c = engine.compile(fn)
    a, b = X.copy(), -X
    out = c(a, b)
    assert isinstance(out, ss.Tensor)
    assert_same_bits(await out, np.where(X > 0, X, -X) @ np.ones((3, 2)))
    assert_same_bits(await c(engine.asarray(a), b), np.where(X > 0, X, -X) @ np.ones((3, 2)))
    assert_same_bits(a, X)
    assert stats(c)[:2] == (1, 2)


async def test_keyword_arguments(engine: ss.Engine) -> None:
    def fn(x: Any, *, bias: Any, scale: float = 1.0) -> Any:
        return x * scale + bias

    c = engine.compile(fn)
    x, b = engine.asarray(X), engine.asarray(B1[:3])
    assert_same_bits(await c(x, bias=b), X * 1.0 + B1[:3])
    assert_same_bits(await c(x, bias=B1[:3] * 2), X * 1.0 + B1[:3] * 2)  # same signature
    assert stats(c)[:2] == (1, 2)
    assert_same_bits(await c(x, bias=b, scale=3.0), X * 3.0 + B1[:3])
    assert_same_bits(await c(x, scale=3.0, bias=b), X * 3.0 + B1[:3])  # keyword order does not matter
    assert stats(c)[:2] == (2, 4)

    both = engine.compile(lambda a, b: a - b)
    assert_same_bits(await both(a=X, b=X * 2), X - X * 2)
    assert_same_bits(await both(b=X * 2, a=X), X - X * 2)
    assert_same_bits(await both(X, b=X * 2), X - X * 2)  # positional: another signature
    assert stats(both)[:2] == (2, 3)


async def test_pending_tensor_arguments_and_chained_calls(engine: ss.Engine) -> None:
    """Arguments may still be computing (tracing needs only their shapes); outputs feed further calls."""
    c = engine.compile(lambda x: np.exp(x) - 1)
    async with occupied(engine, 2):
        pending = engine.asarray(X) * 2  # cannot run while both workers are held
        first = c(pending)
        second = c(first)  # the output of one call, not computed yet, as the argument of the next
        assert first.shape == second.shape == (2, 3)
    assert_same_bits(await within(second), np.exp(np.exp(X * 2) - 1) - 1)
    assert stats(c)[:2] == (1, 2)


async def test_compiled_inside_compiled_traces_through(engine: ss.Engine) -> None:
    inner = engine.compile(lambda a: np.exp(a) + 1, name="inner")

    def outer_fn(a: Any) -> Any:
        return inner(a) * inner(a * 2)

    outer = engine.compile(outer_fn, name="outer")
    x = engine.asarray(X)
    want = (np.exp(X) + 1) * (np.exp(X * 2) + 1)
    before = submitted(engine)
    assert_same_bits(await outer(x), want)
    assert submitted(engine) - before == 1
    assert stats(inner) == (0, 0, 0, 0)  # traced into, never called on its own
    text = str(outer.graph)
    assert text.count("exp(") == 2 and "compiled" not in text
    assert_same_bits(await inner(x), np.exp(X) + 1)  # still usable on its own
    assert stats(inner)[:2] == (1, 1)


# -- what cannot be compiled -------------------------------------------------------------------------------

PENDING_GLOBAL: list[Any] = []


def _await_inside(x: Any) -> Any:
    async def body() -> Any:
        return await x

    body().send(None)
    return x


CANNOT = {
    "if": (lambda x: x if x.sum() > 0 else -x, r"bool\(\).*control flow"),
    "float": (lambda x: x * float(x.sum()), r"float\(\).*needs its value"),
    "int": (lambda x: x * int(x.max()), r"int\(\).*needs its value"),
    "item": (lambda x: x * x.sum().item(), r"item\(\).*needs its value"),
    "asarray": (lambda x: np.asarray(x) + 1, r"np.asarray\(\).*needs its value"),
    "index": (lambda x: x[: x.argmax()], r"index\(\).*needs its value"),
    "print": (lambda x: (print(x), x)[1], r"print\(\)/str\(\).*side effect"),
    "str": (lambda x: (str(x), x)[1], r"print\(\)/str\(\)"),
    "f-string": (lambda x: (f"x={x}", x)[1], r"print\(\)/str\(\)"),
    "await": (_await_inside, r"'await' inside a compiled function"),
    "x += 1": (lambda x: x.__iadd__(1), r"in-place add on an argument"),
    "x[0] = 1": (lambda x: x.__setitem__(0, 1), r"in-place setitem on an argument"),
    "out=x": (lambda x: np.exp(x, out=x), r"in-place exp on an argument"),
    "view of x *= 2": (lambda x: x[:, :1].__imul__(2), r"in-place multiply on an argument"),
    "out=ndarray": (lambda x: np.add(x, 1, out=np.zeros(X.shape)), r"writes ndarray memory from outside"),
    "global": (lambda x: (PENDING_GLOBAL.append(x * 2), x + 1)[1], r"outlived the trace"),
    "returns int": (lambda x: 3, r"must return a tensor .*got int"),
    "returns None": (lambda x: None, r"must return a tensor .*got NoneType"),
    "returns a tuple with an int": (lambda x: (x + 1, 3), r"must return a tensor .*got int as item 1"),
    "returns a nested list": (
        lambda x: [[x + 1]],
        r"flat tuple or list of tensors.*got list as item 0 of the returned list: nested containers",
    ),
    "returns a dict in a tuple": (lambda x: (x, {"y": x}), r"flat tuple or list.*got dict as item 1"),
}


@pytest.mark.parametrize("case", list(CANNOT))
async def test_cannot_compile(engine: ss.Engine, case: str) -> None:
    fn, message = CANNOT[case]
    c = engine.compile(fn)
    x = engine.asarray(X)
    try:
        with pytest.raises(ss.TraceError, match=message) as info:
            c(x)
    finally:
        PENDING_GLOBAL.clear()
    assert isinstance(info.value, ss.SchedsvcError) and isinstance(info.value, TypeError)
    assert stats(c) == (0, 0, 0, 0)
    s = engine.stats()
    assert (s.compile_traces, s.compile_replays) == (0, 0)
    # the failed trace left nothing behind: Tensor code runs eagerly again, the argument is intact
    assert_same_bits(await (x + 1), X + 1)


async def test_submit_inside_raises(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        engine.submit_nowait(np.sum, x)
        return x + 1

    with pytest.raises(ss.TraceError, match=r"eng.submit\(sum, ...\) inside a compiled function"):
        engine.compile(fn)(engine.asarray(X))


# Regression (a bug found while building issue 3, now fixed): eng.submit was a coroutine function, so
# eng.submit(...) inside a compiled function never ran its check: the trace succeeded silently (and a
# coroutine was never awaited), or the error said the tensor 'outlived the trace' instead of naming submit
async def test_async_submit_inside_raises(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        engine.submit(np.sum, x)  # a synchronous function cannot await it
        return x + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ss.TraceError) as info:
            engine.compile(fn)(X)
        message = str(info.value)
        del info
        gc.collect()
    assert "submit" in message, message
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


async def test_writes_to_captured_arrays_raise(engine: ss.Engine) -> None:
    w = engine.asarray(W1[0].copy())

    def whole(x: Any) -> Any:
        w[...] = x[0, 0]
        return x

    def view(x: Any) -> Any:
        v = w[1:]
        v += 1
        return x

    with pytest.raises(ss.TraceError, match="writes Tensor memory from outside the compiled function"):
        engine.compile(whole)(X)
    with pytest.raises(ss.TraceError, match="in-place add on a captured array"):
        engine.compile(view)(X)
    assert_same_bits(await w, W1[0])


async def test_a_pending_tensor_captured_raises(engine: ss.Engine) -> None:
    async with occupied(engine, 2):
        pending = engine.ones(3) * 2  # cannot run while both workers are held
        c = engine.compile(lambda x: x + pending)
        with pytest.raises(ss.TraceError, match=r"still being computed.*pass it as an argument"):
            c(np.ones(3))
    assert_same_bits(await within(pending), np.full(3, 2.0))
    assert_same_bits(await c(np.ones(3)), np.full(3, 3.0))  # done now: captured as a constant


async def test_a_stored_traced_tensor_cannot_be_used_later(engine: ss.Engine) -> None:
    kept: list[Any] = []

    def fn(x: Any) -> Any:
        kept.append(x * 2)
        return x + 1

    with pytest.raises(ss.TraceError, match="outlived the trace"):
        engine.compile(fn)(X)
    with pytest.raises(ss.TraceError, match="after its trace ended"):
        kept[0] + 1


async def test_repr_and_shape_queries_are_allowed(engine: ss.Engine) -> None:
    seen: list[str] = []

    def fn(x: Any) -> Any:
        seen.append(repr(x))
        n = len(x) * x.ndim * x.size * math.prod(x.shape) * np.ndim(x) * np.size(x)
        return x * n + x.T.shape[0]

    c = engine.compile(fn)
    assert_same_bits(await c(X), X * (2 * 2 * 6 * 6 * 2 * 6) + 3)
    assert seen == ["<traced %0: float64[2, 3]>"]


async def test_async_function_is_refused_cleanly(engine: ss.Engine) -> None:
    """An ``async def`` (where ``await`` would go) is refused, at compile or at the call, with a message
    that says so, and leaves no never-awaited coroutine behind."""

    async def fn(x: Any) -> Any:
        return x + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match="async") as info:  # ss.TraceError is a TypeError too
            engine.compile(fn)(X)
        del info
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


# -- outputs that share memory, written after the call -----------------------------------------------------


# Regression (a bug at f160ac0): CSE merges two equal outputs into one array, so writing one output changes
# the other (eagerly they are separate arrays)
async def test_equal_outputs_are_separate_arrays(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        return x * 2, x * 2

    c = engine.compile(fn)
    x = engine.asarray(np.array([1.0, 2.0]))
    a, b = c(x)
    a += 1
    await a
    assert_same_bits(await b, np.array([2.0, 4.0]))


# Regression (a bug at f160ac0): outputs of one call that share memory (y and a view of y) get separate
# memory keys, so 'await b' does not wait for a queued write through 'a' (eagerly it does)
async def test_outputs_sharing_memory_order_writes(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        y = x * 2
        return y, y[0:1]

    c = engine.compile(fn)
    a, b = c(engine.asarray(np.array([1.0, 2.0])))
    await a
    await b

    async def read_b() -> Any:
        return np.array(await b, copy=True)

    async with occupied(engine, 2):
        a += 100  # queued: both workers are held
        reader = asyncio.ensure_future(read_b())
        for _ in range(20):
            await asyncio.sleep(0)
    assert_same_bits(await within(reader), np.array([102.0]))


# Regression (found by the property test while building issue 3): CSE merged a repeated expression but a view
# of the dropped copy kept pointing at it, so the memory plan reused the kept copy while the view still read it
async def test_view_of_a_merged_expression_keeps_its_memory(engine: ss.Engine) -> None:
    def fn(x: Any) -> Any:
        p5 = -(x + 2 + 2 + 2) + 2
        p6 = p5 + 2  # noqa: F841 -- the first copy: dead, but CSE keeps it and merges the second into it
        p7 = p5 + 2
        view = p7[-1:]  # taken before the last op on p7, whose memory that op may then reuse
        return -p7, view

    c = engine.compile(fn)
    x = engine.asarray(np.array([-2.0]))
    got, want = await values(c(x)), await values(fn(x))
    for g, w in zip(got, want, strict=True):
        assert_same_bits(g, w)  # the view is +0.0, not the -0.0 the second negation wrote


# -- admission: a compiled call is a task within the engine's limits ---------------------------------------


async def test_compiled_submit_waits_for_room_and_never_exceeds_max_pending() -> None:
    limit = 8
    async with ss.Engine(cpu_workers=2, max_pending=limit) as eng:
        mlp = eng.compile(lambda x: np.maximum(x @ W1 + B1, 0) @ W2 + B2)
        x = eng.asarray(X)
        peak = 0

        async def call() -> Any:
            nonlocal peak
            out = await mlp.submit(x)
            peak = max(peak, eng.stats().pending)
            return out

        async with occupied(eng, 2):
            calls = [asyncio.create_task(call()) for _ in range(50)]
            await state(eng, lambda: eng.stats().waiting_admission == 50 - (limit - 2))
            assert eng.stats().pending == limit
        outputs = await within(asyncio.gather(*calls))
        want = np.maximum(X @ W1 + B1, 0) @ W2 + B2
        for out in outputs:
            assert_same_bits(await within(out), want)
        assert peak <= limit
        assert mlp.stats()["traces"] == 1 and mlp.stats()["replays"] == 50


async def test_compiled_submit_queues_behind_earlier_submissions() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        order: list[str] = []
        mlp = eng.compile(lambda x: x + 1)
        x = eng.asarray(X)
        async with occupied(eng, 1):
            first = asyncio.create_task(eng.submit(order.append, "submitted first"))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            second = asyncio.create_task(mlp.submit(x))
            await state(eng, lambda: eng.stats().waiting_admission == 2)
        await within(await within(first))
        out = await within(second)
        assert order == ["submitted first"]
        assert_same_bits(await within(out), X + 1)


async def test_the_first_compiled_call_at_the_limits_traces_then_raises_queue_full() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        mlp = eng.compile(lambda x: x * 2)
        x = eng.asarray(X)
        async with occupied(eng, 1):
            with pytest.raises(ss.QueueFull):
                mlp(x)
            assert stats(mlp) == (1, 0, 1, 0)
        await within(eng.waitall())
        assert_same_bits(await within(mlp(x)), X * 2)  # room again: the traced graph replays


async def test_cancelling_a_waiting_compiled_submit_cancels_the_call() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        mlp = eng.compile(lambda x: x - 1)
        x = eng.asarray(X)
        async with occupied(eng, 1):
            waiter = asyncio.create_task(mlp.submit(x))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await within(waiter)
            assert eng.stats().waiting_admission == 0
        await within(eng.waitall())
        stats = eng.stats()  # the call was never admitted: neither submitted nor cancelled
        assert (stats.submitted, stats.completed, stats.cancelled) == (1, 1, 0)


async def test_compiled_submit_of_several_outputs_gives_them_after_admission() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        split = eng.compile(lambda x: (x + 1, x.sum()))
        x = eng.asarray(X)
        async with occupied(eng, 1):
            waiter = asyncio.create_task(split.submit(x))
            await state(eng, lambda: eng.stats().waiting_admission == 1)
        a, b = await within(waiter)
        assert_same_bits(await within(a), X + 1)
        assert_same_bits(await within(b), X.sum())


@pytest.mark.parametrize("limit", [2, 4])
async def test_compiled_calls_of_several_outputs_stay_within_max_pending(limit: int) -> None:
    """A call is one task within the limits however many outputs it has: they ride on its slot."""
    async with ss.Engine(cpu_workers=2, max_pending=limit) as eng:
        split = eng.compile(lambda x: tuple(x + i for i in range(8)))
        x = eng.asarray(X)
        seen: list[int] = []

        async def producer() -> list[Any]:
            calls = []
            for _ in range(10):
                calls.append(await split.submit(x))
                seen.append(eng.stats().pending)
            return calls

        results = await within(asyncio.gather(*(producer() for _ in range(4))))
        assert max(seen) <= limit
        for calls in results:
            for parts in calls:
                for i, part in enumerate(parts):
                    assert_same_bits(await within(part), X + i)


async def test_a_call_of_several_outputs_takes_one_slot() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=2) as eng:
        split = eng.compile(lambda x: (x + 1, x * 2, x.sum()))
        x = eng.asarray(X)
        await within(split.submit(x))  # traced
        await within(eng.waitall())
        async with occupied(eng, 1):
            a, b, c = split(x)
            assert eng.stats().pending == 2 and not eng.has_room()
            assert eng.stats().pending_bytes == X.nbytes + (2 * X.nbytes + 8)  # its input, its outputs once
            with pytest.raises(ss.QueueFull):
                split(x)
        assert_same_bits(await within(a), X + 1)
        assert_same_bits(await within(b), X * 2)
        assert_same_bits(await within(c), X.sum())
        await within(eng.waitall())
        assert eng.stats().pending == 0


async def test_a_compiled_call_inside_a_running_task_is_admitted_over_the_limits() -> None:
    async with ss.Engine(cpu_workers=1, max_pending=1) as eng:
        mlp = eng.compile(lambda x: x + 2)
        x = eng.asarray(X)
        await within(mlp(x))  # traced on the loop
        inner = await within(eng.submit(lambda: mlp(x)))  # the engine is at its limit while it runs
        assert_same_bits(await within(await within(inner)), X + 2)


async def test_a_traced_tensor_held_only_by_garbage_is_not_a_leak(engine: ss.Engine) -> None:
    """Found on Python 3.12 (the H100 machine's): a function that caught an exception raised through a
    @contextmanager and returned its input failed with 'outlived the trace'. The exception's frames are a
    cycle that holds the input until a collection; the leak check collected, but its first look had bound
    the symbol to a name (a walrus in a comprehension binds in the enclosing scope) that kept it alive."""

    def returns_input_held_by_a_cycle(x: Any) -> Any:
        cycle: list[Any] = [x]
        cycle.append(cycle)  # garbage once the function returns, freed only by a collection
        return x

    compiled = engine.compile(returns_input_held_by_a_cycle)
    gc.disable()  # the cycle must still be there when the trace checks for leaks
    try:
        out = compiled(engine.asarray(np.arange(3.0)))
    finally:
        gc.enable()
    assert_same_bits(await within(out), np.arange(3.0))
