"""Canary rollouts, step by step, through the pure reconcile (desired.compute) and the planner."""

from __future__ import annotations

from typing import Any

import pytest
from operator_support import body, validate_manifest

from ferry_operator import desired, naming, rollout
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState

CONFIG = OperatorConfig()


def _spec(uri: str, **predictor: Any) -> dict[str, Any]:
    return {"predictor": {"minReplicas": 2, "maxReplicas": 6, "model": {"storageUri": uri}, **predictor}}


class Cluster:
    """The state a real cluster would carry between reconciles: status and Deployments."""

    def __init__(self, gateway: bool = False) -> None:
        self.status: dict[str, Any] = {}
        self.deployments: dict[str, DeploymentState] = {}
        self.gateway = gateway

    def reconcile(self, spec: dict[str, Any]) -> desired.Desired:
        result = desired.compute(body(spec, status=self.status), self.deployments, config=CONFIG,
                                 gateway=self.gateway, now="2026-01-01T00:00:00Z")
        for item in result.applies:
            obj = item.obj
            if obj["kind"] == "HTTPRoute":
                continue
            validate_manifest(obj)
            if obj["kind"] == "Deployment":
                name = obj["metadata"]["name"]
                old = self.deployments.get(name)
                replicas = old.replicas if (old and item.keep_replicas) else obj["spec"]["replicas"]
                self.deployments[name] = DeploymentState(name, name.rsplit("-", 1)[-1], replicas,
                                                         old.ready_replicas if old else 0, old.available_replicas if old else 0)
        for kind, name in result.deletes:
            if kind == "Deployment":
                self.deployments.pop(name)
        self.status = result.status
        self.objects = {(a.obj["kind"], a.obj["metadata"]["name"]): a.obj for a in result.applies}
        return result

    def make_ready(self, name: str) -> None:
        old = self.deployments[name]
        self.deployments[name] = DeploymentState(name, old.revision, old.replicas, old.replicas, old.replicas)

    @property
    def traffic(self) -> list[tuple[str, int, str]]:
        return [(t["revisionName"], t["percent"], t["tag"]) for t in self.status["components"]["predictor"]["traffic"]]

    def component(self, key: str) -> Any:
        return self.status["components"]["predictor"].get(key)

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)


def test_first_revision_gets_all_traffic_even_with_a_canary_percent() -> None:
    cluster = Cluster()
    result = cluster.reconcile(_spec("s3://b/v1", canaryTrafficPercent=10))
    first = cluster.component("latestCreatedRevision")
    assert first.startswith("demo-predictor-") and cluster.traffic == [(first, 100, "latest")]
    assert cluster.condition("Ready")["status"] == "False"
    assert {(a.obj["kind"], a.obj["metadata"]["name"]) for a in result.applies} == {
        ("Deployment", first), ("Service", "demo-predictor"), ("Service", "demo-predictor-latest"),
        ("HorizontalPodAutoscaler", "demo-predictor"), ("PodDisruptionBudget", "demo-predictor")}
    assert all(a.obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1" for a in result.applies)
    cluster.make_ready(first)
    cluster.reconcile(_spec("s3://b/v1", canaryTrafficPercent=10))
    assert cluster.condition("Ready")["status"] == "True"
    assert cluster.component("latestReadyRevision") == first
    assert cluster.status["modelStatus"]["transitionStatus"] == "UpToDate"


def test_scaling_fields_do_not_make_a_new_revision() -> None:
    a = desired.revision_of("d", desired.spec.parse(_spec("s3://b/v1")).predictor)
    b = desired.revision_of("d", desired.spec.parse(_spec("s3://b/v1", minReplicas=1, maxReplicas=9,
                                                          canaryTrafficPercent=5, timeout=3)).predictor)
    c = desired.revision_of("d", desired.spec.parse(_spec("s3://b/v2")).predictor)
    legacy = desired.revision_of("d", desired.spec.parse({"predictor": {"triton": {"storageUri": "s3://b/v1"}}}).predictor)
    assert a == b == legacy != c


def test_canary_promote_flow() -> None:
    cluster = Cluster()
    cluster.reconcile(_spec("s3://b/v1"))
    v1 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v1)
    cluster.reconcile(_spec("s3://b/v1"))

    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=20))
    v2 = cluster.component("latestCreatedRevision")
    assert v2 != v1
    # not ready yet: the new revision gets nothing, the old one everything
    assert cluster.traffic == [(v1, 100, "prev"), (v2, 0, "latest")]
    assert cluster.objects[("HorizontalPodAutoscaler", "demo-predictor")]["spec"]["scaleTargetRef"]["name"] == v1
    assert cluster.objects[("Service", "demo-predictor")]["spec"]["selector"][naming.LABEL_REVISION] == v1.rsplit("-", 1)[1]
    assert cluster.condition("PredictorReady")["reason"] == "RevisionNotReady"
    assert f"traffic stays on {v1}" in cluster.condition("PredictorReady")["message"]

    cluster.make_ready(v2)
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=20))
    assert cluster.traffic == [(v1, 80, "prev"), (v2, 20, "latest")]
    assert naming.LABEL_REVISION not in cluster.objects[("Service", "demo-predictor")]["spec"]["selector"]
    assert cluster.objects[("Service", "demo-predictor-prev")]["spec"]["selector"][naming.LABEL_REVISION] == v1.rsplit("-", 1)[1]
    assert cluster.deployments[v2].replicas == 1  # round(2 * 20 / 80) = 1 of 3 pods: 33%, the nearest split
    assert "replica proportion" in cluster.condition("IngressReady")["message"]
    assert cluster.component("latestRolledoutRevision") == v1 and cluster.condition("Ready")["status"] == "True"

    result = cluster.reconcile(_spec("s3://b/v2"))  # promote
    assert cluster.traffic == [(v2, 100, "latest")]
    assert (cluster.component("latestRolledoutRevision"), cluster.component("previousRolledoutRevision")) == (v2, v1)
    assert ("Deployment", v1) in result.deletes and ("Service", "demo-predictor-prev") in result.deletes
    assert cluster.objects[("HorizontalPodAutoscaler", "demo-predictor")]["spec"]["scaleTargetRef"]["name"] == v2
    assert [e.reason for e in result.events] == ["Promoted", "TrafficChanged"]
    assert set(cluster.deployments) == {v2}


def test_rollback_with_zero_percent() -> None:
    cluster = Cluster()
    cluster.reconcile(_spec("s3://b/v1"))
    v1 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v1)
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=30))
    v2 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v2)
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=30))
    assert cluster.traffic == [(v1, 70, "prev"), (v2, 30, "latest")]
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=0))
    assert cluster.traffic == [(v1, 100, "prev"), (v2, 0, "latest")]
    assert cluster.objects[("Service", "demo-predictor")]["spec"]["selector"][naming.LABEL_REVISION] == v1.rsplit("-", 1)[1]
    assert cluster.objects[("Service", "demo-predictor-latest")]["spec"]["selector"][naming.LABEL_REVISION] == v2.rsplit("-", 1)[1]
    assert set(cluster.deployments) == {v1, v2}  # the latest stays reachable through its tag
    cluster.reconcile(_spec("s3://b/v1"))  # reverting the spec returns to the same revision name
    assert cluster.traffic == [(v1, 100, "latest")] and set(cluster.deployments) == {v1}


def test_plain_update_waits_for_the_new_revision() -> None:
    cluster = Cluster()
    cluster.reconcile(_spec("s3://b/v1"))
    v1 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v1)
    cluster.reconcile(_spec("s3://b/v2"))
    v2 = cluster.component("latestCreatedRevision")
    assert cluster.traffic == [(v1, 100, "prev"), (v2, 0, "latest")]
    assert cluster.deployments[v2].replicas == 2  # full capacity before taking the traffic
    cluster.make_ready(v2)
    cluster.reconcile(_spec("s3://b/v2"))
    assert cluster.traffic == [(v2, 100, "latest")] and set(cluster.deployments) == {v2}


def test_gateway_mode_uses_route_weights() -> None:
    cluster = Cluster(gateway=True)
    cluster.reconcile(_spec("s3://b/v1", timeout=20))
    v1 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v1)
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=10, timeout=20))
    v2 = cluster.component("latestCreatedRevision")
    cluster.make_ready(v2)
    cluster.reconcile(_spec("s3://b/v2", canaryTrafficPercent=10, timeout=20))
    route = cluster.objects[("HTTPRoute", "demo")]
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("demo-predictor-prev", 90), ("demo-predictor-latest", 10)]
    assert route["spec"]["hostnames"] == ["demo-default.example.com"]
    assert cluster.objects[("HTTPRoute", "demo-latest")]["spec"]["hostnames"] == ["latest-demo-default.example.com"]
    assert cluster.objects[("HTTPRoute", "demo-prev")]["spec"]["hostnames"] == ["prev-demo-default.example.com"]
    assert cluster.deployments[v2].replicas == 1  # ceil(2 * 10%) : capacity for its share
    assert cluster.status["url"] == "http://demo-default.example.com"


def test_lost_stable_deployment_hands_traffic_to_latest() -> None:
    plan = rollout.plan(latest="d-predictor-b", canary_percent=10, latest_rolledout="d-predictor-a",
                        previous_rolledout=None, ready=frozenset(), existing=frozenset({"d-predictor-b"}))
    assert plan.traffic == (rollout.TrafficTarget("d-predictor-b", 100, "latest", True),)


@pytest.mark.parametrize(("percent", "stable", "expected"), [(10, 9, 1), (50, 4, 4), (25, 3, 1), (90, 1, 9), (0, 5, 1)])
def test_replica_proportion(percent: int, stable: int, expected: int) -> None:
    assert rollout.canary_replicas(percent, stable, stable, exact_weights=False) == expected


def test_a_route_host_label_longer_than_dns_allows_is_refused_in_gateway_mode() -> None:
    """Found by a robustness sweep: a 45-character name in a long namespace got HTTPRoutes for hosts such as
    ``latest-<name>-<namespace>.example.com`` whose first label is past 63 characters (Gateway API admits it, no DNS
    name or certificate can carry it) and was reported Ready with an unreachable URL. KServe fails on it too."""
    name, namespace = "a" * 45, "team-" + "n" * 10  # latest-<45>-<15>: 68 characters
    result = desired.compute(body(_spec("s3://b/v1"), name=name, namespace=namespace), {}, config=CONFIG,
                             gateway=True, now="t")
    assert result.applies == ()
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert f"'latest-{name}-{namespace}' has 68 characters" in ready["message"]
    # without Gateway API there are no hosts: the in-cluster address has short labels
    plain = desired.compute(body(_spec("s3://b/v1"), name=name, namespace=namespace), {}, config=CONFIG,
                            gateway=False, now="t")
    assert plain.applies
    short = desired.compute(body(_spec("s3://b/v1"), name=name, namespace="n" * 10), {}, config=CONFIG,
                            gateway=True, now="t")
    route = next(a.obj for a in short.applies if a.obj["kind"] == "HTTPRoute" and a.obj["metadata"]["name"] == f"{name}-latest")
    assert len(route["spec"]["hostnames"][0].split(".")[0]) == 63
