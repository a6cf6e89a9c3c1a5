"""Stream several responses per request from an async generator (a decoupled model).

    python examples/streaming.py

Each ``yield`` sends one response to every request of the call; in-process, ``Engine.stream``
iterates them, over gRPC tritonclient's ``start_stream`` receives them.
"""

from __future__ import annotations

import asyncio

import numpy as np

from serving_pod.pyapi import Engine, ModelConfig, Tensor, batch


@batch
async def count_up(start: np.ndarray, steps: np.ndarray):
    for step in range(int(steps.max())):
        await asyncio.sleep(0)  # e.g. waiting for the next generated token
        yield {"value": start + step}


def bind_models(target) -> None:
    target.bind(
        "count_up",
        count_up,
        inputs=[Tensor("start", np.int32, (1,)), Tensor("steps", np.int32, (1,))],
        outputs=[Tensor("value", np.int32, (1,))],
        config=ModelConfig(max_batch_size=4, decoupled=True),
    )


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    return {"count_up": {"start": np.array([[10]], np.int32), "steps": np.array([[3]], np.int32)}}


def main() -> None:
    with Engine() as engine:
        bind_models(engine)
        for response in engine.stream("count_up", sample_inputs()["count_up"]):
            print(response["value"].ravel().tolist())


if __name__ == "__main__":
    main()
