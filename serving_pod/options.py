"""Server options as frozen values, built from the command line by ``cli`` (tritonserver's flag names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from serving_pod.core.engine import EngineOptions

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Everything ``FerryServer`` needs; ports 0 mean "pick a free port"."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    metrics_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    log_verbose: int = 0
    log_format: str = "default"
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
