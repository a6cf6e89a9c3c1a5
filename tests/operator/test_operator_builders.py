"""Pure builders, one test per spec feature; every manifest validated against Kubernetes' schemas."""

from __future__ import annotations

from typing import Any

import pytest
from operator_support import check_http_route, validate_manifest

from ferry_operator import mig, naming, spec
from ferry_operator.builders import networking, pod, scaling, workloads
from ferry_operator.config import OperatorConfig

CONFIG = OperatorConfig()


def _predictor(**predictor: Any) -> spec.PredictorSpec:
    predictor.setdefault("model", {"storageUri": "s3://bucket/models"})
    return spec.parse({"predictor": predictor}).predictor


def _deployment(config: OperatorConfig = CONFIG, replicas: int = 1, **predictor: Any) -> dict[str, Any]:
    parsed = _predictor(**predictor)
    obj = workloads.deployment(isvc="demo", namespace="ns", revision="abc123", predictor=parsed,
                               gpu=mig.resolve(parsed.gpu), config=config, replicas=replicas)
    validate_manifest(obj)
    return obj


def _container(obj: dict[str, Any], name: str = pod.CONTAINER) -> dict[str, Any]:
    spec_ = obj["spec"]["template"]["spec"]
    return next(c for c in spec_["containers"] + spec_.get("initContainers", []) if c["name"] == name)


def test_deployment_basics() -> None:
    obj = _deployment(replicas=3)
    assert obj["metadata"]["name"] == "demo-predictor-abc123"
    assert obj["spec"]["replicas"] == 3
    assert obj["spec"]["selector"]["matchLabels"] == {
        naming.LABEL_ISVC: "demo", naming.LABEL_COMPONENT: "predictor", naming.LABEL_REVISION: "abc123"}
    template = obj["spec"]["template"]
    assert obj["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8002", "prometheus.io/path": "/metrics"}
    assert obj["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_server_container_contract() -> None:
    container = _container(_deployment())
    assert container["image"] == "ferry/server:0.1.0"
    assert container["command"] == ["ferry-server"]
    assert container["args"] == ["--model-repository=/mnt/models", "--http-port=8000", "--grpc-port=8001",
                                 "--metrics-port=8002"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["periodSeconds"] == 10 and container["startupProbe"]["failureThreshold"] == 30
    assert {"name": "model-store", "mountPath": "/mnt/models"} in container["volumeMounts"]
    assert "env" not in container  # no GPU: no instance kind override


def test_image_and_settings() -> None:
    config = OperatorConfig(server_image="registry.local/ferry:9", startup_failure_threshold=60, shm_size="1Gi")
    obj = _deployment(config=config)
    assert _container(obj)["image"] == "registry.local/ferry:9"
    assert _container(obj, pod.INITIALIZER)["image"] == "registry.local/ferry:9"  # initializer defaults to it
    assert _container(obj)["startupProbe"]["failureThreshold"] == 60
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in obj["spec"]["template"]["spec"]["volumes"]
    override = _deployment(model={"storageUri": "s3://b/m", "image": "mine:1"}, config=OperatorConfig(initializer_image="init:2"))
    assert _container(override)["image"] == "mine:1" and _container(override, pod.INITIALIZER)["image"] == "init:2"


def test_serving_options_become_flags() -> None:
    args = _container(_deployment(
        serving={"modelControlMode": "explicit", "loadModels": ["a", "b"], "repositoryPollSecs": 5,
                 "strictReadiness": False, "exitTimeoutSecs": 60, "logVerbose": 2,
                 "backendConfig": ["python,shm-default-byte-size=1048576"]},
        model={"storageUri": "s3://b/m", "args": ["--http-max-input-size=1000"]},
    ))["args"]
    assert args[4:] == ["--model-control-mode=explicit", "--load-model=a", "--load-model=b", "--repository-poll-secs=5",
                        "--strict-readiness=false", "--exit-timeout-secs=60", "--log-verbose=2",
                        "--backend-config=python,shm-default-byte-size=1048576", "--http-max-input-size=1000"]


def test_exit_timeout_sets_grace_period() -> None:
    assert _deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    assert _deployment(serving={"exitTimeoutSecs": 120})["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 135


def test_user_model_repository_replaces_the_default() -> None:
    args = _container(_deployment(model={"storageUri": "pvc://c", "args": ["--model-repository=/mnt/models/models"]}))["args"]
    assert args.count("--model-repository=/mnt/models/models") == 1 and "--model-repository=/mnt/models" not in args


def test_env_and_resources() -> None:
    container = _container(_deployment(model={
        "storageUri": "s3://b/m",
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "AWS_REGION", "value": "eu-west-1"}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": 2, "memory": "4Gi"}},
    }))
    assert container["env"] == [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "AWS_REGION", "value": "eu-west-1"}]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


def test_user_gpu_resources_get_toleration_and_instance_kind() -> None:
    obj = _deployment(model={"storageUri": "s3://b/m", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert {"name": "FERRY_INSTANCE_KIND", "value": "KIND_GPU"} in _container(obj)["env"]
    assert obj["spec"]["template"]["spec"]["tolerations"] == [dict(mig.GPU_TOLERATION)]


@pytest.mark.parametrize("uri", ["s3://bucket/models", "gs://b/m", "https://h/m.tar.gz", "file:///models", "/srv/models"])
def test_storage_initializer(uri: str) -> None:
    obj = _deployment(model={"storageUri": uri, "env": [{"name": "AWS_ACCESS_KEY_ID", "value": "k"},
                                                       {"name": "OMP_NUM_THREADS", "value": "1"}]},
                      storageSecretName="s3-creds")
    init = _container(obj, pod.INITIALIZER)
    assert init["command"] == ["ferry-server", "download"] and init["args"] == [uri, "/mnt/models"]
    assert {"name": "AWS_ACCESS_KEY_ID", "value": "k"} in init["env"]
    assert all(e["name"] != "OMP_NUM_THREADS" for e in init["env"])  # only storage variables are passed
    assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert init["volumeMounts"] == [{"name": "model-store", "mountPath": "/mnt/models"}]


def test_pvc_is_mounted_read_only_for_the_initializer() -> None:
    obj = _deployment(model={"storageUri": "pvc://model-store/repos/ensemble"})
    init = _container(obj, pod.INITIALIZER)
    assert {"name": "model-pvc", "mountPath": "/mnt/pvc/model-store", "readOnly": True} in init["volumeMounts"]
    assert {"name": "FERRY_PVC_ROOT", "value": "/mnt/pvc"} in init["env"]
    volumes = obj["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-pvc", "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True}} in volumes


def test_no_storage_uri_no_initializer() -> None:
    obj = _deployment(model={"args": ["--model-control-mode=explicit"]})
    assert "initContainers" not in obj["spec"]["template"]["spec"]


def test_pod_placement_fields() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    template = _deployment(nodeSelector={"pool": "ml"}, tolerations=[toleration], affinity=affinity,
                           serviceAccountName="reader", imagePullSecrets=[{"name": "regcred"}])["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {"pool": "ml"}
    assert template["tolerations"] == [toleration]
    assert template["affinity"] == affinity
    assert template["serviceAccountName"] == "reader"
    assert template["imagePullSecrets"] == [{"name": "regcred"}]


def test_services() -> None:
    main = networking.service(isvc="demo", namespace="ns", name="demo-predictor", revision=None)
    tagged = networking.service(isvc="demo", namespace="ns", name="demo-predictor-latest", revision="abc")
    for obj in (main, tagged):
        validate_manifest(obj)
        assert [(p["name"], p["port"], p["targetPort"]) for p in obj["spec"]["ports"]] == [
            ("http", 8000, "http"), ("grpc", 8001, "grpc"), ("metrics", 8002, "metrics")]
    assert naming.LABEL_REVISION not in main["spec"]["selector"]
    assert tagged["spec"]["selector"][naming.LABEL_REVISION] == "abc"


@pytest.mark.parametrize(
    ("predictor", "metric"),
    [
        ({}, {"type": "Pods", "pods": {"metric": {"name": "avg_time_queue_us"},
                                        "target": {"type": "AverageValue", "averageValue": "50"}}}),
        ({"scaleMetric": "queue", "scaleTarget": 200},
         {"type": "Pods", "pods": {"metric": {"name": "avg_time_queue_us"}, "target": {"type": "AverageValue", "averageValue": "200"}}}),
        ({"scaleMetric": "cpu"}, {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}),
        ({"scaleMetric": "memory", "scaleTarget": 60},
         {"type": "Resource", "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 60}}}),
    ],
)
def test_hpa_metrics(predictor: dict[str, Any], metric: dict[str, Any]) -> None:
    obj = scaling.hpa(isvc="demo", namespace="ns", target="demo-predictor-abc", predictor=_predictor(**predictor), config=CONFIG)
    validate_manifest(obj)
    assert obj["spec"]["metrics"] == [metric]
    assert obj["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-predictor-abc"}


def test_hpa_bounds_and_metric_name_setting() -> None:
    config = OperatorConfig(queue_metric="triton_queue_compute_ratio", queue_target_us=1)
    obj = scaling.hpa(isvc="d", namespace="ns", target="t", predictor=_predictor(minReplicas=2, maxReplicas=6), config=config)
    assert (obj["spec"]["minReplicas"], obj["spec"]["maxReplicas"]) == (2, 6)
    assert obj["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton_queue_compute_ratio"
    fixed = scaling.hpa(isvc="d", namespace="ns", target="t", predictor=_predictor(minReplicas=3), config=config)
    assert (fixed["spec"]["minReplicas"], fixed["spec"]["maxReplicas"]) == (3, 3)


def test_pdb() -> None:
    obj = scaling.pdb(isvc="demo", namespace="ns")
    validate_manifest(obj)
    assert obj["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": naming.selector("demo")}}


def test_http_route() -> None:
    obj = networking.http_route(isvc="demo", namespace="ns", name="demo", hostname="demo-ns.example.com",
                                backends=[("demo-predictor-prev", 90), ("demo-predictor-latest", 10)],
                                gateway_name="gw", gateway_namespace="infra", timeout_s=30)
    check_http_route(obj)
    rule = obj["spec"]["rules"][0]
    assert [(b["name"], b["weight"]) for b in rule["backendRefs"]] == [("demo-predictor-prev", 90), ("demo-predictor-latest", 10)]
    assert rule["timeouts"] == {"request": "30s"}
    assert obj["spec"]["parentRefs"][0]["name"] == "gw" and obj["spec"]["parentRefs"][0]["namespace"] == "infra"


@pytest.mark.parametrize(("seconds", "text"), [(30, "30s"), (100000, "27h46m40s"), (3600, "1h"), (99999 * 3600, "99999h")])
def test_http_route_timeout_is_a_gateway_duration(seconds: int, text: str) -> None:
    # Found by fuzzing: "100000s" has six digits, which Gateway API's duration pattern refuses.
    obj = networking.http_route(isvc="demo", namespace="ns", name="demo", hostname="demo-ns.example.com",
                                backends=[("demo-predictor-latest", 100)], gateway_name="gw", gateway_namespace="infra",
                                timeout_s=seconds)
    check_http_route(obj)
    assert obj["spec"]["rules"][0]["timeouts"] == {"request": text}
