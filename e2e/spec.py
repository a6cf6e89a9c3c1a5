"""What the e2e suite expects of the operator's objects: API coordinates, names, and builders.

Kept in one module so a change in the operator's naming (child Service, pod labels) is one edit.
Builders return plain dicts (applied with `kubectl apply`); the InferenceService shape is the
KServe v1beta1 one the CRD in crds/ accepts.
"""

from __future__ import annotations

from typing import Any

GROUP, VERSION, KIND = "serving.ferry.dev", "v1beta1", "InferenceService"
RESOURCE = f"inferenceservices.{GROUP}"
SHORT_NAME = "fisvc"  # not KServe's "isvc", so both CRDs can coexist
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# The embedded default model repository of ferry-server (no storageUri needed in kind).
DEFAULT_MODEL = "simple"


def predictor_service(name: str) -> str:
    """The Service fronting all ready revisions of an InferenceService (KServe naming)."""
    return f"{name}-predictor"


def pod_selector(name: str) -> str:
    return f"{GROUP}/inferenceservice={name}"


REVISION_LABEL = f"{GROUP}/revision"


def inference_service(name: str, *, args: list[str] | None = None, canary_percent: int | None = None,
                      min_replicas: int = 1, max_replicas: int | None = None,
                      scale_metric: str | None = None, scale_target: int | None = None,
                      env_marker: str = "v1") -> dict[str, Any]:
    """An InferenceService serving ferry-server's embedded models; `env_marker` forces a new revision."""
    predictor: dict[str, Any] = {
        "minReplicas": min_replicas,
        "model": {
            "modelFormat": {"name": "triton"},
            "protocolVersion": "v2",
            "args": args or [],
            "env": [{"name": "FERRY_E2E_REVISION", "value": env_marker}],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
    }
    if max_replicas is not None:
        predictor["maxReplicas"] = max_replicas
    if scale_metric is not None:
        predictor["scaleMetric"] = scale_metric
    if scale_target is not None:
        predictor["scaleTarget"] = scale_target
    if canary_percent is not None:
        predictor["canaryTrafficPercent"] = canary_percent
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"predictor": predictor},
    }
