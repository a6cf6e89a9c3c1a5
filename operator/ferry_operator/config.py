"""Operator settings: one frozen value read from ``FERRY_*`` environment variables.

Built once in ``main`` (or by tests) and passed down explicitly; nothing reads the
environment at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TRAFFIC_MODES = ("auto", "gateway", "replicas")


@dataclass(frozen=True)
class OperatorConfig:
    server_image: str = "ferry/server:0.1.0"
    initializer_image: str | None = None  # default: the server image (it ships `ferry-server download`)
    image_pull_policy: str = "IfNotPresent"
    queue_metric: str = "avg_time_queue_us"  # Pods metric served by prometheus-adapter
    queue_target_us: int = 50  # default AverageValue of the queue-time metric (Triton's chart)
    cpu_target_percent: int = 80
    memory_target_percent: int = 80
    traffic_mode: str = "auto"  # auto: Gateway API when its HTTPRoute resource is served
    gateway_name: str = "ferry-gateway"
    gateway_namespace: str = "ferry-system"
    ingress_domain: str = "example.com"
    cluster_domain: str = "cluster.local"
    startup_failure_threshold: int = 30  # x 10 s for model loading before the pod is restarted
    exit_timeout_secs: int = 30  # ferry-server --exit-timeout-secs default (tritonserver's)
    shm_size: str = "256Mi"  # /dev/shm for the python backend
    resync_seconds: float = 10.0  # timer: readiness, canary progress, drift
    full_resync_seconds: float = 300.0  # re-apply children even when nothing changed
    retry_delay_seconds: float = 5.0
    api_retries: int = 4
    api_backoff_seconds: float = 0.2
    prefix: str = "serving.ferry.dev"  # finalizer, annotations and labels
    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"

    def __post_init__(self) -> None:
        if self.traffic_mode not in TRAFFIC_MODES:
            raise ValueError(f"FERRY_TRAFFIC_MODE must be one of {', '.join(TRAFFIC_MODES)}, got {self.traffic_mode!r}")

    @property
    def storage_image(self) -> str:
        return self.initializer_image or self.server_image

    @property
    def finalizer(self) -> str:
        return f"{self.prefix}/finalizer"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read ``FERRY_<FIELD>`` variables (upper-cased field names); bad values raise ValueError."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name, default in cls.__dataclass_fields__.items():
            raw = env.get(f"FERRY_{name.upper()}")
            if raw is None:
                continue
            kind = type(default.default) if default.default is not None else str
            try:
                if kind is tuple:
                    values[name] = tuple(item.strip() for item in raw.split(",") if item.strip())
                elif kind is int:
                    values[name] = int(raw)
                elif kind is float:
                    values[name] = float(raw)
                else:
                    values[name] = raw or None if name in ("initializer_image", "liveness_endpoint") else raw
            except ValueError:
                raise ValueError(f"FERRY_{name.upper()}: expected {kind.__name__}, got {raw!r}") from None
        return cls(**values)  # type: ignore[arg-type]
