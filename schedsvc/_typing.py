"""Types for type checkers: the keywords ``eng.submit`` and ``eng.compile`` take for themselves, what an
argument of a task may be, and the signatures of ``submit``, ``submit_nowait`` and ``run`` (overloads, given
to the methods by ``as_submit``, ``as_submit_nowait`` and ``as_run``, which change nothing at run time).

An argument that is a Future (a Tensor, a ``concurrent.futures.Future`` of ``eng.executor()``) is a
dependency: the function gets its value.  So a function of a ``float`` takes a ``float`` or a future
(``Arg[float]``).  A future's value type is not checked against the parameter: a future of ``Any`` (the
result of an untyped function, or of NumPy's many functions typed ``Any``) would make a type checker
infer the parameter as ``Any | Future[Any]`` and refuse every function, so any future fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeAlias, TypedDict, TypeVar, Unpack, overload

if TYPE_CHECKING:
    from ._future import Future

__all__ = [
    "Arg",
    "BatchOptions",
    "CompileOptions",
    "Pending",
    "Run",
    "Submit",
    "SubmitNowait",
    "SubmitOptions",
    "as_run",
    "as_submit",
    "as_submit_nowait",
]

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)
T = TypeVar("T")
P = ParamSpec("P")
A1 = TypeVar("A1")
A2 = TypeVar("A2")
A3 = TypeVar("A3")
A4 = TypeVar("A4")


class Pending(Protocol[V_co]):
    """A future whose value a task takes (an ``ss.Future``, a Tensor, a ``concurrent.futures.Future``).

    A protocol, not ``Future[V]``: futures are invariant, and a future of an ``int`` fits a ``float``.
    """

    def result(self, timeout: float | None = None) -> V_co: ...


#: a task's argument: the value the function takes, or a future (of it, unchecked: see the docstring above)
Arg: TypeAlias = V | Pending[Any]


class SubmitOptions(TypedDict, total=False):
    """``eng.submit``'s own keywords (``_options.OPTIONS``)."""

    device: str | None
    priority: int
    name: str | None
    reads: Any
    writes: Any
    nbytes: int | None


class CompileOptions(TypedDict, total=False):
    """``eng.compile``'s keywords besides ``batch_axis``."""

    max_signatures: int
    name: str | None


class BatchOptions(CompileOptions, total=False):
    """``eng.compile``'s keywords with ``batch_axis``."""

    max_batch: int
    max_delay: float | None
    batched: Sequence[int | str] | None
    exact: bool


class Submit(Protocol):
    """``eng.submit``'s signatures, tried in order:

    - up to four positional arguments and options: each argument checked against ``fn``'s parameter,
      fitting by its type or as a future (a dependency);
    - ``fn``'s own arguments, keywords too (ParamSpec): all checked, but a future fits none (PEP 612
      allows no keyword between ``*args: P.args`` and ``**kwargs: P.kwargs``, and ``P`` has no futures);
    - up to four positional arguments checked as in the first, and keywords -- ``fn``'s and options --
      taken unchecked: ``eng.submit(np.add, t, 1.0, out=t)`` with a Tensor ``t``.

    So a misspelt keyword of ``fn``'s is found at run time, not by a type checker; a call of more than four
    positional arguments with a future among them is refused by one (it runs)."""

    @overload
    async def __call__(self, fn: Callable[[], T], /, **options: Unpack[SubmitOptions]) -> Future[T]: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1], T], a1: Arg[A1], /, **options: Unpack[SubmitOptions]
    ) -> Future[T]: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **options: Unpack[SubmitOptions]
    ) -> Future[T]: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        /,
        **options: Unpack[SubmitOptions],
    ) -> Future[T]: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **options: Unpack[SubmitOptions],
    ) -> Future[T]: ...
    @overload
    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]: ...
    @overload
    async def __call__(self, fn: Callable[[], T], /, **kwargs: Any) -> Future[T]: ...
    @overload
    async def __call__(self, fn: Callable[[A1], T], a1: Arg[A1], /, **kwargs: Any) -> Future[T]: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **kwargs: Any
    ) -> Future[T]: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1, A2, A3], T], a1: Arg[A1], a2: Arg[A2], a3: Arg[A3], /, **kwargs: Any
    ) -> Future[T]: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **kwargs: Any,
    ) -> Future[T]: ...


class SubmitNowait(Protocol):
    """``eng.submit_nowait``'s signatures: ``fn``'s arguments checked (see ``Submit``)."""

    @overload
    def __call__(self, fn: Callable[[], T], /, **options: Unpack[SubmitOptions]) -> Future[T]: ...
    @overload
    def __call__(
        self, fn: Callable[[A1], T], a1: Arg[A1], /, **options: Unpack[SubmitOptions]
    ) -> Future[T]: ...
    @overload
    def __call__(
        self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **options: Unpack[SubmitOptions]
    ) -> Future[T]: ...
    @overload
    def __call__(
        self,
        fn: Callable[[A1, A2, A3], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        /,
        **options: Unpack[SubmitOptions],
    ) -> Future[T]: ...
    @overload
    def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **options: Unpack[SubmitOptions],
    ) -> Future[T]: ...
    @overload
    def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]: ...
    @overload
    def __call__(self, fn: Callable[[], T], /, **kwargs: Any) -> Future[T]: ...
    @overload
    def __call__(self, fn: Callable[[A1], T], a1: Arg[A1], /, **kwargs: Any) -> Future[T]: ...
    @overload
    def __call__(
        self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **kwargs: Any
    ) -> Future[T]: ...
    @overload
    def __call__(
        self, fn: Callable[[A1, A2, A3], T], a1: Arg[A1], a2: Arg[A2], a3: Arg[A3], /, **kwargs: Any
    ) -> Future[T]: ...
    @overload
    def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **kwargs: Any,
    ) -> Future[T]: ...


class Run(Protocol):
    """``eng.run``'s signatures: ``fn``'s arguments checked (see ``Submit``)."""

    @overload
    async def __call__(self, fn: Callable[[], T], /, **options: Unpack[SubmitOptions]) -> T: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1], T], a1: Arg[A1], /, **options: Unpack[SubmitOptions]
    ) -> T: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **options: Unpack[SubmitOptions]
    ) -> T: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        /,
        **options: Unpack[SubmitOptions],
    ) -> T: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **options: Unpack[SubmitOptions],
    ) -> T: ...
    @overload
    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    @overload
    async def __call__(self, fn: Callable[[], T], /, **kwargs: Any) -> T: ...
    @overload
    async def __call__(self, fn: Callable[[A1], T], a1: Arg[A1], /, **kwargs: Any) -> T: ...
    @overload
    async def __call__(self, fn: Callable[[A1, A2], T], a1: Arg[A1], a2: Arg[A2], /, **kwargs: Any) -> T: ...
    @overload
    async def __call__(
        self, fn: Callable[[A1, A2, A3], T], a1: Arg[A1], a2: Arg[A2], a3: Arg[A3], /, **kwargs: Any
    ) -> T: ...
    @overload
    async def __call__(
        self,
        fn: Callable[[A1, A2, A3, A4], T],
        a1: Arg[A1],
        a2: Arg[A2],
        a3: Arg[A3],
        a4: Arg[A4],
        /,
        **kwargs: Any,
    ) -> T: ...


def _same(fn: Any) -> Any:
    return fn


#: decorators of ``Engine.submit``, ``submit_nowait`` and ``run``: typed by their overloads above (the
#: methods' own signatures are what they take at run time, and what their bodies are checked against)
as_submit: Callable[[Callable[..., Any]], Submit] = _same
as_submit_nowait: Callable[[Callable[..., Any]], SubmitNowait] = _same
as_run: Callable[[Callable[..., Any]], Run] = _same
