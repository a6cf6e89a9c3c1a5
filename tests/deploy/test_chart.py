"""The Helm charts (charts/ferry, charts/ferry-crds): lint, render and validate with real tools.

Lint and render go through the real Helm library (helm-sdkpy, see helm_render.py); every rendered
manifest is validated with kubernetes-validate against Kubernetes 1.29 and the newest schema it
ships. Objects of the Prometheus Operator (no upstream OpenAPI schema) get a structural check here.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import adapter_rules, helm_render

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ferry"
CRD_CHART = ROOT / "charts" / "ferry-crds"
CRD_NAME = "serving.ferry.dev_inferenceservices.yaml"
CRD_SOURCE = ROOT / "crds" / CRD_NAME
FULL_VALUES = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())
K8S_VERSIONS = ["1.29", kubernetes_validate.latest_version()]
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def _docs(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Each bad value and the schema path Helm's error must name.
BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"operator": {"logLevel": "debug"}}, "additional properties 'logLevel' not allowed"),
    ({"image": {"repository": ""}}, "/image/repository"),
    ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "/operator/watchNamespaces/0"),
    ({"monitoring": {"podMonitor": {"enabled": True, "interval": "often"}}}, "/monitoring/podMonitor/interval"),
    ({"replicas": 2}, "replicas"),  # one operator only: not a knob
    ({"operator": {"trafficMode": "random"}}, "/operator/trafficMode"),
    ({"operator": {"autoscaling": {"queueTargetUs": 0}}}, "/operator/autoscaling/queueTargetUs"),
    ({"monitoring": {"grafanaDashboard": {"enabled": "yes"}}}, "/monitoring/grafanaDashboard/enabled"),
]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, helm_render.Outcome]:
    """Every Helm action of this module, run in one batch (one Go start-up)."""
    tmp = tmp_path_factory.mktemp("charts")
    full = tmp / "full" / "ferry"  # helm-sdkpy's Lint takes no values: lint a copy whose values.yaml is the full set
    shutil.copytree(CHART, full)
    merged = _deep_merge(yaml.safe_load((CHART / "values.yaml").read_text()), FULL_VALUES)
    (full / "values.yaml").write_text(yaml.safe_dump(merged))
    broken = tmp / "broken" / "ferry"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{ .Values.image.repository.nope }}\n")
    jobs = {
        "lint:default": helm_render.Job("lint", str(CHART)),
        "lint:full": helm_render.Job("lint", str(full)),
        "lint:broken": helm_render.Job("lint", str(broken)),
        "lint:crds": helm_render.Job("lint", str(CRD_CHART)),
        "render:default": helm_render.Job("render", str(CHART)),
        "render:full": helm_render.Job("render", str(CHART), FULL_VALUES),
        "render:crds": helm_render.Job("render", str(CRD_CHART)),
        **{f"bad:{i}": helm_render.Job("render", str(CHART), values) for i, (values, _) in enumerate(BAD_VALUES)},
    }
    try:
        outcomes = helm_render.run_many(list(jobs.values()))
    except helm_render.HelmUnavailable as exc:
        pytest.skip(f"helm-sdkpy not usable ({exc}); pip install --ignore-requires-python helm-sdkpy")
    return dict(zip(jobs, outcomes, strict=True))


def _result(helm: dict[str, helm_render.Outcome], key: str) -> Any:
    outcome = helm[key]
    assert outcome.error is None, f"{key}: {outcome.error}"
    return outcome.result


@pytest.fixture(scope="module")
def default_render(helm: dict[str, helm_render.Outcome]) -> dict[str, str]:
    return _result(helm, "render:default")


@pytest.fixture(scope="module")
def full_render(helm: dict[str, helm_render.Outcome]) -> dict[str, str]:
    return _result(helm, "render:full")


@pytest.mark.parametrize("values", ["default", "full"])
def test_chart_lints_without_warnings(values: str, helm: dict[str, helm_render.Outcome]) -> None:
    result = _result(helm, f"lint:{values}")
    assert result["TotalChartsLinted"] == 1
    problems = [m["Path"] for m in result["Messages"] if m["Severity"] >= 2]  # 2 warning, 3 error
    assert problems == [], f"helm lint found warnings/errors in {problems}"


def test_lint_reports_a_broken_template(helm: dict[str, helm_render.Outcome]) -> None:
    result = _result(helm, "lint:broken")
    assert any(m["Severity"] == 3 and m["Path"].startswith("templates") for m in result["Messages"])


def test_crd_chart_lints(helm: dict[str, helm_render.Outcome]) -> None:
    result = _result(helm, "lint:crds")
    assert [m["Path"] for m in result["Messages"] if m["Severity"] >= 2] == []


def _validate(doc: dict[str, Any], version: str) -> None:
    if doc["kind"] in PROMETHEUS_OPERATOR_KINDS:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
        spec = doc["spec"]
        if doc["kind"] == "PrometheusRule":
            assert all(rule.get("record") and rule.get("expr") for g in spec["groups"] for rule in g["rules"])
        else:
            endpoints = spec.get("podMetricsEndpoints") or spec.get("endpoints")
            assert endpoints and all(e["port"] and e["path"] == "/metrics" for e in endpoints)
            assert spec["selector"]["matchLabels"]
        return
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values", ["default", "full"])
def test_rendered_manifests_validate(values: str, version: str, request: pytest.FixtureRequest) -> None:
    docs = _docs(request.getfixturevalue(f"{values}_render")["manifest"])
    kinds = sorted(d["kind"] for d in docs)
    expected = {"default": ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "ServiceAccount"],
                "full": ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "Deployment", "PodMonitor",
                         "PrometheusRule", "Role", "Role", "RoleBinding", "RoleBinding", "ServiceAccount",
                         "ServiceMonitor"]}
    assert kinds == expected[values]
    for doc in docs:
        _validate(doc, version)


def test_validation_catches_a_bad_manifest(default_render: dict[str, str]) -> None:
    deployment = _one(_docs(default_render["manifest"]), "Deployment")
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.29", strict=True)


def test_operator_deployment(full_render: dict[str, str]) -> None:
    docs = _docs(full_render["manifest"])
    deployment = _one(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"] == "ferry-operator"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/ferry/ferry-operator:0.1.0-test"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    assert container["args"] == ["--verbose"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FERRY_LIVENESS_ENDPOINT"] == "http://0.0.0.0:8080/healthz"
    assert env["FERRY_NAMESPACES"] == "models,canary"
    assert env["FERRY_SERVER_IMAGE"] == "registry.example.com/ferry/ferry-server:0.1.0-gpu"
    assert env["FERRY_IMAGE_PULL_POLICY"] == "Always"
    assert (env["FERRY_TRAFFIC_MODE"], env["FERRY_GATEWAY_NAME"], env["FERRY_GATEWAY_NAMESPACE"]) == (
        "gateway", "shared-gateway", "gateway-system")
    assert (env["FERRY_QUEUE_METRIC"], env["FERRY_QUEUE_TARGET_US"]) == ("queue_compute_ratio", "100")
    assert env["FERRY_EXTRA"] == "1"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_default_image_tag_is_app_version(default_render: dict[str, str]) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (container,) = _one(_docs(default_render["manifest"]), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{app_version}")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FERRY_NAMESPACES"] == ""  # cluster-wide
    assert env["FERRY_GATEWAY_NAMESPACE"] == "ferry-system"
    assert env["FERRY_SERVER_IMAGE"].endswith(f":{app_version}")
    assert "args" not in container


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["rules"]


@pytest.mark.parametrize("values", ["default", "full"])
def test_rbac_is_least_privilege(values: str, request: pytest.FixtureRequest) -> None:
    docs = _docs(request.getfixturevalue(f"{values}_render")["manifest"])
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    for role in roles:
        for rule in _rules(role):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['kind']} {role['metadata']['name']} grants * in {field}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "secrets" not in rule["resources"]
    cluster_role = _one(docs, "ClusterRole")
    cluster_resources = {r for rule in _rules(cluster_role) for r in rule["resources"]}
    if values == "default":  # cluster-wide: everything in the ClusterRole
        assert {"inferenceservices", "inferenceservices/status", "deployments", "horizontalpodautoscalers"} <= cluster_resources
    else:  # namespaced: the ClusterRole only reads CRDs, a Role in each watched namespace does the rest
        assert cluster_resources == {"customresourcedefinitions"}
        assert sorted(r["metadata"]["namespace"] for r in docs if r["kind"] == "Role") == ["canary", "models"]
        bindings = [d for d in docs if d["kind"] == "RoleBinding"]
        assert all(b["subjects"][0]["namespace"] == "ferry-system" for b in bindings)


def test_grafana_dashboard(full_render: dict[str, str]) -> None:
    docs = _docs(full_render["manifest"])
    config_map = _one(docs, "ConfigMap", "ferry-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    dashboard = json.loads(config_map["data"]["ferry-serving.json"])
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Requests / s", "Failures / s", "Queue time per request", "Compute time per request",
            "Average batch size", "GPU utilization", "Replicas"} <= titles
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_queue_duration_us",
                   "nv_inference_compute_infer_duration_us", "nv_inference_exec_count", "nv_gpu_utilization"):
        assert metric in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_adapter_rules_configmap_matches_triton_rule(full_render: dict[str, str]) -> None:
    config_map = _one(_docs(full_render["manifest"]), "ConfigMap", "ferry-prometheus-adapter-rules")
    assert config_map["metadata"]["namespace"] == "monitoring"
    rendered = adapter_rules.parse_rules(yaml.safe_load(config_map["data"]["config.yaml"])["rules"])
    assert rendered == adapter_rules.load_rules()
    queue = rendered["avg_time_queue_us"]
    assert queue.series == "nv_inference_queue_duration_us"
    assert queue.metrics_query == (
        "avg(delta(nv_inference_queue_duration_us{<<.LabelMatchers>>}[30s])"
        "/(1+delta(nv_inference_request_success{<<.LabelMatchers>>}[30s]))) by (<<.GroupBy>>)"
    )


def test_adapter_values_file_is_a_copy_of_the_chart_rules() -> None:
    values = yaml.safe_load(adapter_rules.ADAPTER_VALUES.read_text())
    assert adapter_rules.parse_rules(values["rules"]["custom"]) == adapter_rules.load_rules()
    raw_chart = yaml.safe_load(adapter_rules.CHART_RULES.read_text())["rules"]
    assert values["rules"]["custom"] == raw_chart


def test_notes_render(default_render: dict[str, str], full_render: dict[str, str]) -> None:
    assert "kubectl -n ferry-system rollout status deployment/ferry" in default_render["notes"]
    assert "rules.existing=ferry-prometheus-adapter-rules" in full_render["notes"]
    assert "models, canary" in full_render["notes"]


@pytest.mark.parametrize("index", range(len(BAD_VALUES)), ids=[m for _, m in BAD_VALUES])
def test_bad_values_are_rejected_with_the_path(index: int, helm: dict[str, helm_render.Outcome]) -> None:
    outcome = helm[f"bad:{index}"]
    assert outcome.result is None and outcome.error is not None
    assert "values don't meet the specifications" in outcome.error
    assert BAD_VALUES[index][1] in outcome.error


# --- CRDs: copies of the operator's source of truth -------------------------------------------


@pytest.mark.parametrize("copy_path", [CHART / "crds" / CRD_NAME, CRD_CHART / "templates" / CRD_NAME],
                         ids=["ferry/crds", "ferry-crds/templates"])
def test_chart_crds_are_identical_copies(copy_path: Path) -> None:
    assert CRD_SOURCE.exists(), f"{CRD_SOURCE} (the operator's CRD) is missing"
    assert copy_path.read_bytes() == CRD_SOURCE.read_bytes(), (
        f"{copy_path.relative_to(ROOT)} differs from crds/{CRD_NAME}; run: cp crds/{CRD_NAME} {copy_path.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_chart_renders_the_crd(version: str, helm: dict[str, helm_render.Outcome]) -> None:
    docs = _docs(_result(helm, "render:crds")["manifest"])
    (crd,) = docs
    assert crd == yaml.safe_load(CRD_SOURCE.read_text())
    kubernetes_validate.validate(crd, version, strict=True)
    assert crd["spec"]["names"]["kind"] == "InferenceService" and crd["spec"]["group"] == "serving.ferry.dev"


def test_rbac_covers_every_child_the_operator_applies(default_render: dict[str, str]) -> None:
    api = pytest.importorskip("ferry_operator.api")
    rules = _rules(_one(_docs(default_render["manifest"]), "ClusterRole"))

    def verbs(group: str, resource: str) -> set[str]:
        return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}

    for kind, resource in api.RESOURCES.items():
        granted = verbs(resource.group, resource.plural)
        assert {"get", "list", "watch", "create", "patch", "delete"} <= granted, f"{kind}: {sorted(granted)}"
    assert {"get", "list", "watch", "patch"} <= verbs("serving.ferry.dev", "inferenceservices")
    assert "patch" in verbs("serving.ferry.dev", "inferenceservices/status")
    assert "create" in verbs("", "events")
