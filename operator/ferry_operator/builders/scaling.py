"""HorizontalPodAutoscaler (autoscaling/v2) and PodDisruptionBudget (policy/v1).

Default metric: average queue time per request, a Pods metric served by prometheus-adapter
from ``nv_inference_queue_duration_us`` (Triton's own chart), target in microseconds.
``scaleMetric: cpu|memory`` scales on resource utilization (percent of requests).
"""

from __future__ import annotations

from typing import Any

from ferry_operator import naming
from ferry_operator.config import OperatorConfig
from ferry_operator.spec import PredictorSpec


def metric(predictor: PredictorSpec, config: OperatorConfig) -> dict[str, Any]:
    if predictor.scale_metric in ("cpu", "memory"):
        default = config.cpu_target_percent if predictor.scale_metric == "cpu" else config.memory_target_percent
        return {
            "type": "Resource",
            "resource": {
                "name": predictor.scale_metric,
                "target": {"type": "Utilization", "averageUtilization": predictor.scale_target or default},
            },
        }
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": config.queue_metric},
            "target": {"type": "AverageValue", "averageValue": str(predictor.scale_target or config.queue_target_us)},
        },
    }


def hpa(*, isvc: str, namespace: str, target: str, predictor: PredictorSpec, config: OperatorConfig) -> dict[str, Any]:
    """HPA ``<isvc>-predictor`` scaling the Deployment ``target`` (the rolled-out revision)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": naming.predictor(isvc), "namespace": namespace, "labels": naming.labels(isvc)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": predictor.effective_min_replicas,
            "maxReplicas": predictor.effective_max_replicas,
            "metrics": [metric(predictor, config)],
            # Scale up at once, down slowly: model pods are expensive to start.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def pdb(*, isvc: str, namespace: str) -> dict[str, Any]:
    """At most one serving pod of ``isvc`` (any revision) voluntarily evicted at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": naming.predictor(isvc), "namespace": namespace, "labels": naming.labels(isvc)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": naming.selector(isvc)}},
    }
