"""``Compiled.save`` / ``ss.load``: JSON with ops by registry name and constants inline, replayed without
the Python source, bit for bit; and what a file that is not such JSON gives."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

import schedsvc as ss
from schedsvc.tensor import OPS

from ..helpers import within
from .helpers import assert_same_bits, values

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((5, 8))
B1 = RNG.standard_normal(8)
W2 = RNG.standard_normal((8, 3))
B2 = RNG.standard_normal(3)


def batch(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 5))


def mlp(x: Any) -> Any:
    hidden_activation_marker = np.maximum(x @ W1 + B1, 0)
    return hidden_activation_marker @ W2 + B2


async def roundtrip(engine: ss.Engine, c: ss.Compiled, path: Path, *calls: tuple[Any, ...]) -> ss.Compiled:
    """Save ``c`` (already called), load it, and check every call gives the same bits on both."""
    c.save(path)
    loaded = ss.load(path, engine)
    for args in calls:
        want = await values(c(*args))
        got = await values(loaded(*args))
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_bits(g, w, f"output {i} of {args!r}")
    return loaded


def signature_count(c: ss.Compiled) -> int:
    return c.stats()["signatures"]


# -- round trips ----------------------------------------------------------------------------------------


async def test_mlp_with_captured_weights_roundtrips(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(4, 0))
    path = tmp_path / "mlp.json"
    c.save(path)
    loaded = ss.load(path, engine)
    assert isinstance(loaded, ss.Compiled)
    for seed in (1, 2):  # new values of the saved signature
        x = engine.asarray(batch(4, seed))
        want = await c(x)
        before = engine.stats().submitted
        out = loaded(x)
        assert engine.stats().submitted - before == 1
        assert out.shape == (4, 3) and out.dtype == np.float64
        assert_same_bits(await within(out), want)
        assert_same_bits(await within(out), np.maximum(batch(4, seed) @ W1 + B1, 0) @ W2 + B2)
    assert loaded.stats() == {"traces": 0, "replays": 2, "signatures": 1, "evictions": 0}
    assert engine.stats().compile_traces == 1


async def test_loaded_on_another_engine(tmp_path: Path) -> None:
    path = tmp_path / "mlp.json"
    async with ss.Engine(cpu_workers=1) as first:
        c = first.compile(mlp)
        want = await c(batch(2, 3))
        c.save(path)
    async with ss.Engine(cpu_workers=2) as second:
        loaded = ss.load(str(path), second)
        assert_same_bits(await loaded(batch(2, 3)), want)
        assert second.stats().compile_replays == 1


async def test_every_cached_signature_is_saved(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(lambda x, k: x * k + x.sum(axis=-1, keepdims=True))
    calls = [(np.ones(3), 2), (np.ones((2, 3)), 2), (np.ones(3, np.float32), 2), (np.ones(3), 5)]
    for args in calls:
        await c(*args)
    loaded = await roundtrip(engine, c, tmp_path / "sigs.json", *calls)
    assert signature_count(loaded) == 4
    assert len(loaded.graphs) == 4
    assert [str(g) for g in loaded.graphs] == [str(g) for g in c.graphs]


async def test_loaded_signatures_share_their_constants(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    calls = [(batch(n, n),) for n in (1, 2, 3, 4)]
    for args in calls:
        await c(*args)
    loaded = await roundtrip(engine, c, tmp_path / "batches.json", *calls)
    held = {id(n.value) for g in loaded.graphs for n in g.nodes if n.op == "const"}
    assert len(held) == 4  # W1, B1, W2, B2 once, not once per saved signature


async def test_indexing_dtypes_scalars_and_outputs_roundtrip(engine: ss.Engine, tmp_path: Path) -> None:
    def fn(x: Any, y: Any) -> Any:
        a = x[None, ..., ::-2][0, 1:, None] * np.float32(1.5)  # slices, Ellipsis, None, a float32 scalar
        b = (y.astype(np.complex64) * (2 - 0.5j)).T  # complex scalar, dtype attr
        c = np.add(x, 1, dtype=np.float32).sum(axis=(0, 1), dtype=np.float64, keepdims=True)
        d = np.clip(x, -np.inf, 0.25) + np.int64(3) - True
        e = np.where(x > 0, x, float("nan")).max(axis=0)
        f = x.reshape(-1)[2:5].copy()
        f += 1
        f[...] = f * 2
        f[0] = -0.0
        return [a, b, c, d, e, f, x.argmin(axis=1)]

    c = engine.compile(fn)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    y = np.arange(6, dtype=np.int64).reshape(2, 3)
    await values(c(x, y))
    loaded = await roundtrip(engine, c, tmp_path / "index.json", (x, y), (x[::-1].copy(), y * 3))
    out = loaded(x, y)
    assert type(out) is list and len(out) == 7
    assert [t.dtype for t in out] == [
        np.float32,
        np.complex64,
        np.float64,
        np.float64,  # float32 + np.int64(3): a typed scalar promotes (NEP 50)
        np.float32,
        np.float32,
        np.int64,
    ]
    await values(out)


async def test_tuple_output_and_static_arguments_roundtrip(engine: ss.Engine, tmp_path: Path) -> None:
    def fn(x: Any, mode: str, axes: tuple[int, ...], scale: complex) -> Any:
        s = x.sum(axis=axes) if mode == "sum" else x.max(axis=axes)
        return s * scale, x

    c = engine.compile(fn)
    calls = [(np.ones((2, 3)), "sum", (0,), 1 + 2j), (np.ones((2, 3)), "max", (0, 1), 0.5 + 0j)]
    for args in calls:
        await values(c(*args))
    loaded = await roundtrip(engine, c, tmp_path / "static.json", *calls)
    out = loaded(*calls[0])
    assert type(out) is tuple and len(out) == 2
    await values(out)


async def test_constants_and_folded_outputs_roundtrip(engine: ss.Engine, tmp_path: Path) -> None:
    def fn(x: Any) -> Any:
        ones = engine.ones((3,), np.float32)
        return x + ones * 2, engine.asarray(W2), engine.arange(4) * 3

    c = engine.compile(fn)
    await values(c(np.ones(3, np.float32)))
    loaded = await roundtrip(engine, c, tmp_path / "consts.json", (np.ones(3, np.float32),))
    got = await values(loaded(np.zeros(3, np.float32)))
    got[1][...] = 0  # a constant output is a copy: the loaded graph's constant stays as saved
    assert_same_bits((await values(loaded(np.zeros(3, np.float32))))[1], W2)


async def test_saving_a_loaded_function_gives_the_same_file(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(3, 0))
    c.save(tmp_path / "a.json")
    ss.load(tmp_path / "a.json", engine).save(tmp_path / "b.json")
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


# -- the file -------------------------------------------------------------------------------------------


async def test_file_is_json_with_registry_ops_and_inline_constants(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(4, 0))
    path = tmp_path / "mlp.json"
    c.save(path)
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert doc["format"] == "schedsvc-compiled" and doc["version"] == 1 and doc["name"] == "mlp"
    text = raw.decode("utf-8")
    assert "pickle" not in text and "hidden_activation_marker" not in text and "lambda" not in text
    assert b"\x80\x04" not in raw and b"\x80\x05" not in raw  # no pickle protocol header, even encoded
    (entry,) = doc["entries"]
    nodes = entry["graph"]["nodes"]
    assert {n["op"] for n in nodes} <= set(OPS) | {"input", "const", "dead"}
    assert {n["op"] for n in nodes} >= {"input", "const", "matmul", "add", "maximum"}
    consts = [n["value"]["array"] for n in nodes if n["op"] == "const"]
    decoded = [
        np.frombuffer(base64.b64decode(a["data"]), dtype=a["dtype"]).reshape(a["shape"]) for a in consts
    ]
    assert any(np.array_equal(d, W1) for d in decoded)
    assert any(np.array_equal(d, B2) for d in decoded)


async def test_loaded_repr_and_graph(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(4, 0))
    c.save(tmp_path / "mlp.json")
    loaded = ss.load(tmp_path / "mlp.json", engine)
    assert repr(loaded) == "<Compiled mlp (loaded) signatures=1 traces=0 replays=0>"
    assert str(loaded.graph) == str(c.graph)
    assert loaded.graph.report == c.graph.report
    assert "matmul(" in str(loaded.graph)


async def test_save_before_any_call_raises(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    with pytest.raises(ss.SchedsvcError, match="no traced signature to save"):
        c.save(tmp_path / "never.json")
    assert not (tmp_path / "never.json").exists()


async def test_unsaved_signature_raises_with_the_saved_ones(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(4, 0))
    c.save(tmp_path / "mlp.json")
    loaded = ss.load(tmp_path / "mlp.json", engine)
    with pytest.raises(ss.TraceError, match=r"(?s)without its Python source.*\(4, 5\).*\(2, 5\)") as info:
        loaded(batch(2, 0))
    assert isinstance(info.value, TypeError)
    with pytest.raises(ss.TraceError, match="without its Python source"):
        loaded(batch(4, 0).astype(np.float32))
    assert loaded.stats()["replays"] == 0
    assert_same_bits(await loaded(batch(4, 1)), await c(batch(4, 1)))


async def test_loaded_function_cannot_be_traced_into_another(engine: ss.Engine, tmp_path: Path) -> None:
    c = engine.compile(mlp)
    await c(batch(4, 0))
    c.save(tmp_path / "mlp.json")
    loaded = ss.load(tmp_path / "mlp.json", engine)
    outer = engine.compile(lambda x: loaded(x) * 2)
    with pytest.raises(ss.TraceError, match="loaded without its source"):
        outer(batch(4, 0))


# -- files that are not a saved function --------------------------------------------------------------------


@pytest_asyncio.fixture
async def saved(engine: ss.Engine, tmp_path: Path) -> dict[str, Any]:
    c = engine.compile(lambda x: np.exp(x) + 1)
    await c(np.ones(2))
    c.save(tmp_path / "good.json")
    doc: dict[str, Any] = json.loads((tmp_path / "good.json").read_text())
    return doc


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


async def test_unknown_op_raises_value_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any]
) -> None:
    saved["entries"][0]["graph"]["nodes"][1]["op"] = "system"
    with pytest.raises(ValueError, match="op 'system'"):
        ss.load(write(tmp_path, saved), engine)


async def test_unknown_value_kind_raises_value_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any]
) -> None:
    saved["entries"][0]["graph"]["nodes"][2]["args"][1] = {"pickle": "gASVAAAAAAAAAAA="}
    with pytest.raises(ValueError, match="unknown value"):
        ss.load(write(tmp_path, saved), engine)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="something-else"), "not a saved schedsvc compiled function"),
        (lambda d: d.update(version=99), "format version 99"),
        (lambda d: d.clear(), "not a saved schedsvc compiled function"),
    ],
    ids=["format", "version", "empty"],
)
async def test_wrong_format_or_version_raises_value_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any], change: Any, message: str
) -> None:
    change(saved)
    with pytest.raises(ValueError, match=message):
        ss.load(write(tmp_path, saved), engine)


async def test_not_json_raises_value_error(engine: ss.Engine, tmp_path: Path) -> None:
    path = tmp_path / "trunc.json"
    path.write_text('{"format": "schedsvc-compiled", "vers')
    with pytest.raises(ValueError):
        ss.load(path, engine)
    with pytest.raises(ValueError, match="not a saved schedsvc compiled function"):
        ss.load(write(tmp_path, [1, 2, 3]), engine)


def nodes_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = doc["entries"][0]["graph"]["nodes"]  # input, exp, add
    return nodes


# Regression (issue 15, item 17): load trusted the shapes and dtypes in the file, so an edited output shape
# gave a Tensor that claimed (7, 7) while its value was (2,)
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: nodes_of(d)[2].update(shape=[7, 7]),
            r"node 2 \(add\) is float64\[7, 7\] in the file, but",
        ),
        (lambda d: nodes_of(d)[2].update(dtype="<f4"), r"node 2 \(add\) is float32\[2\] in the file, but"),
        (lambda d: nodes_of(d)[1].update(shape=[1]), r"node 1 \(exp\) is float64\[1\]"),
        (lambda d: nodes_of(d)[0].update(shape=[7, 7]), r"node 0 \(input\) is float64\[7, 7\]"),
        (
            lambda d: d["entries"][0]["signature"]["tuple"][0]["tuple"].__setitem__(2, {"tuple": [7]}),
            r"node 0 \(input\) is float64\[2\] in the file, but its operands give float64\[7\]",
        ),
        (lambda d: d["entries"][0]["graph"].update(reuse=[[2, 0]]), "cannot reuse node 0"),
        (lambda d: nodes_of(d)[1]["args"].__setitem__(0, {"ref": 2}), "reads node 2"),
    ],
    ids=["output-shape", "output-dtype", "intermediate-shape", "input-shape", "signature", "reuse", "order"],
)
async def test_a_file_whose_shapes_or_dtypes_disagree_is_refused(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any], change: Any, message: str
) -> None:
    change(saved)
    path = write(tmp_path, saved)
    with pytest.raises(ss.LoadError, match=message) as caught:
        ss.load(path, engine)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ValueError)


# Regression (issue 15, item 17): a truncated or non-JSON file raised a raw JSONDecodeError, deep nesting a
# raw RecursionError, neither naming the file
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": "schedsvc-compiled", "vers', "not JSON"),
        ("graph mlp(%0: float64[4, 5])", "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
    ],
    ids=["truncated", "text", "deeply-nested", "binary"],
)
async def test_a_file_that_is_not_json_gives_load_error_naming_it(
    engine: ss.Engine, tmp_path: Path, content: str | bytes, message: str
) -> None:
    path = tmp_path / "broken.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ss.LoadError, match=message) as caught:
        ss.load(path, engine)
    assert repr(str(path)) in str(caught.value)


async def test_deeply_nested_values_in_a_saved_graph_give_load_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any]
) -> None:
    nested = '{"tuple": [' * 5000 + "1" + "]}" * 5000  # a tuple of a tuple of ... as an operand
    text = json.dumps(saved).replace('"args": [{"ref": 1}, 1]', f'"args": [{{"ref": 1}}, {nested}]')
    path = tmp_path / "nested.json"
    path.write_text(text)
    with pytest.raises(ss.LoadError, match="nests too deeply") as caught:
        ss.load(path, engine)
    assert repr(str(path)) in str(caught.value)


# Regression (a bug at f160ac0): a structurally corrupted file (missing key, dangling node reference, bad
# dtype) raises KeyError/IndexError/TypeError from deep inside load instead of a clear ValueError
@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["entries"][0]["graph"].pop("nodes"),
        lambda d: d["entries"][0]["graph"]["nodes"][2]["args"].__setitem__(0, {"ref": 99}),
        lambda d: d["entries"][0]["graph"]["nodes"][2].__setitem__("dtype", "not-a-dtype"),
    ],
    ids=["missing-key", "dangling-ref", "bad-dtype"],
)
async def test_corrupted_file_raises_value_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any], change: Any
) -> None:
    change(saved)
    with pytest.raises(ValueError):
        ss.load(write(tmp_path, saved), engine)


# -- a loaded file is untrusted: what it says about memory is derived again ------------------------------


async def traced(engine: ss.Engine, tmp_path: Path, fn: Any, x: np.ndarray) -> dict[str, Any]:
    """The saved document of ``fn`` compiled and called once on ``x``."""
    c = engine.compile(fn)
    await within(c(x))
    c.save(tmp_path / "traced.json")
    doc: dict[str, Any] = json.loads((tmp_path / "traced.json").read_text())
    return doc


def write_in_a_view(x: Any) -> Any:
    y = x * 1  # nodes: 0 input, 1 multiply, 2 getitem (a view of 1), 3 add writing 2
    v = y[0:2]
    v += 1
    return y


async def loaded_run_leaves_argument(engine: ss.Engine, path: Path, fn: Any) -> bool:
    """Load ``path``: False if the file is refused; else call it and check the result is ``fn``'s and the
    argument is untouched (True)."""
    try:
        loaded = ss.load(path, engine)
    except ss.LoadError:
        return False
    x = np.arange(4.0)
    result = await within(loaded(x))
    assert_same_bits(x, np.arange(4.0))  # the caller's array is never written
    assert_same_bits(result, fn(np.arange(4.0)))
    return True


async def test_a_reuse_onto_a_view_of_an_argument_is_refused(engine: ss.Engine, tmp_path: Path) -> None:
    doc = await traced(engine, tmp_path, lambda x: x[0:2] * 2, np.ones(4))
    doc["entries"][0]["graph"]["reuse"] = [[2, 1]]  # the product written into x[0:2]: the caller's array
    with pytest.raises(ss.LoadError, match="node 2 cannot reuse node 1's memory"):
        ss.load(write(tmp_path, doc), engine)


async def test_a_view_that_claims_memory_of_its_own_cannot_write_an_argument(
    engine: ss.Engine, tmp_path: Path
) -> None:
    doc = await traced(engine, tmp_path, write_in_a_view, np.ones(4))
    node = nodes_of(doc)[2]
    node["args"][0], node["base"] = {"ref": 0}, 2  # a view of the argument that says it owns its memory
    with pytest.raises(ss.LoadError, match="writes node 2, which is not memory the graph computed"):
        ss.load(write(tmp_path, doc), engine)


async def test_no_base_or_reuse_in_a_file_makes_a_replay_write_its_argument(
    engine: ss.Engine, tmp_path: Path
) -> None:
    """Every node's base set to every node, and every reuse pair: each file is refused, or its replay
    gives the function's result and leaves the argument as it was."""
    doc = await traced(engine, tmp_path, write_in_a_view, np.ones(4))
    n = len(nodes_of(doc))
    ran = 0
    for i in range(n):
        for base in range(n):
            edited = json.loads(json.dumps(doc))
            nodes_of(edited)[i]["base"] = base
            ran += await loaded_run_leaves_argument(engine, write(tmp_path, edited), write_in_a_view)
    for i in range(n):
        for j in range(n):
            edited = json.loads(json.dumps(doc))
            edited["entries"][0]["graph"]["reuse"] = [[i, j]]
            ran += await loaded_run_leaves_argument(engine, write(tmp_path, edited), write_in_a_view)
    assert ran >= n * n  # (the bases are derived again: every base edit loads and runs as traced)


def arange_node(stop: int, base: int) -> dict[str, Any]:
    return {
        "op": "arange",
        "args": [],
        "attrs": {"start": 0, "stop": stop, "step": 1},
        "shape": [stop],
        "dtype": "<i8",
        "base": base,
        "out": None,
        "value": None,
    }


async def test_nodes_the_outputs_do_not_need_never_run(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any]
) -> None:
    nodes_of(saved).append(arange_node(2**40, 3))  # 8 TiB nothing reads
    loaded = ss.load(write(tmp_path, saved), engine)
    assert_same_bits(await within(loaded(np.ones(2))), np.exp(np.ones(2)) + 1)


async def test_a_loaded_graph_s_intermediates_count_within_max_pending_bytes(tmp_path: Path) -> None:
    async with ss.Engine(cpu_workers=1, max_pending_bytes=1 << 20) as eng:
        doc = await traced(eng, tmp_path, lambda x: x.sum(), np.ones(4, dtype=np.int64))
        nodes = nodes_of(doc)  # input, sum of the input -> sum of an 8 TiB range
        nodes.insert(1, arange_node(2**40, 1))
        nodes[2]["args"] = [{"ref": 1}]
        nodes[2]["base"] = 2
        doc["entries"][0]["graph"]["outputs"] = [2]
        loaded = ss.load(write(tmp_path, doc), eng)
        with pytest.raises(ss.MemoryLimitError, match="max_pending_bytes"):
            loaded(np.ones(4, dtype=np.int64))
        assert eng.stats().pending == 0


async def test_an_attribute_named_out_gives_load_error(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any]
) -> None:
    nodes_of(saved)[2]["attrs"]["out"] = None
    with pytest.raises(ss.LoadError, match="attribute named 'out'"):
        ss.load(write(tmp_path, saved), engine)


# Regression (a bug at f160ac0): load() pastes graph fields (inputs, attribute names) from the file into
# generated Python source and exec()s it, so a crafted file runs arbitrary code despite 'JSON, no pickle'
@pytest.mark.parametrize("where", ["inputs", "attr-name"])
async def test_a_crafted_file_cannot_run_code(
    engine: ss.Engine, tmp_path: Path, saved: dict[str, Any], where: str
) -> None:
    marker = tmp_path / "ran"
    payload = f"open({str(marker)!r}, 'w').close()"
    graph = saved["entries"][0]["graph"]
    if where == "inputs":
        graph["inputs"] = [f"0={payload}"]
    else:
        graph["nodes"][2]["attrs"][f"casting={payload} or 'same_kind')#"] = None
    try:
        loaded = ss.load(write(tmp_path, saved), engine)
        await loaded(np.ones(2))
    except Exception:  # refusing the file is the fix
        pass
    assert not marker.exists(), "code from the file ran"


# Regression (a bug at f160ac0): save encodes NumPy float64/complex128 scalars (subclasses of float/complex)
# as plain JSON numbers, so after load they are Python scalars, weak under NEP 50, and float32 math stays
# float32
@pytest.mark.parametrize(
    "scalar", [np.float64(1.5), np.complex128(1.5 + 0.5j)], ids=["float64", "complex128"]
)
async def test_numpy_scalar_types_survive_save(engine: ss.Engine, tmp_path: Path, scalar: np.generic) -> None:
    c = engine.compile(lambda x: x * scalar)
    x = np.linspace(0, 1, 4, dtype=np.float32)
    await c(x)
    loaded = await roundtrip(engine, c, tmp_path / "scalar.json", (x,))
    out = loaded(x)
    assert_same_bits(await out, x * scalar)


# Regression (a bug at f160ac0): a folded 0-d float64 constant (e.g. captured_array.sum()) is saved as a
# plain JSON float, so after load it is a Python float: as an output, replay fails ('float' object has no
# attribute 'copy'); as an operand, it no longer promotes float32 to float64
@pytest.mark.parametrize("use", ["output", "operand"])
async def test_folded_scalar_constant_survives_save(engine: ss.Engine, tmp_path: Path, use: str) -> None:
    w = engine.asarray(W1)
    if use == "output":
        c = engine.compile(lambda x: (x + 1, w.sum()))
    else:
        c = engine.compile(lambda x: x * w.sum())
    x = np.linspace(0, 1, 4, dtype=np.float32)
    await values(c(x))
    await roundtrip(engine, c, tmp_path / "folded.json", (x,))
