"""Queue-time autoscaling: the HPA reads avg_time_queue_us from prometheus-adapter and scales up."""

from __future__ import annotations

from typing import Any

import pytest

from e2e import spec
from e2e.kube import Kubectl, condition, wait_for
from e2e.workloads import run_load, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_autoscale, pytest.mark.timeout(1800)]

NAME = "e2e-scale"


def _hpa(kube: Kubectl) -> dict[str, Any]:
    items = kube.get("hpa", selector=spec.pod_selector(NAME))["items"]
    assert len(items) == 1, f"expected one HPA for {NAME}, got {[i['metadata']['name'] for i in items]}"
    return items[0]


def _queue_metric(hpa: dict[str, Any]) -> dict[str, Any] | None:
    for metric in hpa.get("status", {}).get("currentMetrics", []) or []:
        if metric.get("type") == "Pods" and metric["pods"]["metric"]["name"] == "avg_time_queue_us":
            return metric
    return None


def test_hpa_scales_on_queue_time(kube: Kubectl, server_image: str) -> None:
    # Target 1 µs of queue per request: any queueing under concurrent load is above it.
    kube.apply(spec.inference_service(NAME, min_replicas=1, max_replicas=3,
                                      scale_metric="queue", scale_target=1))
    try:
        wait_ready(kube, NAME)
        hpa = wait_for("HPA for the InferenceService", lambda: _hpa(kube), timeout=120)
        assert hpa["apiVersion"] == "autoscaling/v2"
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "avg_time_queue_us"

        # The adapter serves the metric for the pod (idle: a value, ~0) and the HPA can read it.
        wait_for("HPA reading avg_time_queue_us", lambda: _queue_metric(_hpa(kube)), timeout=300)
        assert condition(_hpa(kube), "ScalingActive") == "True"

        run_load(kube, "load-scale", spec.predictor_service(NAME), image=server_image, requests=20000,
                 workers=16, reconnect=False, timeout=600)
        scaled = wait_for("HPA desiredReplicas > 1",
                          lambda: (h := _hpa(kube))["status"].get("desiredReplicas", 1) > 1 and h, timeout=300)
        assert _queue_metric(scaled) is not None
    finally:
        kube.delete(spec.RESOURCE, NAME)
