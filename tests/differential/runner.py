"""Runs a program on a real engine (asyncio or trio) and collects every outcome; every wait is bounded."""

from __future__ import annotations

import concurrent.futures as cf
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

import schedsvc as ss

from .program import (
    MOD,
    ON_CUPY,
    ROWS,
    UNARY,
    VIEWS,
    Outcome,
    Program,
    Stmt,
    add,
    add_into,
    add_value,
    as_int,
    fail_add,
    fail_hidden,
    fresh_buffers,
    gather,
    hidden_read,
    hidden_write,
    mix,
    raise_injected,
    show,
    total,
    total2,
    value,
    value_outcome,
    weighted,
    weights_of,
)

#: A statement (or the final wait, or the close) that takes longer than this has hung.
STEP_TIMEOUT = 10.0

#: The kinds of statement that observe: each gives one outcome, in program order.
OBSERVING = frozenset({"observe", "run", "map", "g_await", "t_asarray_await", "x_observe"})

#: Programs of these families alone submit everything within the limits: ``stats().pending`` never passes
#: ``max_pending`` after a statement (Tensor operators, executor and batching paths may pass them).
WITHIN_LIMITS = frozenset({"submit", "views", "compile", "outputs", "saved", "cancel", "failures"})

#: What an await cancelled before it gave its value leaves in its handle.
CANCELLED_AWAIT = object()

EXECUTOR_FNS: dict[str, Callable[..., Any]] = {
    "total": total,
    "value": value,
    "raise_injected": raise_injected,
}


def error_outcome(exc: BaseException) -> Outcome:
    cause = exc.__cause__
    if isinstance(exc, ss.DependencyError):
        return ("error", "DependencyError", None if cause is None else type(cause).__name__)
    return ("error", type(exc).__name__, None)


@dataclass
class Result:
    outcomes: list[Outcome] = field(default_factory=list)
    buffers: list[np.ndarray] | None = None
    failure: str | None = None  # the program did not run to its end: why
    hang: bool = False
    messages: list[str] = field(default_factory=list)  # the error messages of error outcomes, for reports


class Interpreter:
    def __init__(self, eng: ss.Engine, result: Result, folder: str) -> None:
        self.eng = eng
        self.ex = eng.executor()
        self.buffers = fresh_buffers()
        self.handles: dict[str, Any] = {}
        self.result = result
        self.folder = folder  # where compiled functions are saved
        self.saves = 0

    def view(self, x: Any) -> np.ndarray:
        if x[0] == "V":
            return VIEWS[x[2]](self.buffers[x[1]])
        return self.buffers[x[1]].reshape(2, 4)[x[2] : x[3]]

    async def arg(self, x: Any) -> Any:
        if isinstance(x, int | str):
            return x
        if isinstance(x, list):
            return [await self.arg(y) for y in x]
        if isinstance(x, dict):
            return {k: await self.arg(v) for k, v in x.items()}
        if x[0] in ("V", "R"):
            return self.view(x)
        if x[0] in ("H", "T"):
            return self.handles[x[1]]
        assert x[0] == "FAILED", x
        src = await self.eng.submit(raise_injected) if x[1] is None else self.handles[x[1]]
        return self.eng.asarray(src, shape=x[2], dtype=np.int64)

    async def admit(self, make: Callable[[], Any]) -> Any:
        """A call that does not wait for room (submit_nowait, f(x), g(x), executor on the loop): made after
        ``throttle``, and made again if refused (a refused call registers nothing, so this is the same
        program)."""
        while True:
            await self.eng.throttle()
            try:
                return make()
            except ss.QueueFull:
                await anyio.sleep(0.0005)

    async def submit(self, s: Stmt, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if s.nowait:
            fut = await self.admit(lambda: self.eng.submit_nowait(fn, *args, **kwargs))
        else:
            fut = await self.eng.submit(fn, *args, **kwargs)
        assert s.out is not None
        self.handles[s.out] = fut

    def record(self, outcome: Outcome, message: str = "") -> None:
        self.result.outcomes.append(outcome)
        self.result.messages.append(message)

    async def cancelled_after(self, checkpoints: int, make: Callable[[], Awaitable[Any]]) -> Any:
        """Await ``make()``, cancelling the await once the loop has passed ``checkpoints`` more times: its
        value (or the exception it raised), or ``CANCELLED_AWAIT`` if the cancellation came first."""
        got: list[Any] = []

        async def cancel_later() -> None:
            for _ in range(checkpoints):
                await anyio.lowlevel.checkpoint()
            outer.cancel()

        with anyio.CancelScope() as outer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_later)
                try:
                    got.append(await make())
                except Exception as exc:  # (TaskCancelled included: a task cancelled before)
                    got.append(exc)
                tg.cancel_scope.cancel()
        return got[0] if got else CANCELLED_AWAIT

    async def observe(self, awaitable: Any) -> None:
        if awaitable is CANCELLED_AWAIT:  # its submission was cancelled: the task was never admitted
            self.record(("error", "TaskCancelled", None), "the awaited submission was cancelled")
            return
        try:
            if isinstance(awaitable, cf.Future):
                v = await anyio.to_thread.run_sync(awaitable.result, STEP_TIMEOUT)
            else:
                v = await awaitable
        except cf.TimeoutError:
            raise
        except Exception as exc:
            self.record(error_outcome(exc), f"{type(exc).__name__}: {exc}")
        else:
            self.record(value_outcome(v))

    async def step(self, s: Stmt) -> None:
        k, ops, a = s.kind, s.ops, self.arg
        if k in ("add", "g_write"):
            v = await a(ops[0])
            await self.submit(s, add, v, ops[1], out=v)
        elif k == "read" or k == "t_submit":
            await self.submit(s, total, await a(ops[0]))
        elif k == "read2":
            await self.submit(s, total2, await a(ops[0]), await a(ops[1]))
        elif k == "mix":
            await self.submit(s, mix, await a(ops[0]), out=await a(ops[1]))
        elif k == "value":
            await self.submit(s, value, await a(ops[0]), ops[1])
        elif k == "add_value":
            v = await a(ops[0])
            await self.submit(s, add_value, v, await a(ops[1]), out=v)
        elif k == "gather":
            await self.submit(s, gather, await a(ops[0]), await a(ops[1]))
        elif k == "hidden_write":
            v = await a(ops[0])
            await self.submit(s, hidden_write(v), writes=[v])
        elif k == "hidden_read":
            v = await a(ops[0])
            await self.submit(s, hidden_read(v), reads=(v,))
        elif k == "fail":
            await self.submit(s, raise_injected)
        elif k == "fail_out":
            v = await a(ops[0])
            await self.submit(s, fail_add, v, 1, out=v)
        elif k == "fail_hidden":
            v = await a(ops[0])
            await self.submit(s, fail_hidden(v), writes=[v])
        elif k in ("t_task_write", "k_task_write"):
            t = await a(ops[0])
            await self.submit(s, add_into, t, ops[1], out=t, device=t.device)
        elif k == "k_submit":
            await self.submit(s, np.add, await a(ops[0]), ops[1], device="cuda:0")
        elif k == "run":
            await self.observe(self.eng.run(total, await a(ops[0])))
        elif k == "observe":
            await self.observe(self.handles[ops[0][1]])
        elif k == "x_submit":
            view = await a(ops[0])
            got = await self.cancelled_after(ops[1], lambda: self.eng.submit(total, view))
            if isinstance(got, Exception):
                raise got
            self.handles[s.out] = got  # type: ignore[index]
        elif k == "x_observe":
            h = self.handles[ops[0][1]]
            if h is CANCELLED_AWAIT:
                await self.observe(h)
                return
            got = await self.cancelled_after(ops[1], lambda: h)
            if got is CANCELLED_AWAIT:
                self.record(("interrupted",), "the await was cancelled")
            elif isinstance(got, Exception):
                self.record(error_outcome(got), f"{type(got).__name__}: {got}")
            else:
                self.record(value_outcome(got))
        elif k == "x_waitall":
            await self.cancelled_after(ops[0], self.eng.waitall)
        elif k == "x_throttle":
            await self.cancelled_after(ops[0], self.eng.throttle)
        elif k == "e_loop":
            fn, args = EXECUTOR_FNS[ops[0]], [await a(x) for x in ops[1:]]
            self.handles[s.out] = await self.admit(lambda: self.ex.submit(fn, *args))  # type: ignore[index]
        elif k == "e_thread":
            fn, args = EXECUTOR_FNS[ops[0]], [await a(x) for x in ops[1:]]
            self.handles[s.out] = await anyio.to_thread.run_sync(lambda: self.ex.submit(fn, *args))  # type: ignore[index]
        elif k == "map":
            items = await a(ops[0])
            values: list[Outcome] = []
            error: Outcome | None = None
            try:
                async for r in self.eng.map(as_int, items):
                    values.append(value_outcome(r))
            except Exception as exc:
                error = error_outcome(exc)
            self.record(("map", tuple(values), error))
        else:
            await self.tensor_step(s)

    async def tensor_step(self, s: Stmt) -> None:
        k, ops, a, h = s.kind, s.ops, self.arg, self.handles
        out = s.out
        if k == "t_asarray":
            h[out] = self.eng.asarray(await a(ops[0]))
        elif k == "t_asarray_await":
            h[out] = self.eng.asarray(await a(ops[0]))
            await self.observe(h[out])
        elif k == "k_asarray":
            h[out] = self.eng.asarray(await a(ops[0]), device="cuda:0")
        elif k == "k_to":
            h[out] = (await a(ops[0])).to(ops[1])
        elif k == "t_zeros":
            h[out] = self.eng.zeros(ops[0], dtype=np.int64)
        elif k == "t_arange":
            h[out] = self.eng.arange(ops[0], dtype=np.int64)
        elif k == "t_binop":
            x, y = await a(ops[0]), await a(ops[2])
            r = x + y if ops[1] == "+" else x - y if ops[1] == "-" else x * y
            h[out] = r % MOD
        elif k == "t_unary":
            x = await a(ops[0])
            h[out] = (-x) % MOD if ops[1] == "neg" else abs(x - 3)
        elif k == "t_reduce":
            x = await a(ops[0])
            h[out] = x.sum() % MOD if ops[1] == "sum" else x.max() if ops[1] == "max" else x.min()
        elif k == "t_view":
            h[out] = (await a(ops[0]))[ops[1] : ops[2]]
        elif k == "t_setitem":
            t = await a(ops[0])
            t[ops[1] : ops[2]] = await a(ops[3])
        elif k == "t_iop":
            t, x = await a(ops[0]), await a(ops[2])
            if ops[1] == "+=":
                t += x
            else:
                t -= x
            h[ops[0][1]] = t  # Python rebinds the name, as `t += x` does
        elif k == "t_outadd":
            t = await a(ops[0])
            np.add(await a(ops[1]), await a(ops[2]), out=t)
        elif k == "t_mod":
            t = await a(ops[0])
            t %= MOD
            h[ops[0][1]] = t
        elif k == "c_def":
            h[out] = self.eng.compile(UNARY[ops[0]])
        elif k == "c_def2":
            first, second = UNARY[ops[0]], UNARY[ops[1]]
            h[out] = self.eng.compile(lambda x: (first(x), second(x)))
        elif k == "c_call2":
            f, x = await a(ops[0]), await a(ops[1])
            h[out] = (await self.admit(lambda: f(x)))[ops[2]]
        elif k == "c_submit2":
            f, x = await a(ops[0]), await a(ops[1])
            h[out] = (await f.submit(x))[ops[2]]
        elif k == "c_saved":  # saved once a call traced it, loaded, called on the same argument
            f, x = await a(ops[0]), await a(ops[1])
            await self.admit(lambda: f(x))
            self.saves += 1
            path = f"{self.folder}/saved{self.saves}.json"
            f.save(path)
            loaded = ss.load(path, self.eng)
            result = await self.admit(lambda: loaded(x))
            h[out] = result[ops[2]] if len(ops) > 2 else result
        elif k == "x_csubmit":
            f, x = await a(ops[0]), await a(ops[1])
            got = await self.cancelled_after(ops[2], lambda: f.submit(x))
            if isinstance(got, Exception):
                raise got
            h[out] = got[ops[3]] if len(ops) > 3 and got is not CANCELLED_AWAIT else got
        elif k == "c_call":
            f, x = await a(ops[0]), await a(ops[1])
            h[out] = await self.admit(lambda: f(x))
        elif k == "c_submit":
            f, x = await a(ops[0]), await a(ops[1])
            h[out] = await f.submit(x)
        elif k == "g_def" and len(ops) > 2 and ops[2]:  # on cuda:0: its weights an argument there
            fn = ROWS[ops[0]]
            g = self.eng.compile(weighted(fn), batch_axis=0, batched=[0])
            w = self.eng.asarray(weights_of(fn), device="cuda:0")
            h[out] = lambda x: g(x, w)
        elif k == "g_def":
            h[out] = self.eng.compile(ROWS[ops[0]], batch_axis=0, exact=len(ops) > 1 and bool(ops[1]))
        elif k == "g_call":
            g, x = await a(ops[0]), await a(ops[1])
            h[out] = await self.admit(lambda: g(x))
        elif k == "g_await":
            g, x = await a(ops[0]), await a(ops[1])
            await self.observe(await self.admit(lambda: g(x)))
        else:
            raise AssertionError(f"unknown statement kind {k}")


async def run_program(program: Program) -> Result:
    result = Result()
    sim = None
    if program.config.cuda and not ON_CUPY:
        from schedsvc.devices.cudasim import simulator

        sim = simulator()
        sim.reset()
        sim.configure(seed=program.seed, max_delay_s=0.0003)
    eng = ss.Engine(**program.config.engine_options())
    with anyio.move_on_after(STEP_TIMEOUT) as scope:
        await eng.start()
    if scope.cancelled_caught:
        result.failure, result.hang = "the engine did not start", True
        return result
    folder = tempfile.TemporaryDirectory(prefix="schedsvc-difftest-")
    interp = Interpreter(eng, result, folder.name)
    limited = program.families <= WITHIN_LIMITS
    where = "the end"
    try:
        for i, s in enumerate(program.stmts):
            where = f"statement {i}: {show(s)}"
            with anyio.move_on_after(STEP_TIMEOUT) as scope:
                await interp.step(s)
            if scope.cancelled_caught:
                result.failure, result.hang = f"hung at {where}", True
                break
            pending = eng.stats().pending
            if limited and pending > program.config.max_pending:
                result.failure = f"{pending} tasks pending after {where}: over max_pending"
                break
        else:
            where = "eng.waitall() at the end"
            with anyio.move_on_after(STEP_TIMEOUT) as scope:
                await eng.waitall()
            if scope.cancelled_caught:
                result.failure, result.hang = f"hung at {where}", True
            else:
                result.buffers = [b.copy() for b in interp.buffers]
    except Exception as exc:
        result.failure = f"{where} raised {type(exc).__name__}: {exc}"
        result.hang = isinstance(exc, TimeoutError)  # an executor future's result() timed out
    finally:
        with anyio.move_on_after(STEP_TIMEOUT, shield=True) as scope:
            try:
                await eng.aclose(cancel_pending=result.failure is not None)
            except Exception as exc:
                result.failure = result.failure or f"aclose raised {type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            result.hang = True
            result.failure = result.failure or "hung in aclose()"
    folder.cleanup()
    if sim is not None:
        if sim.races:
            result.failure = result.failure or f"the CUDA simulator saw races: {sim.races[:2]}"
        sim.reset()
    return result


def run(program: Program) -> Result:
    """Run ``program`` on a fresh engine, under its async library."""
    return anyio.run(run_program, program, backend=program.config.backend)
