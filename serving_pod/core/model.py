"""A loaded model version: its config, request validation, metadata, scheduler and statistics.

Built by the registry once instances exist; used by the engine on every request. Validation
and metadata are precomputed at load so the hot path only does dictionary look-ups and shape
comparisons. Error messages follow Triton's wording (clients match on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import config_to_wire
from serving_pod.core.errors import InvalidArgumentError
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


def shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    for got, want in zip(shape, dims):
        if want != -1 and got != want:
            return False
    return True


def _fmt(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


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
        """Check inputs and requested outputs against the config; Triton's messages on failure."""
        specs = self.inputs
        name = self.name
        max_batch = self.max_batch_size
        batch = -1
        seen: set[str] = set()
        for tensor in request.inputs:
            spec = specs.get(tensor.name)
            if spec is None:
                raise InvalidArgumentError(
                    f"unexpected inference input '{tensor.name}' for model '{name}'"
                )
            if tensor.name in seen:
                raise InvalidArgumentError(
                    f"input '{tensor.name}' is specified more than once for model '{name}'"
                )
            seen.add(tensor.name)
            if tensor.datatype != spec.datatype:
                raise InvalidArgumentError(
                    f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                    f"'{name}' expects '{spec.datatype}'"
                )
            shape = tensor.data.shape
            if max_batch > 0:
                if not shape:
                    raise InvalidArgumentError(
                        f"unexpected shape for input '{tensor.name}' for model '{name}'. Expected "
                        f"{_fmt((-1,) + spec.dims)}, got []"
                    )
                if batch == -1:
                    batch = shape[0]
                    if batch < 1 or batch > max_batch:
                        raise InvalidArgumentError(
                            f"inference request batch-size must be <= {max_batch} for '{name}'"
                            if batch > max_batch
                            else f"inference request batch-size must be >= 1 for '{name}'"
                        )
                elif shape[0] != batch:
                    raise InvalidArgumentError(
                        f"inference request for model '{name}' has inputs with different batch "
                        f"sizes: '{tensor.name}' has {shape[0]}, expected {batch}"
                    )
                ok = shape_matches(shape[1:], spec.dims)
                expected = (-1,) + spec.dims
            else:
                ok = shape_matches(shape, spec.dims)
                expected = spec.dims
            if not ok:
                raise InvalidArgumentError(
                    f"unexpected shape for input '{tensor.name}' for model '{name}'. Expected "
                    f"{_fmt(expected)}, got {_fmt(shape)}"
                )
        if len(seen) < len(self.required_inputs) or not self.required_inputs <= seen:
            missing = sorted(self.required_inputs - seen)
            raise InvalidArgumentError(
                f"expected {len(self.required_inputs)} inputs but got {len(seen)} inputs for model "
                f"'{name}'. Got input(s) {sorted(seen)}, but missing required input(s) {missing}. "
                "Please provide all required input(s)."
            )
        if request.outputs:
            for output in request.outputs:
                if output.name not in self.outputs:
                    raise InvalidArgumentError(
                        f"unexpected inference output '{output.name}' for model '{name}'"
                    )

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
