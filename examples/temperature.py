"""Group a batch by a per-request parameter: ``@group_by_values`` + ``@first_value`` on an ``async def``.

    python examples/temperature.py

Requests carry a ``temperature``; the dynamic batcher mixes them freely, ``@group_by_values``
splits each batch into runs of equal temperature, and ``@first_value`` hands the function that
temperature as a scalar. The function is ``async def``: it runs on the instance's own event loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from serving_pod.pyapi import DynamicBatcher, Engine, ModelConfig, Tensor, batch, first_value, group_by_values

#: every call's (temperature, rows), to show the grouping
CALLS: list[tuple[float, int]] = []


@batch
@group_by_values("temperature")
@first_value("temperature")
async def scale(logits: np.ndarray, temperature: np.float32) -> dict[str, np.ndarray]:
    await asyncio.sleep(0)  # e.g. awaiting a remote feature store
    CALLS.append((float(temperature), len(logits)))
    return {"scaled": logits / temperature}


def bind_models(target) -> None:
    target.bind(
        "scale",
        scale,
        inputs=[Tensor("logits", np.float32, (-1,)), Tensor("temperature", np.float32, (1,))],
        outputs=[Tensor("scaled", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000)),
    )


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    return {"scale": {"logits": logits, "temperature": np.array([[1.0], [2.0], [1.0]], np.float32)}}


def main() -> None:
    CALLS.clear()
    with Engine() as engine:
        bind_models(engine)
        requests = [
            {"logits": np.full((1, 4), i, np.float32), "temperature": np.array([[0.5 if i % 2 else 2.0]], np.float32)}
            for i in range(8)
        ]
        with ThreadPoolExecutor(len(requests)) as pool:  # concurrent requests share batches
            results = list(pool.map(lambda inputs: engine.infer("scale", inputs), requests))
        for inputs, result in zip(requests, results):
            print(f"logits {inputs['logits'][0, 0]:.0f} at T={inputs['temperature'][0, 0]}: {result['scaled'][0]}")
        stats = engine.statistics("scale")[0]
        print(f"{stats['inference_count']} requests in {stats['execution_count']} executions; calls: {CALLS}")


if __name__ == "__main__":
    main()
