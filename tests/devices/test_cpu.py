"""The CPU pool's own behaviour: stand-in threads while workers block, and each worker's busy time."""

from __future__ import annotations

from typing import Any

import schedsvc as ss

from ..helpers import TIMEOUT, Gate, occupied, started, state, until, within


async def test_stand_in_threads_are_forgotten_once_they_retire() -> None:
    """r4: every result() that blocked inside a task started a stand-in thread, and the pool kept every
    worker it ever started: its worker list and Stats.worker_busy_s grew without bound."""
    async with started(cpu_workers=2, inline_threshold_us=0) as eng:
        rt = eng._rt
        assert rt is not None
        pool: Any = rt.devices["cpu"]

        def counts() -> tuple[int, int, int]:  # under the lock: a consistent view of the pool
            with rt.lock:
                return pool.blocked, pool.live, len(pool.workers)

        for _ in range(20):
            gate = Gate()
            running = eng.submit_nowait(gate.hold(lambda: 1))
            await gate.wait_started(1)
            waiter = eng.submit_nowait(lambda r=running: r.result(TIMEOUT))  # blocks: a stand-in starts
            await state(eng, lambda: counts()[0] == 1)
            assert counts()[1] == pool.size + 1
            gate.open()
            assert await within(waiter) == 1
            await until(lambda: counts()[1] == pool.size)  # the surplus thread retired
        assert counts() == (0, pool.size, pool.size)
        assert len(eng.stats().worker_busy_s) <= pool.size + 1  # the live workers, and the retired in one


async def test_a_closed_engine_keeps_each_workers_busy_seconds_under_its_name() -> None:
    """Closing retires every worker; their times must not collapse into one entry (Prometheus series vanish)."""
    eng = ss.Engine(cpu_workers=2)
    await eng.start()
    async with occupied(eng, 2):  # one task on each worker
        pass
    # a worker adds its time when it ends a run of tasks, just after their futures resolve
    await until(lambda: all(eng.stats().worker_busy_s.get(f"cpu-{i}", 0) > 0 for i in range(2)))
    before = eng.stats().worker_busy_s
    await within(eng.aclose())
    after = eng.stats().worker_busy_s
    assert sorted(after) == sorted(before) == ["cpu-0", "cpu-1"]
    assert all(after[name] >= before[name] > 0 for name in before)
