"""Triton's raw binary request: an inference request whose whole body is the one input's bytes.

tritonserver 2.51 reads ``Inference-Header-Content-Length`` with C's ``atoi`` (so ``abc``, ``""`` and ``4294967296``
read as 0, ``2abc`` as 2) and, without the header, takes the body's length; a length of 0 (an empty body included)
makes the request raw (``HTTPAPIServer::EVBufferToRawInput``). The core then deduces the input from the model
configuration (``InferenceRequest::Normalize``): the model must have exactly one input; its shape is the
configured dims, behind a batch dimension of 1 when ``max_batch_size`` > 0, with at most one ``-1`` filled in from
the body's size; a BYTES input must have the dims ``[1]`` and gets the body as its one element. The answer carries
every output the model produced, all as binary data. Triton's errors name the input ``raw_input`` (the name the
front end gives it) and start with ``[request id: <id_unknown>]`` (a raw request has no id).

Neighbours: ``http.app`` calls :func:`header_length`, :func:`decode_raw_request` and :func:`transaction_config`; ``http.codec`` decodes every
other request.
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Protocol

import numpy as np

from serving_pod.core import datatypes
from serving_pod.core.errors import InvalidArgumentError, UnsupportedError
from serving_pod.core.types import InferRequest, Tensor
from serving_pod.http.responses import before_parsing

#: the name tritonserver's HTTP front end gives the raw input before the core renames it (its errors say it)
RAW_INPUT = "raw_input"
#: what tritonserver's core logs before the message of an error about a request without an id
_NO_ID = "[request id: <id_unknown>] "
_LONG_MAX = 2**63 - 1


class Configs(Protocol):
    """What a raw request needs of an engine: the model's configuration (``Engine.model_config_dict``, or a protocol
    worker's ``RemoteEngine`` asking the server process)."""

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any] | Awaitable[dict[str, Any]]: ...


def header_length(value: bytes) -> int:
    """``Inference-Header-Content-Length`` as tritonserver reads it: glibc's ``atoi``, ``(int) strtol(value, 10)``:
    leading blanks and a sign skipped, digits read up to the first other character (none: 0), the value saturated
    to a C ``long`` and then cut to 32 bits."""
    text = value.decode("latin-1").lstrip(" \t\n\v\f\r")
    sign = 1
    if text[:1] in ("+", "-"):
        sign, text = (-1 if text[0] == "-" else 1), text[1:]
    digits = len(text) - len(text.lstrip("0123456789"))
    number = sign * int(text[:digits]) if digits else 0
    number = max(-_LONG_MAX - 1, min(_LONG_MAX, number))
    number &= 0xFFFFFFFF
    return number - 2**32 if number >= 2**31 else number


async def transaction_config(engine: Configs, model_name: str, model_version: str,
                             decoupled_error: str) -> dict[str, Any]:
    """The model's configuration, looked up as tritonserver looks a model up before it reads an inference body
    (``CheckTransactionPolicy``): the engine's error for an unknown or unready model, and ``decoupled_error``
    (found before parsing) for a decoupled one."""
    config = engine.model_config_dict(model_name, model_version)
    if inspect.isawaitable(config):
        config = await config
    if config.get("model_transaction_policy", {}).get("decoupled"):
        raise before_parsing(UnsupportedError(decoupled_error))
    return config


async def decode_raw_request(engine: Configs, body: bytes, model_name: str, model_version: str,
                             decoupled_error: str) -> InferRequest:
    """The request a raw ``body`` makes for ``model_name`` (module docstring); ``InvalidArgumentError`` in Triton's
    words when the input cannot be deduced or the body does not fit it. A decoupled model is refused with
    ``decoupled_error`` first, as tritonserver refuses it before it reads the body."""
    config = await transaction_config(engine, model_name, model_version, decoupled_error)
    inputs = config.get("input") or []
    if len(inputs) != 1:
        raise InvalidArgumentError(
            f"{_NO_ID}Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} inputs in "
            f"'{model_name}' model configuration")
    spec = inputs[0]
    name = spec["name"]
    datatype = datatypes.config_to_wire(spec.get("data_type", "TYPE_INVALID"))
    shape = [1] if int(config.get("max_batch_size", 0)) > 0 else []
    dynamic = -1
    fixed = 1
    for dim in (int(d) for d in spec.get("dims", [])):
        if dim == -1:
            if dynamic != -1:
                raise InvalidArgumentError(
                    f"{_NO_ID}The shape of the raw input '{name}' can not be deduced because there are more than "
                    "one variable-sized dimension")
            dynamic = len(shape)
        else:
            fixed *= dim
        shape.append(dim)
    if datatype == "BYTES":
        if dynamic != -1 or fixed != 1:
            raise InvalidArgumentError(
                f"{_NO_ID}For BYTE datatype raw input '{name}', the model must have input shape [1]")
        data = np.empty(1, dtype=np.object_)
        data[0] = bytes(body)
        return _request(model_name, model_version, Tensor(name, datatype, data.reshape(shape)))
    size = datatypes.ELEMENT_SIZE.get(datatype)
    if size is None:
        raise InvalidArgumentError(f"{_NO_ID}raw input '{name}' has an unsupported data type {spec.get('data_type')}")
    if dynamic != -1:
        shape[dynamic] = len(body) // (fixed * size) if fixed * size else 0
    expected = datatypes.element_count(shape) * size
    if len(body) != expected:  # Triton's words, from its check of every input's byte size
        raise InvalidArgumentError(
            f"{_NO_ID}input byte size mismatch for input '{RAW_INPUT}' for model '{model_name}'. "
            f"Expected {expected}, got {len(body)}")
    data = np.frombuffer(body, dtype=datatypes.numpy_dtype(datatype)).reshape(shape)
    return _request(model_name, model_version, Tensor(name, datatype, data))


def _request(model_name: str, model_version: str, tensor: Tensor) -> InferRequest:
    # every output, all as binary data (tritonserver sets the raw request's default output kind to BINARY)
    return InferRequest(model_name=model_name, model_version=model_version, inputs=[tensor], outputs=None, id="",
                        parameters={"binary_data_output": True})
