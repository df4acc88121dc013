"""Sequential consistency of random programs over CPU, cuda:0 and cuda:1, on the CUDA simulator.

A program works on a few shared host arrays (written in place by CPU tasks, ``out=``) and a few
Tensors living on cpu, cuda:0 or cuda:1 (written in place by Tensor operators and by tasks on their
device with ``out=``, moved between devices with ``t.to(...)``, read into host arrays by CPU tasks).
It runs on the engine, with the simulator's seeded random delays on every stream operation, inside
``forbid_host_sync()``; every result and the final arrays must equal the same program run
sequentially in NumPy, with no race found and no host sync on a launching thread.

CPU tasks take device Tensors both as such (a D2H copy task ordered after the Tensor's in-place
writes) and through ``t.to("cpu")``; cuda tasks take the shared host arrays as such (H2D copy tasks).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import schedsvc as ss
from tests.devices.cuda_helpers import CUPY_MISSING, ON_CUPY, checked_simulator, engine_options, sim

N_HOST = 2
N_TENSORS = 3
SIZE = 6
MOD = 1009  # every value stays a small exact integer
DEVICES = ("cpu", "cuda:0", "cuda:1")
TIMEOUT = 20.0

pytestmark = pytest.mark.skipif(
    ON_CUPY, reason="the property runs on the CUDA simulator (its delays, race detector and counters)"
)


@pytest.fixture(autouse=True)
def _simulator(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from checked_simulator(request)


# -- task bodies (the engine's and the reference's) ----------------------------------------------


def add_const(x: Any, c: int, *, out: Any) -> None:
    np.add(x, c, out=out)
    np.remainder(out, MOD, out=out)


def store(x: Any, *, out: np.ndarray[Any, Any]) -> None:
    np.remainder(x, MOD, out=out)


def add_tensor(x: Any, y: Any, *, out: Any) -> None:
    np.add(x, y, out=out)
    np.remainder(out, MOD, out=out)


def total(x: np.ndarray[Any, Any]) -> int:
    return int(np.sum(x))


# -- programs ------------------------------------------------------------------------------------

host_ref = st.integers(0, N_HOST - 1)
tensor_ref = st.integers(0, N_TENSORS - 1)
device = st.sampled_from(DEVICES)
small = st.integers(0, 40)

OPERATIONS = st.one_of(
    st.tuples(st.just("cpu_add"), host_ref, small),  # CPU task: host[k] += c (out=)
    st.tuples(st.just("t_iadd"), tensor_ref, small),  # t += c; t %= MOD
    st.tuples(st.just("t_mix"), tensor_ref, tensor_ref),  # t[j] += t[i].to(t[j].device)
    st.tuples(st.just("h2t"), tensor_ref, host_ref),  # t[j] += asarray(host[k]).to(device)
    st.tuples(st.just("t2h"), tensor_ref, host_ref, st.booleans()),  # CPU task: host[k] = t[j] % MOD
    st.tuples(st.just("dev_add"), tensor_ref, small),  # task on t's device: t = t + c (out=t)
    st.tuples(st.just("move"), tensor_ref, device),  # t = t.to(device)
    st.tuples(st.just("read"), tensor_ref),  # t.sum().to("cpu")
    st.tuples(st.just("cpu_read"), tensor_ref, st.booleans()),  # CPU task: total(t) (or t.to("cpu"))
    st.tuples(st.just("xdev"), tensor_ref, device, small),  # a task on any device taking t: t + c
    st.tuples(st.just("host_arg"), tensor_ref, host_ref),  # task on t's device: t = t + host array
    st.tuples(st.just("setitem"), tensor_ref, st.integers(0, SIZE - 1), small),  # t[i] = c
    st.tuples(st.just("host_in"), tensor_ref, host_ref),  # task on t's device: t = t + asarray(host)
)
programs = st.lists(OPERATIONS, min_size=10, max_size=40)
starts = st.lists(device, min_size=N_TENSORS, max_size=N_TENSORS)
ENGINES = [  # backpressure (a small max_pending), one stream, many streams
    {"max_pending": 16},
    {"max_pending": 3, "streams_per_device": 1},
    {"max_pending": 64, "streams_per_device": 4, "cpu_workers": 1},
]


def fresh_host() -> list[np.ndarray[Any, Any]]:
    return [np.arange(SIZE, dtype=np.int64) * (k + 2) for k in range(N_HOST)]


def fresh_tensor(j: int) -> np.ndarray[Any, Any]:
    return np.arange(SIZE, dtype=np.int64) + 10 * j


def run_sequentially(program: list[tuple[Any, ...]]) -> tuple[list[int], list[Any], list[Any]]:
    host = fresh_host()
    tensors = [fresh_tensor(j) for j in range(N_TENSORS)]
    results: list[int] = []
    for op in program:
        kind = op[0]
        if kind == "cpu_add":
            add_const(host[op[1]], op[2], out=host[op[1]])
        elif kind == "t_iadd":
            tensors[op[1]] = (tensors[op[1]] + op[2]) % MOD
        elif kind == "t_mix":
            tensors[op[1]] = (tensors[op[1]] + tensors[op[2]]) % MOD
        elif kind == "h2t":
            tensors[op[1]] = (tensors[op[1]] + host[op[2]]) % MOD
        elif kind == "t2h":
            store(tensors[op[1]], out=host[op[2]])
        elif kind == "dev_add":
            tensors[op[1]] = (tensors[op[1]] + op[2]) % MOD
        elif kind == "read" or kind == "cpu_read":
            results.append(int(tensors[op[1]].sum()))
        elif kind == "xdev":
            results.append(int((tensors[op[1]] + op[3]).sum()))
        elif kind == "setitem":
            tensors[op[1]][op[2]] = op[3]
        elif kind == "host_in" or kind == "host_arg":
            add_tensor(tensors[op[1]], host[op[2]], out=tensors[op[1]])
    return results, host, tensors


async def run_on_engine(
    program: list[tuple[Any, ...]], start: list[str], seed: int, options: dict[str, Any]
) -> tuple[list[int], list[Any], list[Any]]:
    simulator = sim()
    simulator.reset()
    simulator.configure(seed=seed, max_delay_s=0.001)
    host = fresh_host()
    pending: list[Any] = []
    with simulator.forbid_host_sync():
        async with ss.Engine(**engine_options(**options)) as eng:
            tensors = [eng.asarray(fresh_tensor(j), device=start[j]) for j in range(N_TENSORS)]
            for op in program:
                kind = op[0]
                if kind == "cpu_add":
                    await eng.submit(add_const, host[op[1]], op[2], out=host[op[1]], device="cpu")
                elif kind == "t_iadd":
                    t = tensors[op[1]]
                    t += op[2]
                    t %= MOD
                elif kind == "t_mix":
                    t = tensors[op[1]]
                    t += tensors[op[2]].to(t.device)
                    t %= MOD
                elif kind == "h2t":
                    t = tensors[op[1]]
                    t += eng.asarray(host[op[2]]).to(t.device)
                    t %= MOD
                elif kind == "t2h":
                    src = tensors[op[1]].to("cpu") if op[3] else tensors[op[1]]
                    await eng.submit(store, src, out=host[op[2]], device="cpu")
                elif kind == "dev_add":
                    t = tensors[op[1]]
                    await eng.submit(add_const, t, op[2], out=t, device=t.device)
                elif kind == "move":
                    tensors[op[1]] = tensors[op[1]].to(op[2])
                elif kind == "read":
                    pending.append(tensors[op[1]].sum().to("cpu"))
                elif kind == "cpu_read":
                    src = tensors[op[1]].to("cpu") if op[2] else tensors[op[1]]
                    pending.append(await eng.submit(total, src, device="cpu"))
                elif kind == "xdev":
                    other = await eng.submit(np.add, tensors[op[1]], op[3], device=op[2])
                    pending.append(await eng.submit(total, other, device="cpu"))
                elif kind == "setitem":
                    tensors[op[1]][op[2]] = op[3]
                elif kind == "host_in":
                    t = tensors[op[1]]
                    await eng.submit(add_tensor, t, eng.asarray(host[op[2]]), out=t, device=t.device)
                elif kind == "host_arg":
                    t = tensors[op[1]]
                    await eng.submit(add_tensor, t, host[op[2]], out=t, device=t.device)
            results = [int(await asyncio.wait_for(p, TIMEOUT)) for p in pending]
            finals = [await asyncio.wait_for(t.to("cpu"), TIMEOUT) for t in tensors]
            await asyncio.wait_for(eng.waitall(), TIMEOUT)
    assert simulator.races == [], simulator.races
    assert simulator.launcher_syncs() == 0, simulator.host_syncs()
    return results, host, finals


@settings(
    max_examples=int(os.environ.get("PROPERTY_EXAMPLES", "25")),  # more: PROPERTY_EXAMPLES=500
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(programs, starts, st.integers(0, 2**16), st.sampled_from(ENGINES))
def test_cuda_engine_equals_sequential_numpy(
    program: list[tuple[Any, ...]], start: list[str], seed: int, options: dict[str, Any]
) -> None:
    if CUPY_MISSING:
        pytest.skip(CUPY_MISSING)
    want_results, want_host, want_tensors = run_sequentially(program)
    got_results, got_host, got_tensors = asyncio.run(run_on_engine(program, start, seed, options))
    assert got_results == want_results
    for k, (got, want) in enumerate(zip(got_host, want_host, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"host array {k}")
    for j, (got, want) in enumerate(zip(got_tensors, want_tensors, strict=True)):
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want, err_msg=f"tensor {j}")
