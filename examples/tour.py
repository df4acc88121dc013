"""The README's ten-line tour; tests/test_examples.py runs it."""

import asyncio

import numpy as np

import schedsvc as ss

a = np.full((500, 500), 0.01)


async def main() -> None:
    async with ss.Engine(max_pending=64, max_pending_bytes="512MiB") as eng:
        f = await eng.submit(np.dot, a, a)  # submit -> ss.Future
        print(round((await f)[0, 0], 6))  # await: 0.05
        y = np.maximum(eng.asarray(a) @ a - 0.04, 0).sum(axis=1)  # Tensor ops
        mlp = eng.compile(lambda x: np.tanh(x @ a).mean())  # one task per call
        print(await y[:2], round(await mlp(a), 6))  # [5. 5.] 0.049958
        with eng.trace("run.json"):  # a timeline for Perfetto
            norms = eng.map(np.linalg.norm, [a, 2 * a])
            print([round(float(n), 6) async for n in norms])  # [5.0, 10.0]


if __name__ == "__main__":
    asyncio.run(main())
