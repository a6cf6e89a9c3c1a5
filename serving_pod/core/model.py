"""A loaded model version: its config, request validation, metadata, scheduler and statistics.

Built by the registry once instances exist; used by the engine on every request. Validation
(``validation``, Triton's order and words: clients match on them) and metadata are precomputed at load so
the hot path only does dictionary look-ups and shape comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core import validation
from serving_pod.core.datatypes import config_to_wire
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest
from serving_pod.schedulers.base import Scheduler


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared input or output: wire datatype, dims (without the batch dim), optional flag."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


def tensor_specs(tensors) -> dict[str, TensorSpec]:
    return {
        tensor.name: TensorSpec(
            tensor.name,
            config_to_wire(mc.DataType.Name(tensor.data_type)),
            tuple(tensor.dims),
            bool(getattr(tensor, "optional", False)),
        )
        for tensor in tensors
    }


class Model:
    """A READY model version as the request path sees it."""

    def __init__(
        self,
        config: mc.ModelConfig,
        version: int,
        scheduler: Scheduler,
        stats: ModelStats,
        *,
        pool: Any = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.version = version
        self.version_str = str(version)
        self.scheduler = scheduler
        self.stats = stats
        self.pool = pool
        #: the folder the model was loaded from (label files, sequence initial_state data files)
        self.model_dir: Any = None
        self.max_batch_size = config.max_batch_size
        self.inputs = tensor_specs(config.input)
        self.outputs = tensor_specs(config.output)
        self.required_inputs = frozenset(n for n, s in self.inputs.items() if not s.optional)
        self.decoupled = config.model_transaction_policy.decoupled
        self.platform = config.platform or config.backend

    def batch_size_of(self, request: InferRequest) -> int:
        """Batch elements in ``request``: dim 0 when the model batches, else 1."""
        if self.max_batch_size > 0 and request.inputs:
            return request.inputs[0].data.shape[0]
        return 1

    def validate(self, request: InferRequest) -> None:
        """Check inputs and requested outputs against the config; Triton's order and words on failure
        (``validation``)."""
        validation.check(self, request)

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """KServe V2 model metadata (a leading -1 dim when the model batches)."""
        prefix = (-1,) if self.max_batch_size > 0 else ()

        def entry(spec: TensorSpec) -> dict[str, Any]:
            return {"name": spec.name, "datatype": spec.datatype, "shape": list(prefix + spec.dims)}

        return {
            "name": self.name,
            "versions": versions,
            "platform": self.platform,
            "inputs": [entry(s) for s in self.inputs.values()],
            "outputs": [entry(s) for s in self.outputs.values()],
        }
