"""KServe's own Triton InferenceService examples (apiVersion changed) reconcile into valid manifests."""

from __future__ import annotations

from pathlib import Path

import pytest
from operator_support import KSERVE, SAMPLES, check_http_route, expectation, load, validate_manifest

from ferry_operator import desired
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState


def _reconcile(path: Path, gateway: bool) -> desired.Desired:
    obj = load(path)
    obj["metadata"].setdefault("namespace", "default")
    obj["metadata"]["uid"] = "uid-1"
    return desired.compute(obj, {}, config=OperatorConfig(), gateway=gateway, now="2026-01-01T00:00:00Z")


@pytest.mark.parametrize("gateway", [False, True], ids=["replicas", "gateway"])
@pytest.mark.parametrize("path", [p for p in KSERVE + SAMPLES if not expectation(p, "expect-invalid")], ids=lambda p: p.name)
def test_sample_reconciles_to_valid_manifests(path: Path, gateway: bool) -> None:
    result = _reconcile(path, gateway)
    kinds = sorted(a.obj["kind"] for a in result.applies)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler"} <= set(kinds)
    assert ("HTTPRoute" in kinds) == gateway
    for item in result.applies:
        if item.obj["kind"] == "HTTPRoute":
            check_http_route(item.obj)
        else:
            validate_manifest(item.obj)
    deployment = next(a.obj for a in result.applies if a.obj["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["ferry-server"] and "--http-port=8000" in container["args"]
    uri = load(path)["spec"]["predictor"].get("model", load(path)["spec"]["predictor"].get("triton", {})).get("storageUri")
    init = deployment["spec"]["template"]["spec"].get("initContainers", [])
    assert [c["args"][0] for c in init] == ([uri] if uri else [])


def test_kserve_triton_args_are_kept_in_order() -> None:
    result = _reconcile(next(p for p in KSERVE if p.name == "multi_model_triton.yaml"), False)
    args = result.applies[0].obj["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--model-control-mode=explicit", "--log-verbose=1"]


def test_kserve_gpu_limits_in_resources_are_honoured() -> None:
    result = _reconcile(next(p for p in KSERVE if p.name == "raw_gpu_cpu_autoscale.yaml"), False)
    pod = result.applies[0].obj["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "FERRY_INSTANCE_KIND", "value": "KIND_GPU"} in pod["containers"][0]["env"]
    hpa = next(a.obj for a in result.applies if a.obj["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    assert hpa["metadata"]["namespace"] == "ml-prod"


@pytest.mark.parametrize("path", [p for p in KSERVE if expectation(p, "expect-invalid")], ids=lambda p: p.name)
def test_unsupported_kserve_components_are_reported(path: Path) -> None:
    result = _reconcile(path, False)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and expectation(path, "expect-invalid") in ready["message"]
    assert result.applies == ()


def test_ready_sample_reports_kserve_style_status() -> None:
    path = next(p for p in KSERVE if p.name == "torchscript.yaml")
    first = _reconcile(path, False)
    name = first.plan.latest
    obj = load(path)
    obj["metadata"].update(namespace="default", uid="uid-1")
    obj["status"] = first.status
    ready = desired.compute(obj, {name: DeploymentState(name, name.rsplit("-", 1)[1], 1, 1, 1)},
                            config=OperatorConfig(), gateway=False, now="t")
    assert [c["status"] for c in ready.status["conditions"]] == ["True", "True", "True"]
    assert ready.status["components"]["predictor"]["traffic"] == [
        {"revisionName": name, "tag": "latest", "percent": 100, "latestRevision": True}]
