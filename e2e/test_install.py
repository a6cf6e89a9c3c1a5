"""The charts installed what they promise: CRD, operator, monitoring glue, custom metrics API."""

from __future__ import annotations

import json

import pytest

from e2e import spec
from e2e.kube import Kubectl, condition

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_install]


def test_crd_is_established(kube: Kubectl) -> None:
    crd = json.loads(kube.run("get", "crd", spec.RESOURCE, "-o", "json", namespaced=False))
    assert condition(crd, "Established") == "True"
    assert crd["spec"]["names"]["shortNames"] == [spec.SHORT_NAME]


def test_operator_is_available(system: Kubectl) -> None:
    deployment = system.get("deployment", "ferry")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert condition(deployment, "Available") == "True"
    assert deployment["status"].get("readyReplicas") == 1


def test_monitoring_objects(system: Kubectl) -> None:
    assert system.exists("podmonitor.monitoring.coreos.com", "ferry-serving")
    dashboard = system.get("configmap", "ferry-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["ferry-serving.json"])["uid"] == "ferry-serving"


def test_custom_metrics_api_serves_the_queue_metric(kube: Kubectl) -> None:
    resources = json.loads(kube.raw("/apis/custom.metrics.k8s.io/v1beta1"))
    assert resources["groupVersion"] == "custom.metrics.k8s.io/v1beta1"
