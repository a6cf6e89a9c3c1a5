"""The per-revision Deployment of the serving pod."""

from __future__ import annotations

from typing import Any

from ferry_operator import naming
from ferry_operator.builders import pod
from ferry_operator.config import OperatorConfig
from ferry_operator.mig import GpuResources
from ferry_operator.spec import PredictorSpec


def deployment(
    *,
    isvc: str,
    namespace: str,
    revision: str,
    predictor: PredictorSpec,
    gpu: GpuResources,
    config: OperatorConfig,
    replicas: int,
) -> dict[str, Any]:
    """Deployment ``<isvc>-predictor-<revision>``.

    ``replicas`` is the count on creation; whether it is enforced later (canary) or left to the
    HPA (rolled-out revision) is decided by the caller when applying.
    """
    labels = naming.labels(isvc, revision)
    template_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(naming.METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": naming.revision_deployment(isvc, revision),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": naming.selector(isvc, revision)},
            # A revision's template changes only with operator settings (e.g. the default image):
            # surge one pod and keep every ready one until its replacement is ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": max(600, 10 * config.startup_failure_threshold + 120),
            "template": {
                "metadata": {"labels": labels, "annotations": template_annotations},
                "spec": pod.pod_spec(predictor, gpu, config),
            },
        },
    }
