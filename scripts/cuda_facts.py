#!/usr/bin/env python3
"""Check the CuPy facts of CUDA.md on a real GPU and measure the two completion designs.

Standalone: imports cupy and numpy only (no schedsvc). Run on a machine with a GPU:

    PYTHONUNBUFFERED=1 python3 scripts/cuda_facts.py

Prints one line per fact, ``PASS|FAIL|INFO <fact>: <what was observed>``, and writes every
result (with the raw figures) to ``$OUT/cuda_facts.json`` when ``OUT`` is set. PASS means the
fact as CUDA.md states it was observed; FAIL means it was not (or the probe broke: the line
says so); INFO is a measurement or an observation with nothing to pass or fail.

Probes that may hang or poison the CUDA context (a CUDA call inside a host callback, a trap
kernel, a synchronisation during graph capture, cuBLAS during capture) run in a child process
(``--sub NAME``) with a timeout. "Long" kernels are one-thread spin kernels timed by the GPU's
``%globaltimer`` (nanoseconds), so their length is known.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import faulthandler
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cupy
import numpy
from cupy.cuda import runtime

MS = 1_000_000  # nanoseconds in a millisecond
RESULTS: list[dict[str, Any]] = []
OUT = os.environ.get("OUT")
SUB_TIMEOUT_S = 40

_SRC = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void spin(unsigned long long ns, unsigned long long* ts, int idx) {
    unsigned long long t0 = gt(), t = t0;
    while (t - t0 < ns) t = gt();
    ts[2 * idx] = t0;
    ts[2 * idx + 1] = t;
}
extern "C" __global__ void stamp(unsigned long long* ts, int idx) { ts[idx] = gt(); }
extern "C" __global__ void setval(float* out, float v) { out[0] = v; }
extern "C" __global__ void trap_kernel() { asm volatile("trap;"); }
extern "C" __global__ void tick(unsigned long long* ts, int n) {
    unsigned long long last = gt();
    long long guard = 0;
    int i = 0;
    while (i < n && guard < 20000000LL) {
        unsigned long long t = gt();
        if (t != last) { ts[i++] = t - last; last = t; }
        guard++;
    }
}
"""


class K:
    """The probe's kernels, compiled once per process."""

    mod: Any = None

    @classmethod
    def get(cls, name: str) -> Any:
        if cls.mod is None:
            cls.mod = cupy.RawModule(code=_SRC)
        return cls.mod.get_function(name)


_SCRATCH: dict[int, Any] = {}


def spin(stream: Any, ms: float, ts: Any = None, idx: int = 0) -> None:
    """Enqueue a one-thread kernel that runs for `ms` milliseconds on `stream`."""
    if ts is None:
        ts = _SCRATCH.get(0)
        if ts is None:
            ts = _SCRATCH[0] = cupy.zeros(2, dtype=numpy.uint64)
    K.get("spin")((1,), (1,), (numpy.uint64(int(ms * MS)), ts, numpy.int32(idx)), stream=stream)


def setval(stream: Any, arr: Any, v: float) -> None:
    K.get("setval")((1,), (1,), (arr, numpy.float32(v)), stream=stream)


def nb_stream() -> Any:
    return cupy.cuda.Stream(non_blocking=True)


def pc() -> float:
    return time.perf_counter()


def time_until_done(ev: Any, t0: float, timeout: float = 5.0) -> float | None:
    """Seconds from t0 until `ev.done` (polled every 0.1 ms), or None after `timeout`."""
    while not ev.done:
        if pc() - t0 > timeout:
            return None
        time.sleep(0.0001)
    return pc() - t0


def ms(x: float | None) -> str:
    return "never (timeout)" if x is None else f"{x * 1e3:.2f} ms"


def _dump() -> None:
    if not OUT:
        return
    path = os.path.join(OUT, "cuda_facts.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    os.replace(tmp, path)


def report(status: str, fact: str, observed: str, **data: Any) -> None:
    print(f"{status} {fact}: {observed}", flush=True)
    RESULTS.append({"status": status, "fact": fact, "observed": observed, "data": data})
    _dump()


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def probe(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as e:
        import traceback

        report("FAIL", fn.__name__, f"probe error {type(e).__name__}: {e}", tb=traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            cupy.cuda.Stream.null.use()
            cupy.cuda.runtime.deviceSynchronize()


# ----------------------------------------------------------------------------- child processes


def run_subs(names: list[str]) -> dict[str, dict[str, Any]]:
    """Run `--sub NAME` children in parallel; each prints `RESULT <json>` as its last line."""
    procs = {
        n: subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--sub", n],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in names
    }
    out: dict[str, dict[str, Any]] = {}
    deadline = pc() + SUB_TIMEOUT_S
    for n, p in procs.items():
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - pc()))
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            out[n] = {"hung": True, "stderr": se[-600:], "stdout": so[-600:]}
            continue
        res: dict[str, Any] = {"rc": p.returncode, "stderr": se[-600:]}
        for line in so.splitlines():
            if line.startswith("RESULT "):
                res.update(json.loads(line[7:]))
        out[n] = res
    return out


def _exc(e: BaseException) -> str:
    status = getattr(e, "status", None)
    return (
        f"{type(e).__module__}.{type(e).__name__}"
        + (f"(status={status})" if status is not None else "")
        + f": {e}"
    )


def sub_trap(r: dict[str, Any]) -> None:
    s = nb_stream()
    e = cupy.cuda.Event()
    never = cupy.cuda.Event()  # created before the fault
    K.get("trap_kernel")((1,), (1,), (), stream=s)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("record", lambda: e.record(s)),
        ("sleep 0.5 s", lambda: time.sleep(0.5)),
        ("done_0.5s", lambda: e.done),
        ("eventQuery_status", lambda: int(runtime.eventQuery(e.ptr))),
        ("sleep another 0.5 s", lambda: time.sleep(0.5)),
        ("done_1.0s", lambda: e.done),
        ("never_recorded_done_after_fault", lambda: never.done),
        ("stream.synchronize", s.synchronize),
        ("new Event()", cupy.cuda.Event),
        ("cupy.ones(2).sum().item()", lambda: cupy.ones(2).sum().item()),
    ]
    for name, fn in steps:
        try:
            v = fn()
            r[name] = v if isinstance(v, bool | int) else "ok"
        except Exception as ex:
            r[name] = _exc(ex)


def sub_hostfunc(r: dict[str, Any], variant: str) -> None:
    s, other = nb_stream(), nb_stream()
    x = cupy.zeros(4, dtype=numpy.float32)
    x += 0
    cupy.cuda.Device().synchronize()
    keep: dict[str, Any] = {"ev": cupy.cuda.Event(), "arr": cupy.ones(1024, dtype=numpy.float32)}

    def body() -> Any:
        if variant == "getDevice":
            return runtime.getDevice()
        if variant == "event_create":
            return cupy.cuda.Event().ptr != 0
        if variant == "event_record":
            keep["ev"].record(other)
            return True
        if variant == "kernel":
            with other:
                x.__iadd__(1)
            return True
        if variant == "malloc":
            p = runtime.malloc(1 << 20)
            runtime.free(p)
            return True
        if variant == "sync_other":
            other.synchronize()
            return True
        if variant == "drop_event":
            del keep["ev"]  # last reference: Event.__del__ calls cudaEventDestroy
            return True
        if variant == "drop_array":
            del keep["arr"]  # last reference: the block goes back to the pool
            return True
        raise ValueError(variant)

    def cb(_: Any) -> None:
        r["entered"] = True
        try:
            r["returned"] = repr(body())
        except Exception as ex:
            r["raised"] = _exc(ex)

    s.launch_host_func(cb, 0)
    e = cupy.cuda.Event()
    e.record(s)
    t0 = pc()
    d = time_until_done(e, t0, timeout=10)
    r["stream_passed_callback_s"] = d
    print("RESULT " + json.dumps(r, default=str), flush=True)  # in case what follows hangs
    try:
        s.synchronize()
        other.synchronize()
        r["after"] = "ok: " + repr(float(cupy.ones(3).sum().item()))
    except Exception as ex:
        r["after"] = _exc(ex)


def sub_capture_sync(r: dict[str, Any], variant: str) -> None:
    s, other = nb_stream(), nb_stream()
    a = cupy.zeros(1, dtype=numpy.float32)
    a += 0
    ev_other = cupy.cuda.Event()
    ev_other.record(other)
    cupy.cuda.Device().synchronize()
    ops: dict[str, Callable[[], Any]] = {
        "get": lambda: a.get(),
        "item": lambda: a.item(),
        "stream_sync": s.synchronize,
        "other_stream_sync": other.synchronize,
        "event_sync_other": ev_other.synchronize,
        "event_query_other": lambda: ev_other.done,
        "device_sync": runtime.deviceSynchronize,
        "alloc_new_block": lambda: cupy.empty(64 << 20, dtype=numpy.uint8).shape,
    }
    with s:
        s.begin_capture()
        a += 1
        try:
            r["op"] = "ok: " + repr(ops[variant]())[:80]
        except Exception as ex:
            r["op"] = _exc(ex)
        try:
            r["is_capturing_after_op"] = s.is_capturing()
        except Exception as ex:
            r["is_capturing_after_op"] = _exc(ex)
        try:
            g = s.end_capture()
            r["end_capture"] = "ok"
            g.launch(s)
            s.synchronize()
            r["value_after_one_replay"] = float(a.get(stream=s)[0])
        except Exception as ex:
            r["end_capture"] = _exc(ex)
    try:
        s2 = s
        with s2:
            b = cupy.ones(2, dtype=numpy.float32) * 3
        r["stream_usable_after"] = float(b.get(stream=s2)[0])
    except Exception as ex:
        r["stream_usable_after"] = _exc(ex)


def sub_capture_cublas(r: dict[str, Any], warm: bool) -> None:
    s = nb_stream()
    a = cupy.ones((64, 64), dtype=numpy.float32)
    if warm:
        with s:
            (a @ a).sum()
    cupy.cuda.Device().synchronize()
    with s:
        s.begin_capture()
        try:
            c = a @ a
            r["matmul"] = "ok"
        except Exception as ex:
            r["matmul"] = _exc(ex)
            c = None
        try:
            g = s.end_capture()
            r["end_capture"] = "ok"
            g.launch(s)
            s.synchronize()
            r["value"] = float(c[0, 0].get(stream=s)) if c is not None else None
        except Exception as ex:
            r["end_capture"] = _exc(ex)


def sub_main(name: str) -> None:
    kind, _, variant = name.partition(":")
    r: dict[str, Any] = {}
    fns: dict[str, Callable[[], None]] = {
        "trap": lambda: sub_trap(r),
        "hostfunc": lambda: sub_hostfunc(r, variant),
        "capture_sync": lambda: sub_capture_sync(r, variant),
        "capture_cublas": lambda: sub_capture_cublas(r, variant == "warm"),
    }
    try:
        fns[kind]()
    except Exception as ex:
        r["probe_error"] = _exc(ex)
    print("RESULT " + json.dumps(r, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip CuPy's teardown, which may hang after a fault


# ----------------------------------------------------------------------------- facts


def p_environment() -> None:
    props = runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    drv = runtime.driverGetVersion()
    rt = runtime.runtimeGetVersion()
    report(
        "INFO",
        "machine",
        f"GPU {name} (cc {props['major']}.{props['minor']}, {props['multiProcessorCount']} SMs, "
        f"{props['totalGlobalMem'] / 2**30:.1f} GiB), {runtime.getDeviceCount()} device(s); "
        f"CUDA driver API {drv}, CUDA runtime {rt}; CuPy {cupy.__version__}; NumPy {numpy.__version__}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs",
        gpu=name,
        driver_api=drv,
        runtime=rt,
        cupy=cupy.__version__,
        numpy=numpy.__version__,
        python=platform.python_version(),
    )
    cur = cupy.cuda.get_current_stream()
    report(
        "INFO",
        "default current stream",
        f"a fresh thread's current stream is ptr={cur.ptr} ({'legacy null stream' if cur.ptr == 0 else cur})",
    )
    ts = cupy.zeros(64, dtype=numpy.uint64)
    K.get("tick")((1,), (1,), (ts, numpy.int32(64)), stream=cupy.cuda.Stream.null)
    d = ts.get()
    d = d[d > 0]
    report(
        "INFO",
        "globaltimer resolution",
        f"smallest/median step between distinct %globaltimer readings: {int(d.min()) if d.size else 'n/a'} / "
        f"{int(numpy.median(d)) if d.size else 'n/a'} ns ({d.size} steps)",
        steps=d.tolist(),
    )


def p_streams_nonblocking() -> None:
    nb, bl, null = nb_stream(), cupy.cuda.Stream(), cupy.cuda.Stream.null
    e_nb, e_bl, e_null = cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()
    t0 = pc()
    spin(null, 100)
    spin(nb, 0)
    e_nb.record(nb)
    spin(bl, 0)
    e_bl.record(bl)
    d_nb = time_until_done(e_nb, t0)
    d_bl = time_until_done(e_bl, t0)
    runtime.deviceSynchronize()
    t0 = pc()
    spin(nb, 100)
    spin(null, 0)
    e_null.record(null)
    d_null = time_until_done(e_null, t0)
    runtime.deviceSynchronize()
    ok = d_nb is not None and d_nb < 0.05 and d_bl is not None and d_bl >= 0.09 and d_null is not None
    ok = ok and d_null < 0.05
    report(
        verdict(ok),
        "non_blocking streams do not serialise with the legacy null stream (default streams do)",
        f"after a 100 ms kernel on the null stream, a tiny kernel finished at {ms(d_nb)} on a non_blocking "
        f"stream and at {ms(d_bl)} on a Stream() with default flags; after a 100 ms kernel on the "
        f"non_blocking stream a null-stream kernel finished at {ms(d_null)}; is_non_blocking "
        f"{nb.is_non_blocking}/{bl.is_non_blocking}",
        d_nb=d_nb,
        d_blocking=d_bl,
        d_null_after_nb=d_null,
    )


def p_current_stream_per_thread() -> None:
    s1, s2 = nb_stream(), nb_stream()
    cur = cupy.cuda.get_current_stream
    o: dict[str, Any] = {}
    with s1:
        o["main_in_with_is_s1"] = cur() == s1
        th: dict[str, Any] = {}

        def other() -> None:
            th["thread_start_ptr"] = cur().ptr
            s2.use()
            th["thread_after_use_is_s2"] = cur() == s2

        t = threading.Thread(target=other)
        t.start()
        t.join()
        o["main_still_s1_after_thread_use"] = cur() == s1
    o["main_after_with_ptr"] = cur().ptr
    o.update(th)
    ok = (
        o["main_in_with_is_s1"]
        and o["main_still_s1_after_thread_use"]
        and th["thread_start_ptr"] == 0
        and th["thread_after_use_is_s2"]
        and o["main_after_with_ptr"] == 0
    )
    report(
        verdict(ok),
        "current stream is per host thread (`with s:` and `s.use()`)",
        f"main in `with s1`: current is s1={o['main_in_with_is_s1']}; a new thread starts on ptr "
        f"{th['thread_start_ptr']}, its s2.use() makes s2 current there={th['thread_after_use_is_s2']} and "
        f"leaves main on s1={o['main_still_s1_after_thread_use']}; after the with block main is on ptr "
        f"{o['main_after_with_ptr']}",
        **o,
    )
    # Mixing the two.
    s2.use()
    with s1:
        pass
    mix1 = "s2" if cur() == s2 else ("null" if cur().ptr == 0 else repr(cur()))
    cupy.cuda.Stream.null.use()
    with s1:
        s2.use()
        inside = cur() == s2
    mix2 = "s2" if cur() == s2 else ("null" if cur().ptr == 0 else repr(cur()))
    cupy.cuda.Stream.null.use()
    report(
        "INFO",
        "mixing `with s:` and `s.use()`",
        f"s2.use(); with s1: pass -> current afterwards is {mix1}; with s1: s2.use() (s2 current inside="
        f"{inside}) -> current after the block is {mix2}",
        use_then_with=mix1,
        use_inside_with=mix2,
    )


def p_device_per_thread() -> None:
    n = runtime.getDeviceCount()
    cupy.cuda.Device(0).use()
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["thread_device"] = runtime.getDevice()
        seen["cupy_device"] = cupy.cuda.Device().id
        if n > 1:
            cupy.cuda.Device(1).use()
            seen["thread_after_use_1"] = runtime.getDevice()

    if n > 1:
        cupy.cuda.Device(0).use()
    t = threading.Thread(target=other)
    t.start()
    t.join()
    main_dev = runtime.getDevice()
    if n > 1:
        ok = seen["thread_after_use_1"] == 1 and main_dev == 0
        report(verdict(ok), "current device is per host thread", f"{seen}, main still on {main_dev}", **seen)
    else:
        report(
            "INFO",
            "current device is per host thread",
            f"only {n} device: cannot show two threads on different devices; a new thread's current "
            f"device is {seen['thread_device']} (CuPy Device().id {seen['cupy_device']})",
            **seen,
        )


def p_event_record_default_stream() -> None:
    s = nb_stream()
    e = cupy.cuda.Event()
    with s:
        spin(s, 100)
        e.record()
    d = time_until_done(e, pc())
    report(
        verdict(d is not None and d > 0.05),
        "e.record() with no stream records on the current stream",
        f"inside `with s` after a 100 ms kernel on s, e.record() then e.done became True after {ms(d)}",
    )


def p_wait_event_snapshot() -> None:
    a, b = nb_stream(), nb_stream()
    ev, eb = cupy.cuda.Event(disable_timing=True), cupy.cuda.Event()
    t0 = pc()
    spin(a, 100)
    ev.record(a)
    b.wait_event(ev)
    spin(b, 0)
    eb.record(b)
    spin(a, 300)
    ev.record(a)  # re-record after the wait was enqueued
    d1 = time_until_done(eb, t0)
    runtime.deviceSynchronize()
    t0 = pc()
    spin(a, 100)
    ev.record(a)
    spin(a, 200)
    ev.record(a)  # re-record before the wait
    b.wait_event(ev)
    spin(b, 0)
    eb.record(b)
    d2 = time_until_done(eb, t0)
    runtime.deviceSynchronize()
    ok = d1 is not None and 0.09 <= d1 < 0.25 and d2 is not None and d2 >= 0.29
    report(
        verdict(ok),
        "wait_event waits for the record that existed when it was called",
        f"A: 100 ms, record; B.wait_event; A: 300 ms, re-record -> B's next kernel done at {ms(d1)} "
        f"(100 ms = first record, 400 ms = re-record); control, re-record before the wait -> {ms(d2)}",
        d_rerecord_after=d1,
        d_rerecord_before=d2,
    )


def p_never_recorded() -> None:
    a, b = nb_stream(), nb_stream()
    ev, eb = cupy.cuda.Event(), cupy.cuda.Event()
    done0 = ev.done
    t0 = pc()
    ev.synchronize()
    dsync = pc() - t0
    report(
        verdict(done0 is True),
        "e.done is True for a never-recorded event",
        f"done={done0}; its synchronize() returned in {dsync * 1e6:.1f} us",
    )
    t0 = pc()
    spin(a, 100)
    b.wait_event(ev)
    spin(b, 0)
    eb.record(b)
    d = time_until_done(eb, t0)
    runtime.deviceSynchronize()
    report(
        verdict(d is not None and d < 0.05),
        "waiting on a never-recorded event is a no-op",
        f"B.wait_event(never recorded) then a kernel on B: done at {ms(d)} (another stream was busy 100 ms)",
    )


def p_failed_kernel() -> None:
    r = run_subs(["trap"])["trap"]
    if r.get("hung"):
        report("FAIL", "e.done stays False after a failed kernel", f"child hung; stderr {r['stderr']!r}")
        return
    ok = r.get("done_0.5s") is False and r.get("done_1.0s") is False
    report(
        verdict(ok),
        "e.done stays False after a failed kernel",
        f"trap kernel then record: record -> {r.get('record')}; done at 0.5 s {r.get('done_0.5s')}, at 1 s "
        f"{r.get('done_1.0s')}; cudaEventQuery status {r.get('eventQuery_status')}; a never-recorded "
        f"event's done after the fault {r.get('never_recorded_done_after_fault')}; then "
        f"stream.synchronize -> {r.get('stream.synchronize')}; Event() -> {r.get('new Event()')}; "
        f"a new kernel -> {r.get('cupy.ones(2).sum().item()')}",
        **r,
    )


def _gil_progress(make_waiter: Callable[[dict[str, Any]], Callable[[], None]]) -> dict[str, Any]:
    """Run a waiter thread; count main-thread Python loop iterations while it is alive."""
    res: dict[str, Any] = {}
    flag = [False]
    body = make_waiter(res)

    def waiter() -> None:
        cupy.cuda.Device(0).use()
        c0, w0 = time.thread_time(), pc()
        body()
        res["cpu_s"], res["wall_s"] = time.thread_time() - c0, pc() - w0
        flag[0] = True

    t = threading.Thread(target=waiter)
    n = 0
    t1 = pc()
    t.start()
    while not flag[0]:
        n += 1
    res["main_rate_per_ms"] = n / ((pc() - t1) * 1e3)
    t.join()
    return res


def p_event_block() -> None:
    s = nb_stream()
    base = _gil_progress(lambda res: lambda: time.sleep(0.3))
    runs = {}
    for block in (True, False):
        ev = cupy.cuda.Event(block=block, disable_timing=True)
        spin(s, 300)
        ev.record(s)
        runs[block] = _gil_progress(lambda res, ev=ev: ev.synchronize)
    spin(s, 300)
    runs["stream"] = _gil_progress(lambda res: s.synchronize)
    bt, bf, st = runs[True], runs[False], runs["stream"]
    report(
        verdict(bt["main_rate_per_ms"] > 0.3 * base["main_rate_per_ms"] and bt["cpu_s"] < 0.1 * bt["wall_s"]),
        "Event(block=True).synchronize() releases the GIL and sleeps",
        f"300 ms kernel: waiter wall {bt['wall_s'] * 1e3:.0f} ms, waiter CPU {bt['cpu_s'] * 1e3:.1f} ms; main "
        f"thread ran {bt['main_rate_per_ms']:.0f} loop iterations/ms meanwhile (vs {base['main_rate_per_ms']:.0f} "
        f"beside a sleeping thread)",
        block_true=bt,
        baseline=base,
    )
    report(
        verdict(bf["cpu_s"] > 0.5 * bf["wall_s"]),
        "Event(block=False).synchronize() spins (but releases the GIL)",
        f"300 ms kernel: waiter wall {bf['wall_s'] * 1e3:.0f} ms, waiter CPU {bf['cpu_s'] * 1e3:.0f} ms; main "
        f"thread {bf['main_rate_per_ms']:.0f} iterations/ms",
        block_false=bf,
    )
    report(
        "INFO",
        "Stream.synchronize() (context default schedule)",
        f"300 ms kernel: wall {st['wall_s'] * 1e3:.0f} ms, CPU {st['cpu_s'] * 1e3:.0f} ms; main thread "
        f"{st['main_rate_per_ms']:.0f} iterations/ms",
        stream_sync=st,
    )


def p_host_func() -> None:
    a, b = nb_stream(), nb_stream()
    info: dict[str, Any] = {}

    def where(_: Any) -> None:
        info["ident"] = threading.get_ident()
        info["name"] = threading.current_thread().name
        info["is_main"] = threading.current_thread() is threading.main_thread()

    a.launch_host_func(where, 0)
    a.synchronize()
    report(
        verdict(info.get("ident") not in (None, threading.get_ident())),
        "launch_host_func callbacks run on another (driver) thread",
        f"callback thread ident {info.get('ident')} name {info.get('name')!r} (main {threading.get_ident()})",
        **info,
    )

    ea, eb = cupy.cuda.Event(), cupy.cuda.Event()
    t0 = pc()
    a.launch_host_func(lambda _: time.sleep(0.2), 0)
    spin(a, 0)
    ea.record(a)
    spin(b, 0)
    eb.record(b)
    da = db = None
    while (da is None or db is None) and pc() - t0 < 5:
        if db is None and eb.done:
            db = pc() - t0
        if da is None and ea.done:
            da = pc() - t0
        time.sleep(0.0001)
    report(
        verdict(da is not None and da >= 0.19 and db is not None and db < 0.05),
        "a host callback blocks its stream while it runs",
        f"callback sleeping 200 ms: next kernel on its stream done at {ms(da)}, a kernel on another "
        f"stream at {ms(db)}",
        d_same=da,
        d_other=db,
    )

    caught: list[str] = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(f"{type(u.exc_value).__name__}: {u.exc_value}")

    def bad(_: Any) -> None:
        raise ValueError("boom from host func")

    e = cupy.cuda.Event()
    try:
        a.launch_host_func(bad, 0)
        spin(a, 0)
        e.record(a)
        a.synchronize()
        time.sleep(0.05)
        raised_on_host = "no"
    except Exception as ex:
        raised_on_host = _exc(ex)
    finally:
        sys.unraisablehook = old
    report(
        verdict(raised_on_host == "no" and e.done),
        "a host callback's exception is lost (the stream goes on)",
        f"callback raising ValueError: nothing raised on the host ({raised_on_host}); the stream's next "
        f"event done={e.done}; sys.unraisablehook received {caught or 'nothing'}",
        unraisable=caught,
    )

    # GIL interplay: callback due while the launching thread is busy in Python.
    lat: list[float] = []
    for _ in range(5):
        hit: list[float] = []
        spin(a, 5)
        a.launch_host_func(lambda _, hit=hit: hit.append(pc()), 0)
        t_due = pc() + 0.005
        t_end = pc() + 0.1
        x = 0
        while pc() < t_end:
            x += 1
        a.synchronize()
        lat.append((hit[0] - t_due) * 1e3 if hit else float("nan"))
    report(
        "INFO",
        "host callback delay while the main thread runs Python",
        f"callback due ~5 ms after launch ran {statistics.median(lat):.2f} ms later than that (median of 5; "
        f"values {[round(v, 2) for v in lat]} ms; main thread busy in a Python loop; switch interval "
        f"{sys.getswitchinterval() * 1e3:.1f} ms)",
        delays_ms=lat,
    )

    variants = [
        "getDevice",
        "event_create",
        "event_record",
        "kernel",
        "malloc",
        "sync_other",
        "drop_event",
        "drop_array",
    ]
    res = run_subs([f"hostfunc:{v}" for v in variants])
    parts = []
    for v in variants:
        r = res[f"hostfunc:{v}"]
        if r.get("hung"):
            parts.append(f"{v}: HUNG (child killed after {SUB_TIMEOUT_S} s)")
        else:
            what = r.get("returned", r.get("raised", r.get("probe_error", "?")))
            parts.append(
                f"{v}: {what}; stream passed in {r.get('stream_passed_callback_s')} s; after: {r.get('after')}"
            )
    report(
        "INFO",
        "CUDA calls inside a host callback",
        " | ".join(parts),
        **{v: res[f"hostfunc:{v}"] for v in variants},
    )


def p_hidden_syncs() -> None:
    s = nb_stream()
    a = cupy.zeros((), dtype=numpy.float32)  # 0-d: on CuPy 14.2 int() of a size-1 1-d array raised TypeError
    cupy.cuda.Device().synchronize()
    ops: dict[str, Callable[[Any], Any]] = {
        "get()": lambda x: x.get()[()],
        "item()": lambda x: x.item(),
        "int()": lambda x: int(x),
        "float()": lambda x: float(x),
        "bool()": lambda x: bool(x),
        "repr()": lambda x: repr(x),
        "str()": lambda x: str(x),
        "tolist()": lambda x: x.tolist(),
        "cupy.asnumpy()": lambda x: cupy.asnumpy(x)[()],
    }
    waited: dict[str, Any] = {}
    for i, (name, op) in enumerate(ops.items()):
        v = float(i + 2)
        with s:
            spin(s, 50)
            setval(s, a, v)
            t0 = pc()
            try:
                got = op(a)
            except Exception as ex:
                got = _exc(ex)
            dt = pc() - t0
        s.synchronize()
        waited[name] = {"ms": dt * 1e3, "value": repr(got)[:60], "expected": v}
    ok = all(w["ms"] >= 45 for w in waited.values())
    report(
        verdict(ok),
        "hidden host syncs wait for a long kernel on the current stream",
        "50 ms kernel then the op, inside `with s`: "
        + ", ".join(f"{k} {w['ms']:.1f} ms -> {w['value']}" for k, w in waited.items()),
        **waited,
    )

    # Not on the current stream: the op syncs only the current (legacy null) stream.
    stale: dict[str, Any] = {}
    for name in ("item()", "get()"):
        setval(s, a, -1.0)
        s.synchronize()
        spin(s, 50)
        setval(s, a, 99.0)
        t0 = pc()
        got = ops[name](a)
        dt = pc() - t0
        s.synchronize()
        stale[name] = {"ms": dt * 1e3, "value": float(got)}
    report(
        "INFO",
        "hidden syncs wait only for the current stream",
        "kernel writing 99 after 50 ms on non_blocking s, op with the null stream current: "
        + ", ".join(f"{k} returned in {w['ms']:.2f} ms with {w['value']}" for k, w in stale.items()),
        **stale,
    )

    pool = cupy.get_default_memory_pool()
    with s:
        blk = cupy.empty(8 << 20, dtype=numpy.uint8)
    del blk
    spin(s, 50)
    t0 = pc()
    pool.free_all_blocks()
    dt = pc() - t0
    s.synchronize()
    report(
        verdict(dt >= 0.045),
        "free_all_blocks() is a host sync",
        f"with a cached 8 MiB block and a 50 ms kernel on a non_blocking stream: free_all_blocks took "
        f"{dt * 1e3:.2f} ms",
        ms=dt * 1e3,
    )


def p_numpy_asarray() -> None:
    a = cupy.arange(3)
    res = {}
    for name, fn in [
        ("numpy.asarray", numpy.asarray),
        ("numpy.array", numpy.array),
        ("numpy.sum", numpy.sum),
    ]:
        try:
            r = fn(a)
            res[name] = f"returned {type(r).__module__}.{type(r).__name__}"
        except Exception as ex:
            res[name] = f"{type(ex).__name__}: {ex}"
    report(
        verdict(res["numpy.asarray"].startswith("TypeError")),
        "numpy.asarray(cupy_array) raises TypeError",
        "; ".join(f"{k} -> {v}" for k, v in res.items()),
        **res,
    )


def p_copies() -> None:
    import cupyx

    s, d2h = nb_stream(), nb_stream()
    n = 1 << 20
    with s:
        a = cupy.arange(n, dtype=numpy.float32)
    ev = cupy.cuda.Event()
    ev.record(s)
    s.synchronize()
    out = cupyx.empty_pinned((n,), dtype=numpy.float32)
    out[:] = -1
    spin(d2h, 50)
    d2h.wait_event(ev)
    t0 = pc()
    a.get(out=out, blocking=False, stream=d2h)
    dt = pc() - t0
    before = float(out[-1])
    d2h.synchronize()
    after_ok = bool((out == numpy.arange(n, dtype=numpy.float32)).all())
    report(
        verdict(dt < 0.005 and before == -1 and after_ok),
        "a.get(out=pinned, blocking=False, stream=d2h) is asynchronous",
        f"4 MiB behind a 50 ms kernel on d2h: call returned in {dt * 1e3:.3f} ms, out still sentinel "
        f"({before}) then; correct after d2h.synchronize(): {after_ok}",
        ms=dt * 1e3,
    )
    pageable = numpy.full(n, -1, dtype=numpy.float32)
    spin(d2h, 50)
    t0 = pc()
    a.get(out=pageable, blocking=False, stream=d2h)
    dt2 = pc() - t0
    d2h.synchronize()
    report(
        "INFO",
        "a.get(out=pageable, blocking=False)",
        f"4 MiB behind a 50 ms kernel: call returned in {dt2 * 1e3:.2f} ms",
        ms=dt2 * 1e3,
    )

    rows = {}
    for label, nbytes, pinned in [
        ("pageable 4 KiB", 4 << 10, False),
        ("pageable 64 MiB", 64 << 20, False),
        ("pinned 4 KiB", 4 << 10, True),
        ("pinned 64 MiB", 64 << 20, True),
    ]:
        m = nbytes // 4
        src = cupyx.empty_pinned((m,), dtype=numpy.float32) if pinned else numpy.empty(m, dtype=numpy.float32)
        src[:] = 1
        with s:
            dst = cupy.empty(m, dtype=numpy.float32)
        s.synchronize()
        spin(s, 50)
        t0 = pc()
        dst.set(src, stream=s)
        dt = pc() - t0
        s.synchronize()
        rows[label] = dt * 1e3
    ok = rows["pinned 4 KiB"] < 5 and rows["pinned 64 MiB"] < 5
    report(
        verdict(ok),
        "dev.set(pinned, stream) is asynchronous",
        "set() behind a 50 ms kernel on the same stream returned in: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in rows.items()),
        **rows,
    )
    pg = rows["pageable 4 KiB"] >= 45 or rows["pageable 64 MiB"] >= 45
    report(
        verdict(pg),
        "set() from pageable memory is a host sync",
        f"pageable 4 KiB {rows['pageable 4 KiB']:.2f} ms, pageable 64 MiB {rows['pageable 64 MiB']:.2f} ms "
        f"(50 ms kernel ahead on the stream)",
    )

    src = cupyx.empty_pinned((1024,), dtype=numpy.float32)
    src[:] = 1
    with s:
        dst = cupy.empty(1024, dtype=numpy.float32)
    s.synchronize()
    rc0 = sys.getrefcount(src)
    spin(s, 50)
    dst.set(src, stream=s)
    rc1 = sys.getrefcount(src)
    src[:] = 2  # host write after set() returned, before the copy ran
    s.synchronize()
    val = float(dst[0].get(stream=s))
    report(
        verdict(rc1 == rc0 and val == 2.0),
        "set() from pinned memory keeps no reference and reads the source when the copy runs",
        f"refcount of the pinned source {rc0} before, {rc1} after set(); a host write of 2 after set() "
        f"returned (copy still queued) -> device got {val}",
    )


def p_pool_limit() -> None:
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    old = pool.get_limit()
    base = pool.total_bytes()
    mib = 1 << 20
    try:
        pool.set_limit(size=base + 64 * mib)
        try:
            x = cupy.empty(128 * mib, dtype=numpy.uint8)
            del x
            exc = "no error"
            ok = False
        except Exception as ex:
            exc = f"{type(ex).__module__}.{type(ex).__name__}: {ex}"
            ok = isinstance(ex, cupy.cuda.memory.OutOfMemoryError) and isinstance(ex, MemoryError)
        y = cupy.empty(40 * mib, dtype=numpy.uint8)
        del y
        cached = pool.total_bytes() - base
        z = cupy.empty(48 * mib, dtype=numpy.uint8)
        after = pool.total_bytes() - base
        del z
    finally:
        pool.set_limit(size=old)
        pool.free_all_blocks()
    report(
        verdict(ok),
        "set_limit: exceeding it raises OutOfMemoryError (a MemoryError)",
        f"limit +64 MiB, asking 128 MiB -> {exc}",
    )
    report(
        verdict(cached == 40 * mib and after == 48 * mib),
        "at the limit the pool frees its cached blocks and retries",
        f"40 MiB freed and cached (pool total +{cached / mib:.0f} MiB), then 48 MiB under the 64 MiB limit: "
        f"allocation succeeded, pool total +{after / mib:.0f} MiB",
    )


def p_pool_reuse_hazard() -> None:
    a, b = nb_stream(), nb_stream()
    n = 1 << 20
    with a:
        x = cupy.ones(n, dtype=numpy.float32)
    xptr = x.data.ptr
    ex = cupy.cuda.Event()
    ex.record(a)
    b.wait_event(ex)
    with b:
        spin(b, 100)
        y = cupy.empty(n, dtype=numpy.float32)
        y[...] = x  # reads x after 100 ms
    del x  # the host drops x while b still has to read it
    with a:
        z = cupy.empty(n, dtype=numpy.float32)
        zptr = z.data.ptr
        z.fill(7)
    b.synchronize()
    a.synchronize()
    ymax, ymin = float(y.max().get(stream=b)), float(y.min().get(stream=b))
    report(
        verdict(zptr == xptr and ymax == 7.0),
        "a freed block is reused at once on its arena's stream, even if another stream still reads it (cupy#8068)",
        f"x (4 MiB, allocated on A) read by B after 100 ms; host del x; next 4 MiB allocation on A got the "
        f"same pointer={zptr == xptr} and filled it with 7; B's copy of x holds min {ymin} max {ymax} "
        f"(1 = safe, 7 = B read the new owner's data)",
        same_ptr=zptr == xptr,
        ymin=ymin,
        ymax=ymax,
    )
    with a:
        w = cupy.empty(n, dtype=numpy.float32)
    wptr = w.data.ptr
    del w
    with b:
        v = cupy.empty(n, dtype=numpy.float32)
    same_other = v.data.ptr == wptr
    del v
    nptr = cupy.empty(n, dtype=numpy.float32).data.ptr
    report(
        "INFO",
        "pool arenas are per stream",
        f"block freed from A's arena handed to an allocation on B: {same_other}; to one on the null "
        f"stream: {nptr == wptr}",
    )


def p_graphs() -> None:
    s = nb_stream()
    a = cupy.zeros(1, dtype=numpy.float32)
    a += 0
    cupy.cuda.Device().synchronize()
    count = [0]

    def cb(_: Any) -> None:
        count[0] += 1

    with s:
        s.begin_capture()
        a += 1
        s.launch_host_func(cb, 0)
        g = s.end_capture()
    time.sleep(0.02)
    at_capture = float(a.get(stream=s)[0])
    cb_at_capture = count[0]
    for _ in range(3):
        g.launch(s)
    s.synchronize()
    time.sleep(0.02)
    val = float(a.get(stream=s)[0])
    report(
        verdict(at_capture == 0.0 and cb_at_capture == 0 and val == 3.0),
        "begin_capture/end_capture/launch: captured work does not run at capture time",
        f"after capture a={at_capture}, callback count {cb_at_capture}; after 3 launches a={val}",
    )
    report(
        verdict(count[0] == 3),
        "host callbacks in a captured graph fire on each replay",
        f"3 replays -> callback ran {count[0]} times",
    )

    variants = [
        "get",
        "item",
        "stream_sync",
        "other_stream_sync",
        "event_sync_other",
        "event_query_other",
        "device_sync",
        "alloc_new_block",
    ]
    res = run_subs([f"capture_sync:{v}" for v in variants] + ["capture_cublas:cold", "capture_cublas:warm"])
    parts = []
    invalidated = []
    for v in variants:
        r = res[f"capture_sync:{v}"]
        if r.get("hung"):
            parts.append(f"{v}: HUNG")
            continue
        parts.append(
            f"{v}: op -> {r.get('op')}; end_capture -> {r.get('end_capture')}; replay value "
            f"{r.get('value_after_one_replay')}; stream usable after: {r.get('stream_usable_after')}"
        )
        if r.get("end_capture") != "ok":
            invalidated.append(v)
    report(
        verdict("stream_sync" in invalidated),
        "a synchronisation during capture fails the capture",
        " | ".join(parts),
        **{v: res[f"capture_sync:{v}"] for v in variants},
    )
    for mode in ("cold", "warm"):
        r = res[f"capture_cublas:{mode}"]
        report(
            "INFO",
            f"cuBLAS matmul during capture ({mode}: {'after a warm-up matmul' if mode == 'warm' else 'no warm-up'})",
            "HUNG"
            if r.get("hung")
            else f"matmul -> {r.get('matmul')}; end_capture -> {r.get('end_capture')}; "
            f"value {r.get('value')} (64 expected)",
            **r,
        )


def _per_us(n: int, fn: Callable[[], None]) -> float:
    t0 = pc()
    fn()
    return (pc() - t0) / n * 1e6


def p_costs() -> None:
    s, s2 = nb_stream(), nb_stream()
    n = 10000
    evs: list[Any] = []
    rows: dict[str, float] = {}
    rows["Event()"] = _per_us(n, lambda: evs.extend(cupy.cuda.Event() for _ in range(n)))
    evs2: list[Any] = []
    rows["Event(disable_timing=True)"] = _per_us(
        n, lambda: evs2.extend(cupy.cuda.Event(disable_timing=True) for _ in range(n))
    )
    evs3: list[Any] = []
    rows["Event(block=True, disable_timing=True)"] = _per_us(
        n, lambda: evs3.extend(cupy.cuda.Event(block=True, disable_timing=True) for _ in range(n))
    )

    def rec() -> None:
        for e in evs2:
            e.record(s)

    rows["e.record(s)"] = _per_us(n, rec)

    def wait() -> None:
        for e in evs2:
            s2.wait_event(e)

    rows["s.wait_event(e)"] = _per_us(n, wait)
    s.synchronize()
    s2.synchronize()

    def query() -> None:
        for e in evs2:
            _ = e.done

    rows["e.done (passed)"] = _per_us(n, query)
    hits = [0]

    def noop(_: Any) -> None:
        hits[0] += 1

    m = 5000

    def hf() -> None:
        for i in range(m):
            s.launch_host_func(noop, i)

    rows["s.launch_host_func(cb, i)"] = _per_us(m, hf)
    t0 = pc()
    s.synchronize()
    rows["host callbacks drained after enqueue (per callback)"] = (pc() - t0) / m * 1e6
    scratch = cupy.zeros(2, dtype=numpy.uint64)
    spin_fn = K.get("spin")
    zero, i0 = numpy.uint64(0), numpy.int32(0)

    def launch() -> None:
        for _ in range(n):
            spin_fn((1,), (1,), (zero, scratch, i0), stream=s)

    launch()
    s.synchronize()
    rows["RawKernel launch (empty)"] = _per_us(n, launch)
    s.synchronize()
    with s:
        x = cupy.zeros(256, dtype=numpy.float32)

    def elem() -> None:
        with s:
            for _ in range(n):
                cupy.add(x, 1, out=x)

    elem()
    s.synchronize()
    rows["x += 1 (256 floats, CuPy elementwise)"] = _per_us(n, elem)
    s.synchronize()

    # Event creation from 4 threads at once (context lock?)
    def make(k: int) -> None:
        for _ in range(k):
            cupy.cuda.Event(disable_timing=True)

    ths = [threading.Thread(target=make, args=(n // 4,)) for _ in range(4)]
    t0 = pc()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    rows["Event(disable_timing=True), 4 threads at once (wall per event)"] = (pc() - t0) / n * 1e6
    report(
        "INFO",
        "costs (us per call, host side)",
        ", ".join(f"{k} {v:.2f}" for k, v in rows.items()),
        **rows,
    )


# ----------------------------------------------------------------------------- completion designs


class Poster:
    """Coalesced wake-up of the loop: tokens from any thread, one call_soon_threadsafe per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_token: Callable[[int], None]) -> None:
        self.loop = loop
        self.on_token = on_token
        self.pending: collections.deque[int] = collections.deque()
        self.lock = threading.Lock()
        self.scheduled = False
        self.wakeups = 0

    def post(self, toks: Any) -> None:
        self.pending.extend(toks)
        with self.lock:
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def post1(self, tok: int) -> None:
        self.pending.append(tok)
        with self.lock:
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            self.scheduled = False
        self.wakeups += 1
        pending = self.pending
        while pending:
            self.on_token(pending.popleft())


class Watcher(threading.Thread):
    """Design (a): one thread per stream blocked in Event.synchronize(), then a sweep with .done."""

    def __init__(self, poster: Poster, recycle: collections.deque[Any]) -> None:
        super().__init__(daemon=True)
        self.poster = poster
        self.recycle = recycle
        self.items: collections.deque[tuple[Any, int]] = collections.deque()
        self.sem = threading.Semaphore(0)
        self.sweeps = 0

    def submit(self, ev: Any, tok: int) -> None:
        self.items.append((ev, tok))
        self.sem.release()

    def stop(self) -> None:
        self.submit(None, -1)

    def run(self) -> None:
        cupy.cuda.Device(0).use()
        items = self.items
        while True:
            self.sem.acquire()
            ev, tok = items.popleft()
            if ev is None:
                return
            ev.synchronize()
            toks = [tok]
            self.recycle.append(ev)
            while items:
                ev2, tok2 = items[0]
                if ev2 is None or not ev2.done:
                    break
                self.sem.acquire()
                items.popleft()
                toks.append(tok2)
                self.recycle.append(ev2)
            self.sweeps += 1
            self.poster.post(toks)


def calibrate(s: Any, n: int = 300) -> tuple[float, float]:
    """Offset (globaltimer ns - perf_counter_ns) and the width of its bracket, in ns."""
    ts = cupy.zeros(n, dtype=numpy.uint64)
    stamp = K.get("stamp")
    host = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        stamp((1,), (1,), (ts, numpy.int32(i)), stream=s)
        s.synchronize()
        host.append((t0, time.perf_counter_ns()))
    g = [int(v) for v in ts.get(stream=s)]
    lo = max(g[i] - host[i][1] for i in range(20, n))
    hi = min(g[i] - host[i][0] for i in range(20, n))
    return (lo + hi) / 2, hi - lo


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def latency_run(design: str, s: Any, n: int, spin_ns: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    futs: dict[int, asyncio.Future[None]] = {}

    def on_token(tok: int) -> None:
        futs.pop(tok).set_result(None)

    poster = Poster(loop, on_token)
    recycle: collections.deque[Any] = collections.deque()
    watcher = None
    if design.startswith("a"):
        block = design == "a_watcher_block"
        for _ in range(64):
            recycle.append(cupy.cuda.Event(block=block, disable_timing=True))
        watcher = Watcher(poster, recycle)
        watcher.start()
    cb = poster.post1
    ts = cupy.zeros(2 * n, dtype=numpy.uint64)
    spin_fn = K.get("spin")
    ns = numpy.uint64(spin_ns)
    t_launch: list[int] = []
    t_wake: list[int] = []
    for i in range(n):
        fut = loop.create_future()
        futs[i] = fut
        tl = time.perf_counter_ns()
        spin_fn((1,), (1,), (ns, ts, numpy.int32(i)), stream=s)
        if watcher is not None:
            ev = recycle.popleft()
            ev.record(s)
            watcher.submit(ev, i)
        else:
            s.launch_host_func(cb, i)
        await fut
        t_wake.append(time.perf_counter_ns())
        t_launch.append(tl)
    if watcher is not None:
        watcher.stop()
        watcher.join()
    g = [int(v) for v in ts.get(stream=s)]
    return {
        "t_launch": t_launch,
        "t_wake": t_wake,
        "g_end": g[1::2],
        "g_start": g[0::2],
        "wakeups": poster.wakeups,
    }


async def burst_run(design: str, s: Any, n: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(n)]
    all_done = loop.create_future()
    left = [n]

    def on_token(tok: int) -> None:
        futs[tok].set_result(None)
        left[0] -= 1
        if left[0] == 0:
            all_done.set_result(None)

    poster = Poster(loop, on_token)
    recycle: collections.deque[Any] = collections.deque()
    watcher = None
    evs: list[Any] = []
    if design == "a_watcher_block":
        evs = [cupy.cuda.Event(block=True, disable_timing=True) for _ in range(n)]
        watcher = Watcher(poster, recycle)
        watcher.start()
    cb = poster.post1
    scratch = cupy.zeros(2, dtype=numpy.uint64)
    spin_fn = K.get("spin")
    zero, i0 = numpy.uint64(0), numpy.int32(0)
    s.synchronize()
    t0 = pc()
    for i in range(n):
        spin_fn((1,), (1,), (zero, scratch, i0), stream=s)
        if watcher is not None:
            evs[i].record(s)
            watcher.submit(evs[i], i)
        else:
            s.launch_host_func(cb, i)
    t1 = pc()
    await all_done
    t2 = pc()
    sweeps = 0
    if watcher is not None:
        watcher.stop()
        watcher.join()
        sweeps = watcher.sweeps
    return {
        "launch_s": t1 - t0,
        "total_s": t2 - t0,
        "per_task_us": (t2 - t0) / n * 1e6,
        "tasks_per_s": n / (t2 - t0),
        "loop_wakeups": poster.wakeups,
        "watcher_sweeps": sweeps,
    }


def p_completion_designs() -> None:
    s = nb_stream()
    n = 3000
    spin_ns = 20_000  # 20 us kernels
    designs = ["a_watcher_block", "b_host_func", "a_watcher_spin"]
    # warm-up
    for d in designs:
        asyncio.run(latency_run(d, s, 50, spin_ns))
    summary: dict[str, Any] = {}
    for d in designs:
        off0, w0 = calibrate(s)
        r = asyncio.run(latency_run(d, s, n, spin_ns))
        off1, w1 = calibrate(s)
        off = (off0 + off1) / 2
        lat = [(tw - (ge - off)) / 1e3 for tw, ge in zip(r["t_wake"], r["g_end"], strict=True)]
        host = [(tw - tl - spin_ns) / 1e3 for tw, tl in zip(r["t_wake"], r["t_launch"], strict=True)]
        start = [(gs - off - tl) / 1e3 for gs, tl in zip(r["g_start"], r["t_launch"], strict=True)]
        summary[d] = {
            "p50_us": _pct(lat, 50),
            "p90_us": _pct(lat, 90),
            "p99_us": _pct(lat, 99),
            "max_us": max(lat),
            "host_p50_us": _pct(host, 50),
            "host_p99_us": _pct(host, 99),
            "launch_to_kernel_start_p50_us": _pct(start, 50),
            "calib_width_us": (w0 / 1e3, w1 / 1e3),
            "calib_drift_us": (off1 - off0) / 1e3,
            "loop_wakeups": r["wakeups"],
        }
        m = summary[d]
        report(
            "INFO",
            f"completion latency, design {d}",
            f"{n} serial 20 us kernels: kernel end -> awakened coroutine p50 {m['p50_us']:.1f} us, p90 "
            f"{m['p90_us']:.1f}, p99 {m['p99_us']:.1f}, max {m['max_us']:.0f}; host-only view (wake - launch - "
            f"20 us) p50 {m['host_p50_us']:.1f} p99 {m['host_p99_us']:.1f}; launch -> kernel start p50 "
            f"{m['launch_to_kernel_start_p50_us']:.1f} us; clock bracket {m['calib_width_us'][0]:.1f}/"
            f"{m['calib_width_us'][1]:.1f} us, drift {m['calib_drift_us']:.1f} us",
            **m,
            lat_us_sample=lat[:: max(1, n // 200)],
        )
    for d in ("a_watcher_block", "b_host_func"):
        asyncio.run(burst_run(d, s, 200))
        r = asyncio.run(burst_run(d, s, 10000))
        report(
            "INFO",
            f"burst of 10000 tiny kernels, design {d}",
            f"launch loop {r['launch_s'] * 1e3:.1f} ms, all 10000 futures resolved after {r['total_s'] * 1e3:.1f} ms "
            f"({r['per_task_us']:.2f} us/task, {r['tasks_per_s']:.0f} tasks/s); loop wake-ups {r['loop_wakeups']}, "
            f"watcher sweeps {r['watcher_sweeps']}",
            **r,
        )


def p_launch_threads() -> None:
    k = 4
    n = 20000
    streams = [nb_stream() for _ in range(k)]
    xs = []
    for st in streams:
        with st:
            xs.append(cupy.zeros(256, dtype=numpy.float32))
    scratch = cupy.zeros(2, dtype=numpy.uint64)
    spin_fn = K.get("spin")
    zero, i0 = numpy.uint64(0), numpy.int32(0)
    evs = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]

    def op_raw(x: Any) -> None:
        spin_fn((1,), (1,), (zero, scratch, i0))  # current stream

    def op_elem(x: Any) -> None:
        x += 1

    rows: dict[str, float] = {}
    for opname, op in (("empty RawKernel", op_raw), ("x += 1 (CuPy elementwise)", op_elem)):
        for j, st in enumerate(streams):  # warm-up
            with st:
                op(xs[j])
        runtime.deviceSynchronize()

        def per_stream(j: int, op: Callable[[Any], None] = op) -> None:
            cupy.cuda.Device(0).use()
            st = streams[j]
            st.use()
            x = xs[j]
            for i in range(j, n, k):
                op(x)
                evs[i].record(st)
            cupy.cuda.Stream.null.use()

        ths = [threading.Thread(target=per_stream, args=(j,)) for j in range(k)]
        t0 = pc()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        rows[f"{opname}: one thread per stream ({k} threads)"] = (pc() - t0) / n * 1e6
        runtime.deviceSynchronize()

        t0 = pc()
        for i in range(n):
            j = i % k
            st = streams[j]
            with st:
                op(xs[j])
                evs[i].record(st)
        rows[f"{opname}: one thread switching `with stream:`"] = (pc() - t0) / n * 1e6
        runtime.deviceSynchronize()

        st = streams[0]
        t0 = pc()
        with st:
            for i in range(n):
                op(xs[0])
                evs[i].record(st)
        rows[f"{opname}: one thread, one stream, no switch"] = (pc() - t0) / n * 1e6
        runtime.deviceSynchronize()
    report(
        "INFO",
        "launch cost per task (kernel + event record), us",
        "; ".join(f"{kk} {v:.2f}" for kk, v in rows.items()),
        **rows,
    )


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--sub":
        sub_main(sys.argv[2])
        return
    faulthandler.dump_traceback_later(480, exit=True)
    t_start = pc()
    K.get("spin")
    for fn in (
        p_environment,
        p_streams_nonblocking,
        p_current_stream_per_thread,
        p_device_per_thread,
        p_event_record_default_stream,
        p_wait_event_snapshot,
        p_never_recorded,
        p_event_block,
        p_numpy_asarray,
        p_hidden_syncs,
        p_copies,
        p_pool_limit,
        p_pool_reuse_hazard,
        p_graphs,
        p_host_func,
        p_failed_kernel,
        p_costs,
        p_completion_designs,
        p_launch_threads,
    ):
        t0 = pc()
        probe(fn)
        print(f"# {fn.__name__} took {pc() - t0:.1f} s", flush=True)
    counts = collections.Counter(r["status"] for r in RESULTS)
    print(f"# done in {pc() - t_start:.1f} s: {dict(counts)}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    os._exit(0)


if __name__ == "__main__":
    main()
