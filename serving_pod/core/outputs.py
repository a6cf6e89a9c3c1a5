"""What a client asked of a response's outputs, applied alike to every response of a request.

The engine builds an ``OutputPlan`` when it admits a request that lists outputs (which outputs,
``classification`` counts, shared-memory placements: checked before inference), then calls
``finish`` on the unary response and on each response a decoupled model streams, so the two
paths cannot disagree. Neighbours: ``classification`` (top-N strings), ``shm`` (region writes).

Shared-memory outputs of a decoupled model follow Triton's gRPC stream: every response is written
into the same placement (each overwrites the previous one), and a response that does not fit gets
its own error while the request's later responses still go out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving_pod import classification
from serving_pod.core.types import InferResponse, RequestedOutput
from serving_pod.shm import Placement, SharedMemoryManager


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """The requested outputs of one request and what to do with each response's tensors."""

    wanted: frozenset[str]
    class_counts: dict[str, int] | None
    shm_targets: dict[str, Placement] | None


def plan_outputs(outputs: list[RequestedOutput], shm: SharedMemoryManager) -> OutputPlan:
    """The plan for ``outputs``; raises ``InvalidArgumentError`` for bad parameters or placements."""
    return OutputPlan(
        frozenset(output.name for output in outputs),
        classification.requested(outputs),
        shm.output_targets(outputs),
    )


def finish(
    response: InferResponse,
    plan: OutputPlan,
    model: Any,
    *,
    labels: classification.LabelCache,
    shm: SharedMemoryManager,
) -> None:
    """Keep the requested outputs, classify and write to shared memory as asked, in place.

    Raises ``ServerError`` (e.g. a region too small for the tensor): only this response fails.
    """
    if len(plan.wanted) != len(response.outputs):
        response.outputs = [tensor for tensor in response.outputs if tensor.name in plan.wanted]
    if plan.class_counts:
        classification.apply(response, plan.class_counts, model, labels)
    if plan.shm_targets:
        shm.write_outputs(response, plan.shm_targets)
