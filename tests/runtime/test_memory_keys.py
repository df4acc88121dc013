"""Memory is keyed by its owner, however a view reaches it; reads=/writes= take only memory; fn is sync.

Issue 15 items 1-3 and 16: each engine test here gave the wrong answer (or the wrong error) before the fix.
A writer is held by a gate while a reader of the same memory, reached another way, is submitted; a
``probe`` then shows whether the reader was (wrongly) let run before the write.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided, sliding_window_view

import schedsvc as ss
from schedsvc._runtime import buffer_of, exports_memory, memory_of, scan

from ..helpers import Gate, probe, within

# -- keys: a view's key is its owner's ---------------------------------------------------------------

#: ways to make a view of a 1-d float64 array of even length >= 4 (each keeps it 1-d or makes it n-d)
VIEWS: dict[str, Callable[[np.ndarray], Any]] = {
    "slice": lambda a: a[1:-1],
    "step": lambda a: a[::2],
    "reshape": lambda a: a.reshape(2, -1),
    "transpose": lambda a: a.reshape(2, -1).T,
    "ravel": lambda a: a.ravel(),
    "view dtype": lambda a: a.view(np.int64),
    "sliding_window_view": lambda a: sliding_window_view(a, 2),
    "as_strided": lambda a: as_strided(a, (a.shape[0] // 2,), (a.strides[0] * 2,)),
    "asarray(memoryview)": lambda a: np.asarray(memoryview(a)),
    "frombuffer": lambda a: np.frombuffer(a, dtype=a.dtype),
    "memoryview": lambda a: memoryview(a),
    "memoryview slice": lambda a: memoryview(a)[1:],
    "asarray(memoryview slice)": lambda a: np.asarray(memoryview(a)[2:]),
}


def key(obj: Any) -> int:
    return buffer_of(obj)[0] if isinstance(obj, np.ndarray) else memory_of(obj)[0]


def chain(base: np.ndarray, names: list[str]) -> Any:
    """Apply view constructions one after another, while the result is still a 1-d contiguous array."""
    view: Any = base
    for name in names:
        if not (
            isinstance(view, np.ndarray) and view.ndim == 1 and view.flags.c_contiguous and view.size >= 4
        ):
            break
        if view.size % 2:
            view = view[:-1]
        view = VIEWS[name](view)
    return view


@given(st.lists(st.sampled_from(sorted(VIEWS)), min_size=1, max_size=4), st.sampled_from(["numpy", "bytes"]))
@settings(max_examples=200, deadline=None)
def test_any_chain_of_views_is_keyed_by_the_memory_it_views(names: list[str], owner: str) -> None:
    if owner == "numpy":
        base = np.zeros(64)
        owner_key = buffer_of(base)[0]
    else:  # memory owned by a bytearray, seen as an array
        raw = bytearray(64 * 8)
        base = np.frombuffer(raw)
        owner_key = id(raw)
    view = chain(base, names)
    assert key(view) == owner_key
    assert key(view) != buffer_of(np.zeros(64))[0]  # other memory is other memory


def test_ctypes_memory_is_keyed_by_its_owner_or_its_address() -> None:
    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_double * 4), ("b", ctypes.c_int))

    pair = Pair()
    assert key(pair.a) == key(pair) == id(pair)  # a field is part of its structure
    owned = (ctypes.c_double * 4)()
    assert key(np.ctypeslib.as_array(owned)) == id(owned)
    pointer = ctypes.cast(owned, ctypes.POINTER(ctypes.c_double))
    one, two = np.ctypeslib.as_array(pointer, (4,)), np.ctypeslib.as_array(pointer, (4,))
    assert key(one) == key(two) == ctypes.addressof(owned)  # no owner behind a pointer: its address


def test_ctypes_from_buffer_is_keyed_by_the_buffer_it_was_made_over() -> None:
    """Review: ``from_buffer(x)`` keeps x only in its ``_objects``: it was keyed by its address, apart from x."""
    x = np.zeros(8)
    raw = bytearray(64)
    assert key((ctypes.c_double * 8).from_buffer(x)) == key(x)
    assert key(np.ctypeslib.as_array((ctypes.c_double * 8).from_buffer(x))) == key(x)
    assert key((ctypes.c_double * 8).from_buffer(raw)) == id(raw)


def test_numpy_scalars_are_values_not_memory() -> None:
    """Review: a NumPy scalar exports a buffer, so each scalar argument became a hazard entry (and 1.5 us)."""
    a = np.ones(3)
    assert scan((a, np.float64(2.0), np.int32(3), np.bool_(True)), {}, (), ()) == (
        (),
        ((buffer_of(a)[0], a.nbytes, False),),
    )


def test_bytes_are_read_memory_of_their_size() -> None:
    """Regression: bytes were taken for a scalar, so their size never counted in max_pending_bytes."""
    data, other = b"x" * 100, b"y" * 7
    assert scan((data,), {}, (), ()) == ((), ((id(data), 100, False),))
    assert scan((data, other, data), {}, (), ()) == ((), ((id(data), 100, False), (id(other), 7, False)))
    assert scan(([data],), {"out": data}, (), ()) == ((), ((id(data), 100, False),))  # immutable: a read


def test_an_exporter_that_cannot_export_now_does_not_decide_for_its_type() -> None:
    """Review: a closed mmap seen first made every mmap 'not memory' from then on."""
    closed = mmap.mmap(-1, 16)
    closed.close()
    assert not exports_memory(closed)
    assert exports_memory(mmap.mmap(-1, 16))


def test_scan_reads_a_memoryview_argument_as_its_owner() -> None:
    a = np.zeros(8)
    deps, buffers = scan((memoryview(a), sliding_window_view(a, 2)), {}, (), ())
    assert deps == ()
    assert buffers == ((buffer_of(a)[0], a.nbytes, False),)


# -- the engine orders memory reached through views -------------------------------------------------


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[ss.Engine]:
    async with ss.Engine(cpu_workers=2) as eng:
        yield eng


DECLARED: dict[str, Callable[[np.ndarray], Any]] = {
    "memoryview": memoryview,
    "ctypes from_buffer": lambda a: (ctypes.c_double * a.size).from_buffer(a),
    "memoryview in a list": lambda a: [memoryview(a)],
    "asarray(memoryview)": lambda a: np.asarray(memoryview(a)),
    "sliding_window_view": lambda a: sliding_window_view(a, 1),
    "as_strided": lambda a: as_strided(a, (10,), (8,)),
    "frombuffer": np.frombuffer,
}


@pytest.mark.parametrize("declare", sorted(DECLARED))
async def test_a_write_declared_through_any_view_orders_a_read_of_the_array(
    engine: ss.Engine, declare: str
) -> None:
    """The reporter's first repro: writes=memoryview(buf) ordered nothing, and the sum read 0.0."""
    buf = np.zeros(1000)
    gate = Gate()
    engine.submit_nowait(gate.hold(lambda: buf.fill(1.0)), writes=DECLARED[declare](buf))
    await gate.wait_started(1)
    total = engine.submit_nowait(np.sum, buf)
    await probe(engine)  # the other worker is free: a wrongly ready reader would have run by now
    assert not total.done()
    gate.open()
    assert await within(total) == 1000.0


@pytest.mark.parametrize("view", sorted(DECLARED))
async def test_a_read_through_any_view_waits_for_a_write_of_the_array(engine: ss.Engine, view: str) -> None:
    """The reporter's second repro: np.sum(sliding_window_view(x, 1)) ran before out=x was written."""
    x = np.zeros(1000)
    gate = Gate()
    engine.submit_nowait(gate.hold(lambda: np.add(x, 1.0, out=x)), writes=x)
    await gate.wait_started(1)
    total = engine.submit_nowait(lambda v: float(np.sum(np.asarray(v))), DECLARED[view](x))
    await probe(engine)
    assert not total.done()
    gate.open()
    assert await within(total) == pytest.approx(1000.0 if view != "as_strided" else 10.0)


async def test_out_into_a_bytearray_view_orders_a_read_of_the_bytearray(engine: ss.Engine) -> None:
    raw = bytearray(8 * 100)
    x = np.frombuffer(raw)
    gate = Gate()
    engine.submit_nowait(gate.hold(lambda: x.fill(2.0)), writes=raw)
    await gate.wait_started(1)
    total = engine.submit_nowait(lambda m: float(np.frombuffer(m).sum()), memoryview(raw))
    await probe(engine)
    assert not total.done()
    gate.open()
    assert await within(total) == 200.0


# -- reads=/writes= refuse what orders nothing -------------------------------------------------------


@pytest.mark.parametrize(
    "declared",
    ["buf", 5, 1.5, object(), np.zeros(3).ctypes, [np.zeros(3), "buf"], {"a": 5}],
    ids=["str", "int", "float", "object", "ndarray.ctypes", "str in a list", "int in a dict"],
)
@pytest.mark.parametrize("option", ["reads", "writes"])
async def test_declared_memory_that_is_not_memory_is_invalid(
    engine: ss.Engine, option: str, declared: Any
) -> None:
    with pytest.raises(ss.InvalidTask, match=f"{option}=") as info:
        engine.submit_nowait(np.sum, np.ones(3), **{option: declared})
    assert "exposes no memory" in str(info.value)
    with pytest.raises(ss.InvalidTask, match=f"{option}="):
        await engine.submit(np.sum, np.ones(3), **{option: declared})
    assert engine.stats().submitted == 0


async def test_declared_memory_may_be_none_or_bytes(engine: ss.Engine) -> None:
    assert await within(engine.run(np.sum, np.ones(3), reads=None, writes=None)) == 3.0
    assert await within(engine.run(len, b"abc", reads=b"abc")) == 3


# -- fn must be synchronous ---------------------------------------------------------------------------


async def double(x: int) -> int:
    return 2 * x


async def numbers() -> AsyncIterator[int]:
    yield 1


class AsyncCallable:
    async def __call__(self, x: int) -> int:
        return x

    async def method(self, x: int) -> int:
        return x


ASYNC_FNS: dict[str, Any] = {
    "async def": double,
    "async generator function": numbers,
    "partial of async def": functools.partial(double, 1),
    "async method": AsyncCallable().method,
    "object with async __call__": AsyncCallable(),
}


@pytest.mark.parametrize("fn", sorted(ASYNC_FNS))
async def test_an_async_function_is_refused_at_submission(engine: ss.Engine, fn: str) -> None:
    """It used to "succeed" with an un-run coroutine as its value."""
    with pytest.raises(ss.InvalidTask, match="async function") as info:
        engine.submit_nowait(ASYNC_FNS[fn], 21)
    assert "await" in str(info.value)
    with pytest.raises(ss.InvalidTask, match="async function"):
        await engine.run(ASYNC_FNS[fn], 21)
    with pytest.raises(ss.InvalidTask, match="async function"):
        engine.map(ASYNC_FNS[fn], [1, 2])
    assert engine.stats().submitted == 0


# -- user objects that raise from their hooks ---------------------------------------------------------


class Hostile:
    """An argument whose __getattr__ and __repr__ raise, as some proxies do."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no attribute look-ups here ({name})")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


async def test_an_argument_whose_getattr_raises_is_passed_as_it_is(engine: ss.Engine) -> None:
    """It failed with the RuntimeError of a look-up of the engine's internal __schedsvc_visit__."""
    hostile = Hostile()
    assert await within(engine.run(lambda h: h is hostile, hostile)) is True
    assert await within(engine.run(lambda hs: hs[0] is hostile, [hostile, engine.submit_nowait(int)]))


async def test_a_non_callable_whose_repr_raises_is_an_invalid_task(engine: ss.Engine) -> None:
    """It raised the repr's RuntimeError instead of InvalidTask."""
    with pytest.raises(ss.InvalidTask, match="needs a callable") as info:
        engine.submit_nowait(Hostile())  # type: ignore[arg-type]
    assert "Hostile" in str(info.value)
