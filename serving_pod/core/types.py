"""Protocol-neutral inference request and response values.

The HTTP and gRPC codecs decode wire messages into these and encode responses out of them;
schedulers and backends see nothing else. Tensors are numpy arrays; ``datatype`` keeps the
wire name because some types (BF16, BYTES) are not recoverable from numpy alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(slots=True)
class Tensor:
    """A named tensor with its wire datatype. ``data.shape`` is the tensor's shape."""

    name: str
    datatype: str
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    #: set by a codec when the data sent does not fit (``datatypes.DataDefect``; ``data`` is then a placeholder):
    #: the model's validation refuses the request, after its own checks, as Triton's core does
    defect: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (binary_data, classification...)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request as the engine sees it.

    ``model_version`` is "" for the model's default (latest ready) version.
    ``outputs`` is None when the client did not list outputs (then every output is returned).
    ``parameters`` carries request parameters verbatim (priority, timeout, sequence_id...).
    """

    model_name: str
    model_version: str
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    #: monotonic ns at which the request reached the engine; set by the engine.
    arrival_ns: int = 0
    #: decoupled models only: ``responder(response_or_error_or_None, final)`` delivers one
    #: response (or an error, or just the final flag) to the client; callable from any thread.
    responder: Any = None
    #: set when the client went away; backends may poll ``cancelled.is_set()``.
    cancelled: Any = None
    #: custom parameters named like reserved ones (``timeout``, ``sequence_id``...), which only a python BLS
    #: call can send: the called model sees them in ``request.parameters()``, no scheduler reads them.
    custom_reserved: dict[str, Any] | None = None
    #: set by an ensemble on its steps' requests (``statistics.StepCompute``): also charged the compute times the
    #: request is charged by its model (Triton's secondary statistics aggregator)
    stats_sink: Any = None
    #: the request's ``trace.Trace`` once the engine sampled it (None untraced); on an ensemble step's request
    #: before admission, the ensemble request's trace (its parent)
    trace: Any = None
    #: monotonic ns at which the engine handed the admitted request to its model's scheduler, where Triton's queue
    #: time starts (its ``QueueStartNs``: after the request was validated); 0: ``arrival_ns`` stands for it
    queue_start_ns: int = 0
    #: names of the shared memory regions the admitted request reads or writes, held (``shm.hold``) until its last
    #: response: None when it uses none
    shm_held: list[str] | None = None


@dataclass(slots=True)
class InferResponse:
    """One inference response. ``final`` is False for non-final decoupled responses."""

    #: True only on ``FinalFlag``: the end of a decoupled stream, not a response the model sent
    flag_only: ClassVar[bool] = False

    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True


@dataclass(slots=True)
class FinalFlag(InferResponse):
    """The end of a decoupled request's stream when the model sent the final flag alone (Triton's
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` with no response), as ``engine.stream_infer`` yields it. A
    response with no outputs sent with the final flag is a plain ``InferResponse``: Triton sends that one
    as a response (gRPC streaming, generate), the flag alone only where the client asked for it."""

    flag_only: ClassVar[bool] = True
