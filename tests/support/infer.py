"""Assertions on engine requests shared by the codec tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving_pod.core.types import InferRequest


def assert_same_request(a: InferRequest, b: InferRequest) -> None:
    """``a`` and ``b`` ask the same: model, id, parameters, inputs (names, types, data) and requested outputs."""
    assert (a.model_name, a.model_version, a.id, a.parameters) == (b.model_name, b.model_version, b.id, b.parameters)
    assert [(t.name, t.datatype, t.parameters, t.data.dtype, t.data.shape) for t in a.inputs] == \
           [(t.name, t.datatype, t.parameters, t.data.dtype, t.data.shape) for t in b.inputs]
    for x, y in zip(a.inputs, b.inputs):
        np.testing.assert_array_equal(x.data, y.data)
    assert a.outputs == b.outputs


def infer_simple_repeatedly(server: Any, protocol: str, times: int = 3) -> None:
    """Ask the ``simple`` model (OUTPUT0 = INPUT0 + INPUT1) ``times`` times over one ``protocol`` client: the same
    request each time but for the tensor bytes (binary over HTTP), each answer checked against its own inputs."""
    module, client = server.module(protocol), server.client(protocol)
    binary = {"binary_data": True} if protocol == "http" else {}
    for start in range(times):
        a = np.arange(start, start + 16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), start, dtype=np.int32)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a, **binary)
        inputs[1].set_data_from_numpy(b, **binary)
        result = client.infer("simple", inputs, outputs=[module.InferRequestedOutput("OUTPUT0", **binary)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
