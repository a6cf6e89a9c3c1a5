"""The Python-first API: run the engine in-process and serve Python functions as models (PyTriton-style).

- ``Engine`` / ``AsyncEngine``: the serving engine in this process, no HTTP or gRPC: load repository
  models, ``bind`` functions, ``infer`` with numpy dicts, ``stream`` decoupled responses,
  ``statistics()`` and ``metrics()``.
- ``Server`` / ``AsyncServer``: the same, also serving HTTP, gRPC and metrics (``serve()`` blocks).
- ``Tensor``, ``ModelConfig``, ``DynamicBatcher``: what ``bind`` declares (PyTriton's names).
- Decorators ``batch``, ``sample``, ``pad_batch``, ``group_by_values``, ``group_by_keys``,
  ``first_value``, ``fill_optionals`` (PyTriton's semantics).
- ``ModelClient``: tritonclient-based client of one model (``http://`` or ``grpc://``).

Bound functions run on the backend ``ferry_callable`` (``serving_pod.backends.callable``).
Docs: docs/python-api.md. Importing this package starts nothing.
"""

from serving_pod.backends.callable import Request, current_binding
from serving_pod.core.errors import ServerError
from serving_pod.pyapi.aio import AsyncEngine, AsyncServer
from serving_pod.pyapi.client import ModelClient, ModelClientError
from serving_pod.pyapi.config import BoundModel, DynamicBatcher, ModelConfig, Tensor
from serving_pod.pyapi.decorators import (
    DecoratorError,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
)
from serving_pod.pyapi.sync import Engine, Server

__all__ = [
    "AsyncEngine", "AsyncServer", "BoundModel", "DecoratorError", "DynamicBatcher", "Engine", "ModelClient",
    "ModelClientError", "ModelConfig", "Request", "Server", "ServerError", "Tensor", "batch", "current_binding",
    "fill_optionals", "first_value", "group_by_keys", "group_by_values", "pad_batch", "sample",
]
