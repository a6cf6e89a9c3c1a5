"""A model that only accepts certain batch sizes: ``@pad_batch`` repeats the last row up to the next size.

    python examples/padded.py

The function sees batches of exactly 4 or 8 rows (the preferred sizes) and the padding rows are
dropped from its outputs before ``@batch`` splits them back to the requests.
"""

from __future__ import annotations

import numpy as np

from serving_pod.pyapi import DynamicBatcher, Engine, ModelConfig, Tensor, batch, pad_batch

#: the batch sizes the function was called with
SEEN: list[int] = []


@batch
@pad_batch
def fixed_size(x: np.ndarray) -> dict[str, np.ndarray]:
    if len(x) not in (4, 8):
        raise ValueError(f"this model only runs batches of 4 or 8, got {len(x)}")
    SEEN.append(len(x))
    return {"y": x.sum(axis=1, keepdims=True)}


def bind_models(target) -> None:
    target.bind(
        "fixed_size",
        fixed_size,
        inputs=[Tensor("x", np.int64, (3,))],
        outputs=[Tensor("y", np.int64, (1,))],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=(4,))),
    )


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    return {"fixed_size": {"x": np.arange(15, dtype=np.int64).reshape(5, 3)}}


def main() -> None:
    SEEN.clear()
    with Engine() as engine:
        bind_models(engine)
        for rows in (1, 3, 5):
            x = np.arange(rows * 3, dtype=np.int64).reshape(rows, 3)
            print(f"{rows} rows -> {engine.infer('fixed_size', {'x': x})['y'].ravel().tolist()}")
    print(f"the function saw batches of {SEEN}")


if __name__ == "__main__":
    main()
