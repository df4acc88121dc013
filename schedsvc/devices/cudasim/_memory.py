"""Device memory: a pool per device with one arena per stream (as CuPy's), and pinned host memory.

A ``Block`` is one allocation: a NumPy byte buffer of its rounded size, a fake
device address, the arena (stream id) it returns to, and the race detector's
record of its last write and the reads since.  Freeing is pure bookkeeping:
the owner array's ``weakref.finalize`` appends the block to ``pending`` (safe
from any thread, also during another pool call), and the next pool call moves
it to its arena's free list, where the next allocation of the same rounded
size on that stream takes it at once.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ALIGN", "Access", "Block", "Pool", "is_pinned", "pinned_empty", "rounded"]

#: allocation granularity of CuPy's pool
ALIGN = 512
_ADDRESS_BASE = 0x7F00_0000_0000
_ADDRESS_SPAN = 1 << 40


class Access(NamedTuple):
    """One access to a block, as the race detector remembers it."""

    stream: int
    tick: int
    site: str
    name: str
    kind: str


class Block:
    """One pool allocation: its buffer, address, arena and access history."""

    __slots__ = (
        "arena",
        "buffer",
        "device",
        "generation",
        "last_write",
        "pool",
        "ptr",
        "reads",
        "releases",
        "size",
    )

    def __init__(
        self, device: int, ptr: int, size: int, arena: int, generation: int, pool: Pool | None = None
    ) -> None:
        self.pool = pool  # None: a zero-size block, never pooled
        self.releases = 0  # times its owner died: a graph captured over it checks it did not since
        self.device = device
        self.ptr = ptr
        self.size = size
        self.arena = arena
        self.generation = generation
        self.buffer: np.ndarray[Any, Any] = np.empty(size, dtype=np.uint8)
        self.last_write: Access | None = None
        self.reads: dict[int, Access] = {}

    def __repr__(self) -> str:
        return f"<Block {self.ptr:#x} of {self.size} bytes on device {self.device}>"


def rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to the pool's granularity (at least one unit)."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class Pool:
    """One device's memory pool: live and cached bytes, per-arena free lists, an optional limit.

    ``private``: a pool of its own that only allocations inside ``SimApi.allocating_from`` use (CuPy's
    ``MemoryPool`` under ``cupy.cuda.using_allocator``), as graph captures do.
    """

    def __init__(self, device: int, capacity: int, private: bool = False) -> None:
        self.private = private
        self.device = device
        self.capacity = capacity
        self.limit: int | None = None
        self.used = 0
        self.cached = 0
        self.generation = 0
        self._free: dict[int, dict[int, list[Block]]] = {}
        self._pending: deque[Block] = deque()
        self._next = _ADDRESS_BASE + device * _ADDRESS_SPAN
        self._lock = threading.RLock()

    def release(self, block: Block) -> None:
        """The last array over ``block`` died (a finaliser: only appends)."""
        block.releases += 1
        self._pending.append(block)

    def drain(self) -> None:
        """Move released blocks to their arenas' free lists."""
        with self._lock:
            while self._pending:
                block = self._pending.popleft()
                if block.generation != self.generation:
                    continue
                self.used -= block.size
                self.cached += block.size
                self._free.setdefault(block.arena, {}).setdefault(block.size, []).append(block)

    def take(self, arena: int, size: int) -> Block | None:
        """A cached block of ``size`` bytes from ``arena``'s free list, now in use, or None."""
        with self._lock:
            self.drain()
            blocks = self._free.get(arena, {}).get(size)
            if not blocks:
                return None
            block = blocks.pop()
            self.cached -= size
            self.used += size
            return block

    def give_back(self, block: Block) -> None:
        """Return a block ``take`` handed out but the caller could not use."""
        with self._lock:
            self.used -= block.size
            self.cached += block.size
            self._free.setdefault(block.arena, {}).setdefault(block.size, []).append(block)

    def room(self, size: int) -> bool:
        """Whether a new block of ``size`` bytes fits under the limit and the device's memory."""
        with self._lock:
            self.drain()
            cap = self.capacity if self.limit is None else min(self.limit, self.capacity)
            return self.used + self.cached + size <= cap

    def new_block(self, arena: int, size: int) -> Block:
        """A fresh block (the caller checked ``room``)."""
        with self._lock:
            block = Block(self.device, self._next, size, arena, self.generation, self)
            self._next += size
            self.used += size
            return block

    def free_cached(self) -> None:
        """Drop every cached free block."""
        with self._lock:
            self.drain()
            self._free.clear()
            self.cached = 0

    def total(self) -> int:
        """Bytes held by the pool: live and cached blocks."""
        with self._lock:
            self.drain()
            return self.used + self.cached

    def clear(self) -> None:
        """Forget every block (live ones are dropped when they die) and the limit."""
        with self._lock:
            self.generation += 1
            self._free.clear()
            self._pending.clear()
            self.used = self.cached = 0
            self.limit = None


# -- pinned host memory ----------------------------------------------------------

_pinned: dict[int, int] = {}
_pinned_dead: deque[int] = deque()  # appended by finalisers (any thread, any time), applied under the lock
_pinned_lock = threading.Lock()


def _collect_dead() -> None:
    while _pinned_dead:
        _pinned.pop(_pinned_dead.popleft(), None)


def pinned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
    """A plain NumPy array whose memory the simulator treats as pinned (views of it too)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(max(nbytes, 1), dtype=np.uint8)
    start = int(raw.ctypes.data)
    with _pinned_lock:
        _collect_dead()
        _pinned[start] = start + raw.nbytes
    weakref.finalize(raw, _pinned_dead.append, start)
    pinned: np.ndarray[Any, Any] = raw[:nbytes].view(dt).reshape(shape)
    return pinned


def is_pinned(array: np.ndarray[Any, Any]) -> bool:
    """Whether ``array``'s memory lies in a live pinned allocation."""
    address = int(array.__array_interface__["data"][0])
    with _pinned_lock:
        _collect_dead()
        ranges = list(_pinned.items())
    return any(start <= address < end for start, end in ranges)
