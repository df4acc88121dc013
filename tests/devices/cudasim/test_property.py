"""Random programs on three streams, ordered the way the executor orders them (wait for the last
writer, and a writer for the readers since), give NumPy's sequential results under random delays,
and the race detector finds nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsvc.devices.cudasim import SimApi, api, simulator

N_BUFFERS, N_STREAMS, SIZE, MOD = 3, 3, 8, 1009

ops = st.lists(
    st.tuples(
        st.integers(0, N_STREAMS - 1),
        st.integers(0, N_BUFFERS - 1),
        st.integers(0, N_BUFFERS - 1),
        st.integers(1, 50),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


class Ordered:
    """Per buffer: the last writer's event and the readers' events since (as the executor keeps them)."""

    def __init__(self, cuda: SimApi) -> None:
        self.cuda = cuda
        self.writer: dict[int, tuple[Any, Any]] = {}
        self.readers: dict[int, list[tuple[Any, Any]]] = {}

    def before(self, stream: Any, read: int, write: int) -> None:
        waits = [self.writer.get(read), self.writer.get(write), *self.readers.get(write, [])]
        for entry in waits:
            if entry is not None and entry[0] is not stream:
                stream.wait_event(entry[1])

    def after(self, stream: Any, read: int, write: int) -> None:
        event = self.cuda.event()
        event.record(stream)
        self.readers.setdefault(read, []).append((stream, event))
        self.writer[write] = (stream, event)
        self.readers[write] = []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=ops, seed=st.integers(0, 1000))
def test_ordered_programs_match_numpy(program: list[tuple[int, int, int, int, bool]], seed: int) -> None:
    sim, cuda = simulator(), api()
    sim.reset()
    sim.configure(seed=seed, max_delay_s=0.0002)
    xp = cuda.xp
    streams = [cuda.stream(0) for _ in range(N_STREAMS)]
    host = [np.arange(SIZE, dtype=np.int64) * (i + 1) for i in range(N_BUFFERS)]
    with streams[0]:
        device = [xp.asarray(h) for h in host]
    order = Ordered(cuda)
    for s, src, dst, c, strided in program:
        view = (lambda b: b[::2]) if strided else (lambda b: b)
        order.before(streams[s], src, dst)
        with streams[s]:
            xp.remainder(view(device[src]) * c + 1, MOD, out=view(device[dst]))
        order.after(streams[s], src, dst)
        view(host[dst])[...] = (view(host[src]) * c + 1) % MOD
    for s in streams:
        s.synchronize()
    assert [d.tolist() for d in device] == [h.tolist() for h in host]
    assert sim.races == [] and sim.faults == []
    sim.reset()
