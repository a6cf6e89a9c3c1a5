"""Request sequences the side-by-side modules send to Ferry and to NVIDIA Triton alike (plain HTTP and tritonclient)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import numpy as np


def post_infer(http: int, path: str, body: dict[str, Any]) -> int:
    """POST ``body`` to ``/v2/models/<path>/infer`` on 127.0.0.1:``http``; the status code."""
    return httpx.post(f"http://127.0.0.1:{http}/v2/models/{path}/infer", json=body, timeout=60).status_code


def int32_rows(*rows: list[int], shape: list[int] | None = None, **parameters: Any) -> dict[str, Any]:
    """A JSON infer body with one INT32 input ``X`` holding ``rows`` (shape [len(rows), 2] unless given)."""
    body: dict[str, Any] = {"inputs": [{"name": "X", "datatype": "INT32", "shape": shape or [len(rows), 2],
                                        "data": [value for row in rows for value in row]}]}
    if parameters:
        body["parameters"] = parameters
    return body


def stream_answers(grpc: int, model: str, counts: tuple[int, ...], expected: int) -> int:
    """One INT32 ``COUNT`` request per ``counts`` to the decoupled ``model`` over one gRPC stream; how many answers
    (responses and errors) came once ``expected`` did or 30 s passed."""
    import tritonclient.grpc as grpcclient

    answers: list[Any] = []
    done = threading.Event()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")

    def callback(result: Any, error: Any) -> None:
        answers.append(error or result)
        if len(answers) >= expected:
            done.set()

    client.start_stream(callback=callback)
    for count in counts:
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        client.async_stream_infer(model, [tensor])
    done.wait(30)
    client.stop_stream()
    client.close()
    return len(answers)
