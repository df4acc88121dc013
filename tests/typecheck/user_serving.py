"""A FastAPI app over ``schedsvc.serving`` under ``mypy --strict``: the engine as a dependency, a batched
model's calls awaited while the client is connected.  Checked by ``tests/typecheck/test_typing.py``, never
run."""

from __future__ import annotations

from typing import Annotated, Any, reveal_type

import numpy as np
import numpy.typing as npt
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

import schedsvc as ss
from schedsvc import serving

Floats = npt.NDArray[np.float64]
Model = ss.Batched[[Floats], npt.NDArray[Any]]


def forward(x: Floats) -> Floats:
    return np.maximum(x, 0.0)


class Row(BaseModel):
    x: list[float]


async def load(app: FastAPI, eng: ss.Engine) -> None:
    app.state.model = eng.compile(forward, batch_axis=0)


app = FastAPI(
    lifespan=serving.lifespan(ss.Config(max_pending=64), setup=load),
    exception_handlers=serving.exception_handlers(retry_after=1),
)


def model_of(request: Request) -> Model:
    model: Model = request.app.state.model
    return model


@app.post("/predict")
async def predict(row: Row, request: Request, model: Annotated[Model, Depends(model_of)]) -> list[float]:
    call = model(np.array([row.x]))
    reveal_type(call)  # BatchCall[ndarray[tuple[Any, ...], dtype[Any]]]
    rows = await serving.while_connected(request, call)
    reveal_type(rows)  # ndarray[tuple[Any, ...], dtype[Any]]
    return [float(v) for v in rows[0]]


@app.post("/predict-sync")
def predict_sync(row: Row, model: Annotated[Model, Depends(model_of)]) -> list[float]:
    rows = model(np.array([row.x])).result(timeout=30)
    return [float(v) for v in rows[0]]


@app.get("/stats")
async def stats(eng: Annotated[ss.Engine, Depends(serving.get_engine)]) -> dict[str, int]:
    reveal_type(await eng.run(len, [1, 2]))  # int
    return {"pending": eng.pending}
