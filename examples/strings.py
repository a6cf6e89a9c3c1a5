"""A model without batching that works on strings, one request at a time: ``@sample``.

    python examples/strings.py

Strings travel as Triton BYTES tensors (numpy object arrays of ``bytes``); the function may
return ``str`` or ``bytes`` arrays.
"""

from __future__ import annotations

import numpy as np

from serving_pod.pyapi import Engine, ModelConfig, Tensor, sample


@sample
def shout(text: np.ndarray) -> dict[str, np.ndarray]:
    words = [item.decode("utf-8") for item in text.ravel()]
    return {"loud": np.array([w.upper() + "!" for w in words]), "length": np.array([len(w) for w in words], np.int32)}


def bind_models(target) -> None:
    target.bind(
        "shout",
        shout,
        inputs=[Tensor("text", bytes, (-1,))],
        outputs=[Tensor("loud", bytes, (-1,)), Tensor("length", np.int32, (-1,))],
        config=ModelConfig(batching=False),
    )


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    return {"shout": {"text": np.array([b"hello", "w\u00f6rld".encode()], dtype=object)}}


def main() -> None:
    with Engine() as engine:
        bind_models(engine)
        result = engine.infer("shout", {"text": np.array(["ferry", "boat"])})
        print(result["loud"].tolist(), result["length"].tolist())


if __name__ == "__main__":
    main()
