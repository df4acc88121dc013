"""Programs and the reference interpreter.

A program is a list of statements (``Stmt``) over ``N_BUFFERS`` shared int64 buffers and the handles that
earlier statements defined (futures, Tensors, compiled and batched functions, batched calls).  Statements
that *observe* (await a handle, ``eng.run``, ``eng.map``) produce outcomes; the runner and the reference
produce one outcome per observing statement, and the final buffers.

The reference (``Model.step``) is the contract, written as plain sequential NumPy:

- a task's value is what its function returns on the memory as every earlier statement left it;
- a task that raises stores its error; a task (or Tensor op) that takes the value of a failed one fails with
  ``DependencyError`` whose ``__cause__`` is the original error (the root: ``Injected``), without running;
- memory-only neighbours of a failed task still run, and see memory as it was (injected failures raise before
  they write);
- ``await t`` is the contents of ``t``'s memory at that point -- unless a write to that memory queued while
  a Tensor lived over it (a Tensor write, or a task's ``out=``/``writes=``) failed since the previous await of
  that memory: then the first such write's error, raised once (the await after it gives the memory);
- a batched call sees its input as it is at the call.

Cases the contract leaves open raise ``Rejected`` instead of guessing; the generator then draws another
statement (and the minimizer drops that candidate).  Left out that way, or never generated:

- an in-place write of a Tensor whose own creation failed;
- ``await eng.asarray(failed_future, shape=..., dtype=...)`` itself (its error: the future's, or a
  DependencyError?); it is only used as an operand, where both readings give DependencyError(Injected);
- a compiled call of a failed future (it has no shape);
- executor tasks that write (``out=`` is a keyword of the function there: tracked as a write or not?),
  and futures inside lists or dicts passed to ``executor().submit``;
- ``eng.map`` functions that write (after an item raises, which later items ran is not fixed);
- ``out=`` of a host array on a ``cuda:0`` task, and Tensor ops mixing a cuda Tensor with a NumPy array;
- batched calls of Tensors or failed inputs (not ambiguous: not generated yet).

Read as a Tensor op (a read that still runs after a failed write): ``t.to(device)``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.test_property import (
    MOD,
    N_BUFFERS,
    SIZE,
    VIEWS,
    Injected,
    add,
    add_value,
    fresh_buffers,
    gather,
    hidden_read,
    hidden_write,
    mix,
    total,
    total2,
    value,
)

__all__ = [
    "EXTRA_FAMILIES",
    "FAMILIES",
    "KINDS",
    "MOD",
    "Config",
    "Injected",
    "Model",
    "Outcome",
    "Program",
    "Rejected",
    "Stmt",
    "generate",
]

#: Every feature family a program can draw on.
#: "cupy": programs with cuda statements run on CuPy and a real GPU; anything else: on the CUDA simulator
ON_CUPY = os.environ.get("SCHEDSVC_TEST_CUDA", "") == "cupy"

FAMILIES = ("submit", "views", "tensor", "compile", "batched", "executor", "map", "failures", "cuda")
#: Families added later, apart so that the programs of the sets above (and their regression seeds) stay the
#: same: "outputs", compiled functions of two outputs under small limits; "saved", compiled functions saved,
#: loaded and replayed; "cancel", awaits cancelled after a few checkpoints (``x_*``).
EXTRA_FAMILIES = ("outputs", "saved", "cancel")

#: Values are kept under this bound (a statement that would pass it is not generated), so products of two
#: values never overflow int64 and NumPy never warns.
LIMIT = 2**30

VIEW_NAMES = [
    "{b}",
    "{b}[::2]",
    "{b}[1::2]",
    "{b}[2:6]",
    "{b}.reshape(2, 4)[1]",
    "{b}[5:6]",
    "as_strided({b}, (4,), (16,))",
    "np.asarray(memoryview({b}))[3:]",
    "np.frombuffer({b}, np.int64)[:4]",
]
BASIC_VIEWS = [0]  # without the "views" family: whole buffers only

Outcome = tuple[Any, ...]


class Rejected(Exception):
    """The statement's outcome is not fixed by the contract (or would leave the exact-value range)."""


# -- task bodies ------------------------------------------------------------------------------------------
# test_property's bodies (add, total, mix, ...) are reused; these are the ones a program adds.


def raise_injected(*args: Any, **kwargs: Any) -> None:
    """Fails before touching any memory."""
    raise Injected("injected failure")


def fail_add(view: Any, c: int, *, out: Any) -> None:
    """An ``out=`` write that raises before it writes."""
    raise Injected("injected failure before the write")


def fail_hidden(view: np.ndarray) -> Callable[[], None]:
    def body() -> None:
        raise Injected("injected failure before the hidden write")

    return body


def add_into(x: Any, c: int, *, out: Any) -> None:
    """A task write of a Tensor (``out=``), on the Tensor's device: returns nothing (no host sync)."""
    np.add(x, c, out=out)
    np.remainder(out, MOD, out=out)


def as_int(x: Any) -> int:
    return 0 if x is None else int(np.sum(x)) % MOD


def unary_a(x: Any) -> Any:
    return (x * 3 + 1) % MOD


def unary_b(x: Any) -> Any:
    return (x * x + 2) % MOD


def unary_c(x: Any) -> Any:
    return abs(x - 5) % MOD


W = (np.arange(16, dtype=np.int64).reshape(4, 4) * 7) % 5  # a constant, never written


def row_affine(x: Any) -> Any:
    return (x * 3 + 1) % MOD


def row_matmul(x: Any) -> Any:
    return (x @ W) % MOD


def row_max(x: Any) -> Any:
    return np.maximum(x, 7) - x


WF = np.linspace(-0.9, 0.7, 16).reshape(4, 4) / 7  # float weights: a product whose rounding may differ


def row_float(x: Any) -> Any:
    return np.tanh(x @ WF)


def weighted(fn: Any) -> Any:
    """``fn`` of the rows, its weights an argument (``w``): a batched function on ``cuda:0`` takes the
    weights there as an unbatched Tensor argument, never captured."""
    weights = {row_matmul: "W", row_float: "WF"}.get(fn)

    def on_device(x: Any, w: Any) -> Any:
        if weights == "W":
            return (x @ w) % MOD
        if weights == "WF":
            return np.tanh(x @ w)
        return fn(x) + w[0, 0] * 0  # (the weights on the device put the call there)

    return on_device


def weights_of(fn: Any) -> Any:
    """The weights ``weighted(fn)`` is given."""
    return WF if fn is row_float else W


UNARY = [unary_a, unary_b, unary_c]
UNARY_SRC = ["(x * 3 + 1) % MOD", "(x * x + 2) % MOD", "abs(x - 5) % MOD"]
ROWS = [row_affine, row_matmul, row_max, row_float]
ROWS_SRC = ["(x * 3 + 1) % MOD", "(x @ W) % MOD", "np.maximum(x, 7) - x", "np.tanh(x @ WF)"]
#: a batched float result of the default (fast) mode is compared within this relative tolerance (of the
#: largest value); exact mode's (``exact=True``), bit for bit
FAST_RTOL = 1e-12


def is_exact(s: Stmt) -> bool:
    """Whether a ``g_def`` compiles its function with ``exact=True`` (its second operand; default False)."""
    return len(s.ops) > 1 and bool(s.ops[1])


def on_cuda(s: Stmt) -> bool:
    """Whether a ``g_def``'s function runs on ``cuda:0`` (its third operand): its weights an argument there."""
    return len(s.ops) > 2 and bool(s.ops[2])


# -- statements -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stmt:
    """One statement: ``kind`` (a key of ``KINDS``), the handle it defines (``out``), and its operands.

    Operands are plain data: ``("V", k, v)`` is ``VIEWS[v](buffers[k])``; ``("R", k, r0, r1)`` is
    ``buffers[k].reshape(2, 4)[r0:r1]``; ``("H", name)`` is a handle; ``("T", name)`` a Tensor handle;
    ints are ints.
    """

    kind: str
    out: str | None
    ops: tuple[Any, ...]
    nowait: bool = False

    def uses(self) -> set[str]:
        found: set[str] = set()

        def walk(x: Any) -> None:
            if isinstance(x, tuple):
                if x and x[0] in ("H", "T", "FAILED") and isinstance(x[1], str):
                    found.add(x[1])
                for y in x:
                    walk(y)
            elif isinstance(x, list):
                for y in x:
                    walk(y)
            elif isinstance(x, dict):
                for y in x.values():
                    walk(y)

        walk(self.ops)
        return found


@dataclass(frozen=True)
class Config:
    workers: int
    max_pending: int
    max_pending_bytes: int
    backend: str  # "asyncio" or "trio"
    cuda: bool

    def engine_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "cpu_workers": self.workers,
            "max_pending": self.max_pending,
            "max_pending_bytes": self.max_pending_bytes,
        }
        if self.cuda:  # the CUDA simulator, or CuPy and a real GPU (SCHEDSVC_TEST_CUDA=cupy)
            options.update(devices=("cpu", "cuda:0"), cuda_simulator=not ON_CUPY)
        return options


@dataclass
class Program:
    seed: int
    families: frozenset[str]
    config: Config
    stmts: list[Stmt]

    def listing(self, keep: set[int] | None = None) -> str:
        """The program as Python-like lines (``keep``: only these statements, "..." for the others)."""
        c = self.config
        head = [
            f"# seed {self.seed}, families {','.join(sorted(self.families))}",
            f"# {c.backend}, Engine(cpu_workers={c.workers}, max_pending={c.max_pending}, "
            f"max_pending_bytes={c.max_pending_bytes}{', cuda simulator' if c.cuda else ''})",
            f"# B0..B{N_BUFFERS - 1} = np.arange({SIZE}, dtype=np.int64) * (k + 1); MOD = {MOD}",
        ]
        lines = []
        for i, s in enumerate(self.stmts):
            if keep is None or i in keep:
                lines.append(f"{i:3d}  {show(s)}")
            elif not lines or lines[-1] != "     ...":
                lines.append("     ...")
        return "\n".join(head + lines)


def show_operand(x: Any) -> str:
    if isinstance(x, tuple) and x and x[0] == "V":
        return VIEW_NAMES[x[2]].format(b=f"B{x[1]}")
    if isinstance(x, tuple) and x and x[0] == "R":
        return f"B{x[1]}.reshape(2, 4)[{x[2]}:{x[3]}]"
    if isinstance(x, tuple) and x and x[0] in ("H", "T"):
        return str(x[1])
    if isinstance(x, tuple) and x and x[0] == "FAILED":
        src = "await eng.submit(raise_injected)" if x[1] is None else x[1]
        return f"eng.asarray({src}, shape={x[2]}, dtype=np.int64)"
    if isinstance(x, list):
        return "[" + ", ".join(show_operand(y) for y in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {show_operand(v)}" for k, v in x.items()) + "}"
    return repr(x)


def show(s: Stmt) -> str:
    o = [show_operand(x) for x in s.ops] + ["?"] * 3
    lhs = f"{s.out} = " if s.out else ""
    sub = "eng.submit_nowait" if s.nowait else "await eng.submit"
    k = s.kind
    simple_submits = {
        "add": f"add, {o[0]}, {o[1]}, out={o[0]}",
        "g_write": f"add, {o[0]}, {o[1]}, out={o[0]}",
        "read": f"total, {o[0]}",
        "read2": f"total2, {o[0]}, {o[1]}",
        "mix": f"mix, {o[0]}, out={o[1]}",
        "value": f"value, {o[0]}, {o[1]}",
        "add_value": f"add_value, {o[0]}, {o[1]}, out={o[0]}",
        "gather": f"gather, {o[0]}, {o[1]}",
        "hidden_write": f"hidden_write({o[0]}), writes=[{o[0]}]",
        "hidden_read": f"hidden_read({o[0]}), reads=({o[0]},)",
        "fail": "raise_injected",
        "fail_out": f"fail_add, {o[0]}, 1, out={o[0]}",
        "fail_hidden": f"fail_hidden({o[0]}), writes=[{o[0]}]",
        "t_submit": f"total, {o[0]}",
        "k_submit": f"np.add, {o[0]}, {o[1]}, device='cuda:0'",
        "t_task_write": f"add_into, {o[0]}, {o[1]}, out={o[0]}, device={o[0]}.device",
        "k_task_write": f"add_into, {o[0]}, {o[1]}, out={o[0]}, device={o[0]}.device",
    }
    if k in simple_submits:
        return f"{lhs}{sub}({simple_submits[k]})"
    table = {
        "run": lambda: f"observe(await eng.run(total, {o[0]}))",
        "observe": lambda: f"observe(await {o[0]})",
        "t_asarray": lambda: f"eng.asarray({o[0]})",
        "t_asarray_await": lambda: f"eng.asarray({o[0]}); observe(await {s.out})",
        "t_zeros": lambda: f"eng.zeros({o[0]}, dtype=np.int64)",
        "t_arange": lambda: f"eng.arange({o[0]}, dtype=np.int64)",
        "t_binop": lambda: f"({o[0]} {s.ops[1]} {o[2]}) % MOD",
        "t_unary": lambda: f"(-{o[0]}) % MOD" if s.ops[1] == "neg" else f"abs({o[0]} - 3)",
        "t_reduce": lambda: f"{o[0]}.{s.ops[1]}()" + (" % MOD" if s.ops[1] == "sum" else ""),
        "t_view": lambda: f"{o[0]}[{o[1]}:{o[2]}]",
        "t_setitem": lambda: f"{o[0]}[{o[1]}:{o[2]}] = {o[3]}",
        "t_iop": lambda: f"{o[0]} {s.ops[1]} {o[2]}",
        "t_outadd": lambda: f"np.add({o[1]}, {o[2]}, out={o[0]})",
        "t_mod": lambda: f"{o[0]} %= MOD",
        "c_def": lambda: f"eng.compile(lambda x: {UNARY_SRC[s.ops[0]]})",
        "c_call": lambda: f"{o[0]}({o[1]})" if not s.nowait else f"{o[0]}({o[1]})  # nowait",
        "c_submit": lambda: f"await {o[0]}.submit({o[1]})",
        "c_def2": lambda: f"eng.compile(lambda x: ({UNARY_SRC[s.ops[0]]}, {UNARY_SRC[s.ops[1]]}))",
        "c_call2": lambda: f"{o[0]}({o[1]})[{o[2]}]",
        "c_submit2": lambda: f"(await {o[0]}.submit({o[1]}))[{o[2]}]",
        "c_saved": lambda: (
            f"ss.load(saved({o[0]}({o[1]})), eng)({o[1]})" + (f"[{o[2]}]" if len(s.ops) > 2 else "")
        ),
        "x_submit": lambda: f"await eng.submit(total, {o[0]})  # cancelled after {o[1]} checkpoints",
        "x_csubmit": lambda: (
            f"await {o[0]}.submit({o[1]})"
            + (f"[{o[3]}]" if len(s.ops) > 3 else "")
            + f"  # cancelled after {o[2]} checkpoints"
        ),
        "x_observe": lambda: f"observe(await {o[0]})  # cancelled after {o[1]} checkpoints",
        "x_waitall": lambda: f"await eng.waitall()  # cancelled after {o[0]} checkpoints",
        "x_throttle": lambda: f"await eng.throttle()  # cancelled after {o[0]} checkpoints",
        "g_def": lambda: (
            f"eng.compile(lambda x, w: {ROWS_SRC[s.ops[0]]} with w on cuda:0, batch_axis=0, batched=[0])"
            if on_cuda(s)
            else f"eng.compile(lambda x: {ROWS_SRC[s.ops[0]]}, batch_axis=0{', exact=True' if is_exact(s) else ''})"
        ),
        "g_call": lambda: f"{o[0]}({o[1]})",
        "g_await": lambda: f"observe(await {o[0]}({o[1]}))",
        "e_loop": lambda: (
            f"eng.executor().submit({o[0][1:-1]}, {', '.join(o[1 : len(s.ops)])})  # on the loop"
        ),
        "e_thread": lambda: (
            f"eng.executor().submit({o[0][1:-1]}, {', '.join(o[1 : len(s.ops)])})  # in a thread"
        ),
        "map": lambda: f"observe([r async for r in eng.map(as_int, {o[0]})])",
        "k_asarray": lambda: f"eng.asarray({o[0]}, device='cuda:0')",
        "k_to": lambda: f"{o[0]}.to({o[1]})",
    }
    return lhs + table[k]()


# -- the reference ----------------------------------------------------------------------------------------

INJ: Outcome = ("error", "Injected", None)
#: an await of a task that was cancelled; the outcome of an await that was itself cancelled
CANCELLED: Outcome = ("error", "TaskCancelled", None)
INTERRUPTED: Outcome = ("interrupted",)


def either(outcome: Outcome) -> Outcome:
    """The outcome of a task whose awaiting coroutine may have been cancelled before it started: its own,
    or cancelled."""
    return ("either", outcome, CANCELLED)


def dep(err: Outcome) -> Outcome:
    """The DependencyError of a task that takes the value of a task that failed with ``err``."""
    return ("error", "DependencyError", err[2] if err[1] == "DependencyError" else err[1])


def value_outcome(v: Any) -> Outcome:
    if not isinstance(v, np.ndarray | np.generic | int | float | list | dict) and hasattr(v, "get"):
        v = v.get()  # a device array: its host copy
    a = np.asarray(v)
    return ("value", a.dtype.str, a.shape, a.tolist())


def close_outcome(v: Any) -> Outcome:
    """What a batched call in the default (fast) mode must give: ``v`` to within rounding, where ``v`` is
    floating point (``same_outcome`` compares it so); else ``v`` exactly."""
    outcome = value_outcome(v)
    return ("close", *outcome[1:]) if np.asarray(v).dtype.kind in "fc" else outcome


def same_outcome(got: Outcome | None, want: Outcome | None) -> bool:
    """The engine's outcome is the reference's: equal, or for a ``close`` one, a value of the same dtype
    and shape within ``FAST_RTOL``."""
    if want is not None and want[0] == "either":  # any of these (an await that may have been cancelled)
        return any(same_outcome(got, w) for w in want[1:])
    if got is None or want is None or want[0] != "close":
        return got == want
    if got[0] != "value" or got[1:3] != want[1:3]:
        return False
    g, w = np.asarray(got[3], dtype=want[1]), np.asarray(want[3], dtype=want[1])
    scale = float(np.max(np.abs(w), initial=0.0))
    return bool(np.allclose(g, w, rtol=FAST_RTOL, atol=FAST_RTOL * scale, equal_nan=True))


@dataclass
class TInfo:
    mem: str  # the memory it lives in: "B0".. or the name of the Tensor that owns it
    start: int | None  # None: 0-d
    stop: int | None
    device: str
    error: Outcome | None = None  # its creation failed

    @property
    def length(self) -> int | None:
        return None if self.start is None else self.stop - self.start  # type: ignore[operator]


@dataclass
class Handle:
    #: future | exfuture | tensor | compiled | compiled2 | batched | call, and cfuture | ctensor: made by an
    #: await that may have been cancelled (observed only, never an input: its outcome is one of two)
    kind: str
    outcome: Outcome | None = None  # future, exfuture, call
    tensor: TInfo | None = None
    fn: int = 0  # compiled, batched: index into UNARY / ROWS
    fns: tuple[int, ...] = ()  # compiled2 (two outputs): an index into UNARY per output
    exact: bool = False  # batched: compiled with exact=True
    ints: bool = True  # a future whose value is an int (else an array)


@dataclass
class Model:
    """The sequential reference: state after each statement, and the outcomes observed so far."""

    buffers: list[np.ndarray] = field(default_factory=fresh_buffers)
    mem: dict[str, np.ndarray] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)  # mem -> the error the next await raises, or None
    handles: dict[str, Handle] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        for k, b in enumerate(self.buffers):
            self.mem[f"B{k}"] = b
            self.status[f"B{k}"] = None

    # views and values

    def view(self, x: Any) -> np.ndarray:
        if x[0] == "V":
            return VIEWS[x[2]](self.buffers[x[1]])
        assert x[0] == "R"
        return self.buffers[x[1]].reshape(2, 4)[x[2] : x[3]]

    def tval(self, t: TInfo) -> np.ndarray:
        m = self.mem[t.mem]
        return m[()] if t.start is None else m[t.start : t.stop]

    def tinfo(self, name: str) -> TInfo:
        info = self.handles[name].tensor
        assert info is not None
        return info

    def operand(self, x: Any) -> tuple[Any, Outcome | None]:
        """The value a Tensor op takes from ``x`` (a Tensor read still runs after a failed write)."""
        if isinstance(x, int):
            return x, None
        if x[0] in ("V", "R"):
            return self.view(x).copy(), None
        if x[0] == "FAILED":
            return np.zeros(x[2], dtype=np.int64), INJ  # a placeholder of its shape
        t = self.tinfo(x[1])
        value = np.array(self.tval(t), copy=True)
        if t.error is not None:
            return np.zeros_like(value), t.error
        return value, None

    def task_arg(self, x: Any) -> tuple[Any, Outcome | None]:
        """The value a task (submit, compiled call) takes from ``x``."""
        if isinstance(x, tuple) and x[0] == "H":
            h = self.handles[x[1]]
            assert h.outcome is not None
            if h.outcome[0] == "error":
                return None, h.outcome
            return h.outcome[3], None
        return self.operand(x)

    def write(self, mem: str, *, tensor: bool, error: Outcome | None) -> None:
        """Record a write of ``mem``: one that fails while a Tensor lives over ``mem`` is what the next await
        of a Tensor over it raises, once (the first since the previous await; a later write does not clear
        it).  A task's failed write queued before any Tensor lived there is its own future's error only."""
        if error is not None and self.status[mem] is None and (tensor or self.has_tensor(mem)):
            self.status[mem] = error

    def has_tensor(self, mem: str) -> bool:
        return any(h.tensor is not None and h.tensor.mem == mem for h in self.handles.values())

    def new_tensor(self, name: str, val: Any, device: str, error: Outcome | None) -> None:
        """A Tensor with memory of its own (``val``: a placeholder of its shape when it failed)."""
        arr = np.array(val, dtype=np.int64, copy=True)
        self.mem[name] = arr
        self.status[name] = None
        n = None if arr.ndim == 0 else arr.shape[0]
        self.handles[name] = Handle("tensor", tensor=TInfo(name, None if n is None else 0, n, device, error))

    def mem_of(self, x: Any) -> str:
        return f"B{x[1]}"

    def check_limits(self) -> None:
        for arr in self.mem.values():
            if arr.size and int(np.abs(arr).max()) >= LIMIT:
                raise Rejected("values would leave the exact range")

    # the statements

    def step(self, s: Stmt) -> None:
        getattr(self, "do_" + s.kind)(s)
        self.check_limits()

    def submit_task(self, s: Stmt, fn: Callable[..., Any], args: list[Any], writes: list[Any]) -> None:
        """A task: it fails if an input failed, else runs ``fn`` on the values; ``writes`` are its writes."""
        values = []
        error: Outcome | None = None
        for a in args:
            v, e = self.task_arg(a)
            if e is not None and error is None:
                error = dep(e)
            values.append(v)
        if error is None:
            try:
                result = fn(*values)
            except Injected:
                error = INJ
        for w in writes:
            self.write(self.mem_of(w), tensor=False, error=error)
        if s.out:
            self.handles[s.out] = Handle(
                "future", outcome=error if error is not None else value_outcome(result)
            )

    def do_add(self, s: Stmt) -> None:
        v, c = s.ops
        self.submit_task(s, lambda: add(self.view(v), c, out=self.view(v)), [], [v])

    do_g_write = do_add

    def do_read(self, s: Stmt) -> None:
        self.submit_task(s, total, [s.ops[0]], [])

    def do_read2(self, s: Stmt) -> None:
        self.submit_task(s, total2, [s.ops[0], s.ops[1]], [])

    def do_mix(self, s: Stmt) -> None:
        src, dst = s.ops
        self.submit_task(s, lambda: mix(self.view(src), out=self.view(dst)), [], [dst])

    def do_value(self, s: Stmt) -> None:
        self.submit_task(s, value, [s.ops[0], s.ops[1]], [])

    def do_add_value(self, s: Stmt) -> None:
        v, f = s.ops
        self.submit_task(s, lambda x: add_value(self.view(v), x, out=self.view(v)), [f], [v])

    def do_gather(self, s: Stmt) -> None:
        items, mapping = s.ops
        keys = list(mapping)
        n = len(items)

        def fn(*vals: Any) -> int:
            return gather(list(vals[:n]), dict(zip(keys, vals[n:], strict=True)))

        self.submit_task(s, fn, [*items, *mapping.values()], [])

    def do_hidden_write(self, s: Stmt) -> None:
        v = s.ops[0]
        self.submit_task(s, lambda: hidden_write(self.view(v))(), [], [v])

    def do_hidden_read(self, s: Stmt) -> None:
        v = s.ops[0]
        self.submit_task(s, lambda: hidden_read(self.view(v))(), [], [])

    def do_fail(self, s: Stmt) -> None:
        self.submit_task(s, raise_injected, [], [])

    def do_fail_out(self, s: Stmt) -> None:
        v = s.ops[0]
        self.submit_task(s, lambda: fail_add(self.view(v), 1, out=self.view(v)), [], [v])

    def do_fail_hidden(self, s: Stmt) -> None:
        v = s.ops[0]
        self.submit_task(s, lambda: fail_hidden(self.view(v))(), [], [v])

    def do_t_submit(self, s: Stmt) -> None:
        self.submit_task(s, total, [s.ops[0]], [])

    def do_k_submit(self, s: Stmt) -> None:
        self.submit_task(s, np.add, [s.ops[0], s.ops[1]], [])
        assert s.out
        self.handles[s.out].ints = False

    def do_t_task_write(self, s: Stmt) -> None:
        """``eng.submit(add_into, t, c, out=t, device=t.device)``: a task's write of a Tensor's memory."""
        a, c = s.ops
        t = self.tinfo(a[1])
        if t.error is not None:
            raise Rejected("a task write of a Tensor whose creation failed")
        self.submit_task(s, lambda x: add_into(x, c, out=self.mem[t.mem][t.start : t.stop]), [a], [])
        assert s.out
        self.write(t.mem, tensor=False, error=None)

    do_k_task_write = do_t_task_write

    def do_run(self, s: Stmt) -> None:
        self.outcomes.append(value_outcome(total(self.view(s.ops[0]))))

    def do_e_loop(self, s: Stmt) -> None:
        fn = {"total": total, "value": value, "raise_injected": raise_injected}[s.ops[0]]
        self.submit_task(s, fn, list(s.ops[1:]), [])
        assert s.out
        self.handles[s.out].kind = "exfuture"

    do_e_thread = do_e_loop

    def do_observe(self, s: Stmt) -> None:
        h = self.handles[s.ops[0][1]]
        if h.kind == "tensor":
            t = h.tensor
            assert t is not None
            if t.error is not None:  # its own error first
                self.outcomes.append(t.error)
            elif self.status[t.mem] is not None:
                self.outcomes.append(self.status[t.mem])
            else:
                self.outcomes.append(value_outcome(self.tval(t)))
            self.status[t.mem] = None  # the writes so far are seen
        else:
            assert h.outcome is not None, h
            self.outcomes.append(h.outcome)

    def do_map(self, s: Stmt) -> None:
        values: list[Outcome] = []
        error: Outcome | None = None
        for item in s.ops[0]:
            v, e = self.task_arg(item)
            if e is not None:
                error = dep(e)
                break
            values.append(value_outcome(as_int(v)))
        self.outcomes.append(("map", tuple(values), error))

    # Tensors

    def device_of(self, x: Any) -> str | None:
        if isinstance(x, tuple) and x[0] == "T":
            return self.tinfo(x[1]).device
        return None

    def do_t_asarray(self, s: Stmt) -> None:
        v = s.ops[0]
        assert s.out
        start, stop = (0, SIZE) if v[2] == 0 else (2, 6)
        self.handles[s.out] = Handle("tensor", tensor=TInfo(self.mem_of(v), start, stop, "cpu"))

    def do_t_asarray_await(self, s: Stmt) -> None:
        self.do_t_asarray(s)
        assert s.out
        self.do_observe(Stmt("observe", None, (("H", s.out),)))

    def do_k_asarray(self, s: Stmt) -> None:
        assert s.out
        self.new_tensor(s.out, self.view(s.ops[0]), "cuda:0", None)

    def do_k_to(self, s: Stmt) -> None:
        assert s.out
        v, e = self.operand(s.ops[0])
        self.new_tensor(s.out, v, s.ops[1], None if e is None else dep(e))

    def do_t_zeros(self, s: Stmt) -> None:
        assert s.out
        self.new_tensor(s.out, np.zeros(s.ops[0], dtype=np.int64), "cpu", None)

    def do_t_arange(self, s: Stmt) -> None:
        assert s.out
        self.new_tensor(s.out, np.arange(s.ops[0], dtype=np.int64), "cpu", None)

    def operands(self, operands: list[Any]) -> tuple[list[Any], Outcome | None]:
        """The values a Tensor op takes, and the error it fails with if one of them failed (the first)."""
        vals = []
        error = None
        for x in operands:
            v, e = self.operand(x)
            if e is not None and error is None:
                error = dep(e)
            vals.append(v)
        return vals, error

    def tensor_op(self, s: Stmt, fn: Callable[..., Any], operands: list[Any]) -> None:
        assert s.out
        vals, error = self.operands(operands)
        dev = next((d for d in map(self.device_of, operands) if d), "cpu")
        self.new_tensor(s.out, fn(*vals), dev, error)

    def do_t_binop(self, s: Stmt) -> None:
        a, op, b = s.ops
        f = {"+": np.add, "-": np.subtract, "*": np.multiply}[op]
        self.tensor_op(s, lambda x, y: f(x, y) % MOD, [a, b])

    def do_t_unary(self, s: Stmt) -> None:
        a, op = s.ops
        self.tensor_op(s, (lambda x: (-x) % MOD) if op == "neg" else (lambda x: abs(x - 3)), [a])

    def do_t_reduce(self, s: Stmt) -> None:
        a, op = s.ops
        fn = {"sum": lambda x: x.sum() % MOD, "max": lambda x: x.max(), "min": lambda x: x.min()}[op]
        self.tensor_op(s, fn, [a])

    def do_t_view(self, s: Stmt) -> None:
        a, i, j = s.ops
        t = self.tinfo(a[1])
        assert s.out and t.start is not None
        self.handles[s.out] = Handle(
            "tensor", tensor=TInfo(t.mem, t.start + i, t.start + j, t.device, t.error and dep(t.error))
        )

    def inplace(self, target: Any, fn: Callable[..., None], operands: list[Any]) -> None:
        """A Tensor write of ``target``'s memory: it fails if an operand it takes failed."""
        t = self.tinfo(target[1])
        if t.error is not None:
            raise Rejected("an in-place write to a Tensor whose creation failed")
        vals, error = self.operands(operands)
        if error is None:
            fn(self.mem[t.mem][t.start : t.stop], *vals)
        self.write(t.mem, tensor=True, error=error)

    def do_t_setitem(self, s: Stmt) -> None:
        a, i, j, v = s.ops

        def fn(m: np.ndarray, x: Any) -> None:
            m[i:j] = x

        self.inplace(a, fn, [v])

    def do_t_iop(self, s: Stmt) -> None:
        a, op, b = s.ops

        def fn(m: np.ndarray, x: Any) -> None:
            if op == "+=":
                m += x
            else:
                m -= x

        self.inplace(a, fn, [b])

    def do_t_outadd(self, s: Stmt) -> None:
        a, b, c = s.ops

        def fn(m: np.ndarray, x: Any, y: Any) -> None:
            np.add(x, y, out=m)

        self.inplace(a, fn, [b, c])

    def do_t_mod(self, s: Stmt) -> None:
        def fn(m: np.ndarray) -> None:
            m %= MOD

        self.inplace(s.ops[0], fn, [])

    # compile and batching

    def do_c_def(self, s: Stmt) -> None:
        assert s.out
        self.handles[s.out] = Handle("compiled", fn=s.ops[0])

    def do_c_call(self, s: Stmt) -> None:
        f, x = s.ops
        assert s.out
        v, e = self.task_arg(x)
        dev = self.device_of(x) or "cpu"
        if e is not None and v is None:  # a failed future: no shape to keep
            raise Rejected("a compiled call of a failed future")
        self.new_tensor(s.out, UNARY[self.handles[f[1]].fn](v), dev, e and dep(e))

    do_c_submit = do_c_call

    def compiled_value(self, f: Any, v: Any, index: int | None) -> Any:
        """What compiled function ``f`` gives on ``v``: its output ``index`` for one of two outputs."""
        h = self.handles[f[1]]
        fn = UNARY[h.fn] if h.kind == "compiled" else UNARY[h.fns[index or 0]]
        return fn(v)

    def compiled_call(self, s: Stmt) -> tuple[Any, str, Outcome | None]:
        """A compiled call's (value, device, error) from its ``f, x[, index]`` operands."""
        f, x = s.ops[:2]
        v, e = self.task_arg(x)
        if e is not None and v is None:  # a failed future: no shape to keep
            raise Rejected("a compiled call of a failed future")
        index = s.ops[2] if len(s.ops) > 2 else None
        return self.compiled_value(f, v, index), self.device_of(x) or "cpu", e and dep(e)

    def do_c_def2(self, s: Stmt) -> None:
        assert s.out
        self.handles[s.out] = Handle("compiled2", fns=tuple(s.ops))

    def do_c_call2(self, s: Stmt) -> None:
        assert s.out
        self.new_tensor(s.out, *self.compiled_call(s))

    do_c_submit2 = do_c_call2
    do_c_saved = do_c_call2  # loaded from what it saved: the function's result, as eagerly

    # cancellation points: the await may have been cancelled, so each outcome is one of two

    def do_x_submit(self, s: Stmt) -> None:
        assert s.out
        self.handles[s.out] = Handle("cfuture", outcome=either(value_outcome(total(self.view(s.ops[0])))))

    def do_x_csubmit(self, s: Stmt) -> None:
        assert s.out
        value, _, error = self.compiled_call(Stmt(s.kind, s.out, (s.ops[0], s.ops[1], *s.ops[3:])))
        outcome = error if error is not None else value_outcome(np.array(value, dtype=np.int64))
        self.handles[s.out] = Handle("ctensor", outcome=either(outcome))

    def do_x_observe(self, s: Stmt) -> None:
        h = self.handles[s.ops[0][1]]
        assert h.outcome is not None and h.outcome[0] == "either"
        self.outcomes.append((*h.outcome, INTERRUPTED))

    def do_x_waitall(self, s: Stmt) -> None:
        pass  # (nothing to observe: what it waited for is observed by the statements that made it)

    do_x_throttle = do_x_waitall

    def do_g_def(self, s: Stmt) -> None:
        assert s.out
        self.handles[s.out] = Handle("batched", fn=s.ops[0], exact=is_exact(s))

    def batched_outcome(self, g: Any, x: Any) -> Outcome:
        """A batched call's outcome: the function on the caller's rows alone, bit for bit in exact mode,
        within rounding in the default mode."""
        h = self.handles[g[1]]
        out = ROWS[h.fn](self.view(x).copy())
        return value_outcome(out) if h.exact else close_outcome(out)

    def do_g_call(self, s: Stmt) -> None:
        g, x = s.ops
        assert s.out
        self.handles[s.out] = Handle("call", outcome=self.batched_outcome(g, x))

    def do_g_await(self, s: Stmt) -> None:
        g, x = s.ops
        self.outcomes.append(self.batched_outcome(g, x))


def run_reference(stmts: list[Stmt]) -> Model:
    model = Model()
    for s in stmts:
        model.step(s)
    return model


# -- the generator ----------------------------------------------------------------------------------------

#: kind -> the families that must all be on for a program to use it.
KINDS: dict[str, frozenset[str]] = {
    k: frozenset(v)
    for k, v in {
        "add": {"submit"},
        "read": {"submit"},
        "read2": {"submit"},
        "mix": {"submit"},
        "value": {"submit"},
        "add_value": {"submit"},
        "gather": {"submit"},
        "hidden_write": {"submit"},
        "hidden_read": {"submit"},
        "run": {"submit"},
        "fail": {"failures"},
        "fail_out": {"failures"},
        "fail_hidden": {"failures"},
        "t_asarray": {"tensor"},
        "t_asarray_await": {"tensor"},
        "t_zeros": {"tensor"},
        "t_arange": {"tensor"},
        "t_binop": {"tensor"},
        "t_unary": {"tensor"},
        "t_reduce": {"tensor"},
        "t_view": {"tensor"},
        "t_setitem": {"tensor"},
        "t_iop": {"tensor"},
        "t_outadd": {"tensor"},
        "t_mod": {"tensor"},
        "t_submit": {"tensor", "submit"},
        "c_def": {"compile"},
        "c_call": {"compile"},
        "c_submit": {"compile"},
        "c_def2": {"compile", "outputs"},
        "c_call2": {"compile", "outputs"},
        "c_submit2": {"compile", "outputs"},
        "c_saved": {"compile", "saved"},
        "x_submit": {"cancel", "submit"},
        "x_csubmit": {"cancel", "compile"},
        "x_observe": {"cancel"},
        "x_waitall": {"cancel"},
        "x_throttle": {"cancel"},
        "g_def": {"batched"},
        "g_call": {"batched"},
        "g_await": {"batched"},
        "g_write": {"batched"},
        "e_loop": {"executor"},
        "e_thread": {"executor"},
        "map": {"map"},
        "k_asarray": {"cuda", "tensor"},
        "k_to": {"cuda", "tensor"},
        "k_submit": {"cuda", "tensor"},
        "t_task_write": {"tensor", "submit"},
        "k_task_write": {"cuda", "tensor"},
        "observe": set(),
    }.items()
}

#: Relative weights (default 1.0).
WEIGHTS = {"observe": 1.5, "g_call": 2.0, "g_write": 2.0, "t_iop": 1.5, "c_def": 0.4, "g_def": 0.4}


class Gen:
    """Draws statements for one program; ``model`` is the reference state after the statements so far."""

    def __init__(self, rng: random.Random, families: frozenset[str], model: Model) -> None:
        self.rng = rng
        self.families = families
        self.model = model
        self.counter = 0
        self.last_written: int | None = None  # the buffer the last statement changed

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def handles(self, kind: str, pred: Callable[[Handle], bool] = lambda h: True) -> list[str]:
        return [n for n, h in self.model.handles.items() if h.kind == kind and pred(h)]

    def view(self) -> tuple[Any, ...]:
        views = range(len(VIEWS)) if "views" in self.families else BASIC_VIEWS
        return ("V", self.rng.randrange(N_BUFFERS), self.rng.choice(list(views)))

    def view_of_len(self, n: int) -> tuple[Any, ...] | None:
        views = range(len(VIEWS)) if "views" in self.families else BASIC_VIEWS
        ok = [v for v in views if len(VIEWS[v](self.model.buffers[0])) == n]
        return ("V", self.rng.randrange(N_BUFFERS), self.rng.choice(ok)) if ok else None

    def rows(self) -> tuple[Any, ...]:
        r0 = self.rng.randrange(2)
        return ("R", self.rng.randrange(N_BUFFERS), r0, self.rng.randrange(r0 + 1, 3))

    def int_future(self) -> tuple[str, str] | None:
        names = self.handles("future", lambda h: h.ints)
        if "executor" in self.families:
            names += self.handles("exfuture")
        return ("H", self.rng.choice(names)) if names else None

    def ss_future(self) -> tuple[str, str] | None:
        names = self.handles("future", lambda h: h.ints)
        return ("H", self.rng.choice(names)) if names else None

    def tensor(self, pred: Callable[[TInfo], bool] = lambda t: True) -> tuple[str, str] | None:
        names = [n for n in self.handles("tensor") if pred(self.model.tinfo(n))]
        return ("T", self.rng.choice(names)) if names else None

    def vector(self, pred: Callable[[TInfo], bool] = lambda t: True) -> tuple[str, str] | None:
        return self.tensor(
            lambda t: t.start is not None and t.length is not None and t.length > 0 and pred(t)
        )

    def operand_like(self, t: TInfo) -> Any:
        """An operand for a Tensor op with ``t``: an int, a Tensor of its shape and device, or a view."""
        r = self.rng.random()
        if r < 0.3:
            return self.rng.randint(-20, 40)
        if r < 0.5 and t.device == "cpu" and t.length is not None:
            v = self.view_of_len(t.length)
            if v is not None:
                return v
        if r < 0.6:
            scalar = self.tensor(lambda u: u.start is None and u.device == t.device)
            if scalar is not None:
                return scalar
        same = self.tensor(lambda u: u.length == t.length and u.device == t.device)
        return same if same is not None else self.rng.randint(0, 9)

    def failed(self, n: int | None) -> tuple[Any, ...]:
        """A Tensor whose value is an injected failure: eng.asarray(a failed future, shape=..., dtype=...)."""
        shape = () if n is None else (n,)
        failed = self.handles("future", lambda h: h.outcome is not None and h.outcome[0] == "error")
        src = self.rng.choice(failed) if failed and self.rng.random() < 0.5 else None
        return ("FAILED", src, shape)

    def maybe_failed(self, t: TInfo) -> Any:
        if "failures" in self.families and self.rng.random() < 0.3:
            return self.failed(t.length)
        return self.operand_like(t)

    def draw(self, kind: str) -> Stmt | None:
        rng = self.rng
        nowait = "submit" in self.families and rng.random() < 0.4
        if kind in ("add", "g_write"):
            v = self.rows() if kind == "g_write" else self.view()
            return Stmt(kind, self.name("f"), (v, rng.randint(0, 50)), nowait)
        if kind == "read":
            return Stmt(kind, self.name("f"), (self.view(),), nowait)
        if kind == "read2":
            return Stmt(kind, self.name("f"), (self.view(), self.view()), nowait)
        if kind == "mix":
            return Stmt(kind, self.name("f"), (self.view(), self.view()), nowait)
        if kind == "value":
            f = self.int_future()
            return None if f is None else Stmt(kind, self.name("f"), (f, rng.randint(0, 50)), nowait)
        if kind == "add_value":
            f = self.int_future()
            return None if f is None else Stmt(kind, self.name("f"), (self.view(), f), nowait)
        if kind == "gather":
            fs = [self.ss_future() for _ in range(rng.randint(1, 3))]
            k = self.ss_future()
            if k is None or any(f is None for f in fs):
                return None
            return Stmt(kind, self.name("f"), (fs, {"k": k}), nowait)
        if kind in ("hidden_write", "hidden_read", "fail_out", "fail_hidden"):
            return Stmt(kind, self.name("f"), (self.view(),), nowait)
        if kind == "fail":
            return Stmt(kind, self.name("f"), (), nowait)
        if kind == "run":
            return Stmt(kind, None, (self.view(),))
        if kind == "observe":
            names = [
                n for n, h in self.model.handles.items() if h.kind not in ("compiled", "compiled2", "batched")
            ]
            if names and rng.random() < 0.5:
                names = names[-2:]  # often the handle just made: awaited before its task can have run
            return Stmt(kind, None, (("H", rng.choice(names)),)) if names else None
        if kind in ("t_asarray", "t_asarray_await"):
            views = [0, 3] if "views" in self.families else [0]
            k = self.last_written if self.last_written is not None and rng.random() < 0.7 else None
            k = rng.randrange(N_BUFFERS) if k is None else k
            return Stmt(kind, self.name("t"), (("V", k, rng.choice(views)),))
        if kind in ("t_zeros", "t_arange"):
            return Stmt(kind, self.name("t"), (rng.choice([4, SIZE]),))
        if kind == "t_binop":
            a = self.tensor(lambda t: t.start is not None)
            if a is None:
                return None
            t = self.model.tinfo(a[1])
            return Stmt(kind, self.name("t"), (a, rng.choice("+-*"), self.operand_like(t)))
        if kind == "t_unary":
            a = self.tensor()
            return None if a is None else Stmt(kind, self.name("t"), (a, rng.choice(["neg", "abs"])))
        if kind == "t_reduce":
            a = self.vector()
            return None if a is None else Stmt(kind, self.name("t"), (a, rng.choice(["sum", "max", "min"])))
        if kind == "t_view":
            a = self.vector(lambda t: t.length is not None and t.length >= 2)
            if a is None:
                return None
            n = self.model.tinfo(a[1]).length
            assert n is not None
            i = rng.randrange(n - 1)
            return Stmt(kind, self.name("t"), (a, i, rng.randint(i + 1, n)))
        if kind == "t_setitem":
            a = self.vector()
            if a is None:
                return None
            n = self.model.tinfo(a[1]).length
            assert n is not None
            i = rng.randrange(n)
            j = rng.randint(i + 1, n)
            if "failures" in self.families and rng.random() < 0.3:
                val: Any = self.failed(j - i)
            else:
                val = rng.randint(0, 60)
            return Stmt(kind, None, (a, i, j, val))
        if kind == "t_iop":
            a = self.vector(lambda t: t.error is None)
            if a is None:
                return None
            return Stmt(kind, None, (a, rng.choice(["+=", "-="]), self.maybe_failed(self.model.tinfo(a[1]))))
        if kind == "t_outadd":
            a = self.vector(lambda t: t.error is None)
            if a is None:
                return None
            t = self.model.tinfo(a[1])
            b = self.tensor(lambda u: u.length == t.length and u.device == t.device)
            if b is None:
                return None
            return Stmt(kind, None, (a, b, self.maybe_failed(t)))
        if kind == "t_mod":
            a = self.vector(lambda t: t.error is None)
            return None if a is None else Stmt(kind, None, (a,))
        if kind == "t_submit":
            a = self.tensor()
            return None if a is None else Stmt(kind, self.name("f"), (a,), nowait)
        if kind == "c_def":
            return Stmt(kind, self.name("c"), (rng.randrange(len(UNARY)),))
        if kind in ("c_call", "c_submit"):
            fs = self.handles("compiled")
            if not fs:
                return None
            x: Any = self.view()
            if "tensor" in self.families and rng.random() < 0.6:
                x = self.vector() or x
            return Stmt(kind, self.name("t"), (("H", rng.choice(fs)), x), nowait=kind == "c_call")
        if kind == "c_def2":
            return Stmt(kind, self.name("c"), (rng.randrange(len(UNARY)), rng.randrange(len(UNARY))))
        if kind in ("c_call2", "c_submit2", "c_saved", "x_csubmit"):
            plain = kind in ("c_saved", "x_csubmit")  # (these take either kind of compiled function)
            fs = self.handles("compiled2") + (self.handles("compiled") if plain else [])
            if not fs:
                return None
            f = rng.choice(fs)
            x = self.view()
            if "tensor" in self.families and rng.random() < 0.6:
                x = self.vector(lambda t: t.error is None) or x
            index = (rng.randrange(2),) if self.model.handles[f].kind == "compiled2" else ()
            if kind == "x_csubmit":
                return Stmt(kind, self.name("t"), (("H", f), x, rng.randrange(4), *index))
            return Stmt(kind, self.name("t"), (("H", f), x, *index))
        if kind == "x_submit":
            return Stmt(kind, self.name("f"), (self.view(), rng.randrange(4)))
        if kind == "x_observe":
            names = self.handles("cfuture") + self.handles("ctensor")
            return Stmt(kind, None, (("H", rng.choice(names)), rng.randrange(4))) if names else None
        if kind in ("x_waitall", "x_throttle"):
            return Stmt(kind, None, (rng.randrange(4),))
        if kind == "g_def":
            if "cuda" in self.families and rng.random() < 0.5:  # weights on the device, default mode
                return Stmt(kind, self.name("g"), (rng.randrange(len(ROWS)), False, True))
            return Stmt(kind, self.name("g"), (rng.randrange(len(ROWS)), rng.random() < 0.5))
        if kind in ("g_call", "g_await"):
            gs = self.handles("batched")
            if not gs:
                return None
            return Stmt(
                kind, self.name("call") if kind == "g_call" else None, (("H", rng.choice(gs)), self.rows())
            )
        if kind in ("e_loop", "e_thread"):
            r = rng.random()
            if r < 0.15 and "failures" in self.families:
                ops: tuple[Any, ...] = ("raise_injected",)
            elif r < 0.6:
                ops = ("total", self.view())
            else:
                ops = ("value", rng.randint(0, 500), rng.randint(0, 50))
            return Stmt(kind, self.name("x"), ops)
        if kind == "map":
            items: list[Any] = []
            for _ in range(rng.randint(1, 6)):
                f = self.ss_future() if rng.random() < 0.3 else None
                items.append(f if f is not None else self.view())
            return Stmt(kind, None, (items,))
        if kind == "k_asarray":
            return Stmt(kind, self.name("t"), (("V", rng.randrange(N_BUFFERS), 0),))
        if kind == "k_to":
            a = self.tensor()
            if a is None:
                return None
            dev = "cpu" if self.model.tinfo(a[1]).device != "cpu" else "cuda:0"
            return Stmt(kind, self.name("t"), (a, dev))
        if kind in ("t_task_write", "k_task_write"):
            cuda_only = kind == "k_task_write"
            a = self.vector(lambda t: t.error is None and (t.device != "cpu" or not cuda_only))
            return None if a is None else Stmt(kind, self.name("f"), (a, rng.randint(0, 30)), nowait)
        if kind == "k_submit":
            a = self.tensor(lambda t: t.device != "cpu")
            return None if a is None else Stmt(kind, self.name("f"), (a, rng.randint(0, 9)), nowait)
        raise AssertionError(kind)


def draw_config(rng: random.Random, families: frozenset[str]) -> Config:
    config = Config(
        workers=rng.choice([1, 4]),
        max_pending=rng.choice([4, 4, 1024]),
        max_pending_bytes=rng.choice([2**30, 2**30, 320]),
        backend=rng.choice(["asyncio", "trio"]),
        cuda="cuda" in families,
    )
    if families & {"outputs", "cancel"}:  # small limits: calls and awaits wait for admission
        config = dataclasses.replace(config, max_pending=rng.choice([1, 2, 4]))
    if "saved" in families:  # a loaded function's call counts its intermediates, which the reference does
        config = dataclasses.replace(config, max_pending_bytes=2**30)  # not model: room for them
    return config


def generate(seed: int, families: frozenset[str] | set[str], length: int | None = None) -> Program:
    """The program of ``seed``: the same program for the same seed, families and length."""
    families = frozenset(families)
    rng = random.Random(f"{seed}:{','.join(sorted(families))}")
    config = draw_config(rng, families)
    length = length if length is not None else rng.randint(15, 40)
    kinds = [k for k, need in KINDS.items() if need <= families]
    weights = [WEIGHTS.get(k, 1.0) for k in kinds]
    model = Model()
    gen = Gen(rng, families, model)
    stmts: list[Stmt] = []
    attempts = 0
    while len(stmts) < length and attempts < 50 * length:
        attempts += 1
        stmt = gen.draw(rng.choices(kinds, weights)[0])
        if stmt is None:
            continue
        trial = copy.deepcopy(model)
        try:
            trial.step(stmt)
        except Rejected:
            continue
        changed = [k for k in range(N_BUFFERS) if not np.array_equal(model.buffers[k], trial.buffers[k])]
        gen.last_written = changed[0] if changed else gen.last_written
        model = gen.model = trial
        stmts.append(stmt)
    # observe every handle at the end (what the contract fixes)
    for name, h in list(model.handles.items()):
        if h.kind in ("compiled", "compiled2", "batched"):
            continue
        stmt = Stmt("observe", None, (("H", name),))
        trial = copy.deepcopy(model)
        try:
            trial.step(stmt)
        except Rejected:
            continue
        model = trial
        stmts.append(stmt)
    return Program(seed, families, config, stmts)
