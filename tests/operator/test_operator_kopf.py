"""The real operator (kopf) against kmock's Kubernetes emulator over HTTP.

kmock keeps objects in memory and serves discovery, list, watch, create, merge-patch and
delete with finalizers; it does not run controllers, so the tests play the Deployment
controller by patching ``status.readyReplicas`` over HTTP (which kopf then watches).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kmock as kmock_lib
import kopf
import pytest

from ferry_operator.config import OperatorConfig
from ferry_operator.handlers import build_registry

pytestmark = pytest.mark.timeout(60)

ISVC = "/apis/serving.ferry.dev/v1beta1/namespaces/default/inferenceservices"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
SERVICES = "/api/v1/namespaces/default/services"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
ROUTES = "/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes"
CONFIG = OperatorConfig(resync_seconds=0.2, retry_delay_seconds=0.2, api_backoff_seconds=0.01, liveness_endpoint=None)
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def _register(kmock: Any, *, gateway: bool) -> None:
    info = kmock_lib.ResourceInfo
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs={"get", "list", "watch"})
    kmock.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False, verbs={"get", "list", "watch"})
    kmock.resources["v1/events"] = info(kind="Event", namespaced=True, verbs={"create", "list"})
    kmock.resources["serving.ferry.dev/v1beta1/inferenceservices"] = info(
        kind="InferenceService", singular="inferenceservice", namespaced=True, verbs=VERBS,
        shortnames={"fisvc"}, subresources={"status"})
    kmock.resources["apps/v1/deployments"] = info(kind="Deployment", namespaced=True, verbs=VERBS)
    kmock.resources["v1/services"] = info(kind="Service", namespaced=True, verbs=VERBS)
    kmock.resources["autoscaling/v2/horizontalpodautoscalers"] = info(kind="HorizontalPodAutoscaler", namespaced=True, verbs=VERBS)
    kmock.resources["policy/v1/poddisruptionbudgets"] = info(kind="PodDisruptionBudget", namespaced=True, verbs=VERBS)
    if gateway:
        kmock.resources["gateway.networking.k8s.io/v1/httproutes"] = info(kind="HTTPRoute", namespaced=True, verbs=VERBS)


class Cluster:
    """An HTTP client of the emulator plus the operator running in this event loop."""

    def __init__(self, kmock: Any, session: aiohttp.ClientSession) -> None:
        self.kmock = kmock
        self.session = session

    async def get(self, path: str) -> Any:
        async with self.session.get(path) as response:
            return await response.json() if response.status == 200 else None

    async def names(self, path: str) -> list[str]:
        listing = await self.get(path)
        return sorted(item["metadata"]["name"] for item in (listing or {}).get("items", []))

    async def send(self, method: str, path: str, body: Any) -> int:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self.session.request(method, path, json=body, headers=headers) as response:
            return response.status

    async def create_isvc(self, spec: dict[str, Any], name: str = "demo") -> None:
        body = {"apiVersion": "serving.ferry.dev/v1beta1", "kind": "InferenceService",
                "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "generation": 1,
                             "resourceVersion": "1"},  # kopf's JSON patches test it; kmock never bumps it
                "spec": spec}
        assert await self.send("POST", ISVC, body) in (200, 201)

    async def isvc(self, name: str = "demo") -> Any:
        return await self.get(f"{ISVC}/{name}")

    async def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 15) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await predicate()
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; isvc: {await self.isvc()}")

    async def status(self, key: str, name: str = "demo") -> Any:
        obj = await self.isvc(name)
        component = ((obj or {}).get("status") or {}).get("components", {}).get("predictor", {})
        return component.get(key)

    async def traffic(self) -> list[tuple[str, int]]:
        return [(t["revisionName"], t["percent"]) for t in await self.status("traffic") or []]

    async def condition(self, kind: str, name: str = "demo") -> dict[str, Any]:
        obj = await self.isvc(name)
        return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), {})

    def event_reasons(self) -> set[str]:
        # kopf posts Events with generateName, which kmock does not expand (it stores only the
        # first one), so read what was posted rather than what was stored.
        return {r.data.get("reason") for r in self.kmock["post"] if str(r.url).endswith("/events") and r.data}

    async def make_ready(self, deployment: str) -> None:
        obj = await self.get(f"{DEPLOYMENTS}/{deployment}")
        replicas = obj["spec"].get("replicas", 1)
        status = {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}
        assert await self.send("PATCH", f"{DEPLOYMENTS}/{deployment}", {"status": status}) == 200

    @contextlib.asynccontextmanager
    async def operator(self, config: OperatorConfig = CONFIG) -> AsyncIterator[None]:
        """Run the operator in its own thread and event loop, as in production.

        On exit kopf cancels every task of its loop it did not start with; sharing the test's
        loop would hit kmock's server tasks, so the operator gets a loop of its own.
        """
        url = str(self.kmock.url).rstrip("/")
        registry = build_registry(config, login=lambda **_: kopf.ConnectionInfo(server=url, insecure=True))
        stop = threading.Event()
        failures: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(kopf.operator(registry=registry, clusterwide=True, stop_flag=stop, standalone=True))
            except BaseException as exc:  # surfaced in the test below
                failures.append(exc)

        thread = threading.Thread(target=run, name="ferry-operator", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 20)
            assert not thread.is_alive(), "the operator did not stop"
            assert failures == []


@pytest.fixture(params=[False, True], ids=["replicas", "gateway"])
async def cluster(kmock: Any, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    _register(kmock, gateway=request.param)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        yield Cluster(kmock, session)


@pytest.fixture()
async def plain_cluster(kmock: Any) -> AsyncIterator[Cluster]:
    _register(kmock, gateway=False)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        yield Cluster(kmock, session)


SPEC_V1 = {"predictor": {"minReplicas": 2, "maxReplicas": 4, "model": {"modelFormat": {"name": "onnx"}, "storageUri": "s3://b/v1"}}}


def _spec(uri: str, canary: int | None = None) -> dict[str, Any]:
    predictor = {**SPEC_V1["predictor"], "model": {**SPEC_V1["predictor"]["model"], "storageUri": uri}}
    if canary is not None:
        predictor["canaryTrafficPercent"] = canary
    return {"predictor": predictor}


async def test_create_builds_children_and_writes_status(cluster: Cluster) -> None:
    async with cluster.operator():
        await cluster.create_isvc(SPEC_V1)
        [v1] = await cluster.wait(lambda: cluster.names(DEPLOYMENTS), "the Deployment")
        await cluster.wait(lambda: cluster.get(f"{HPAS}/demo-predictor"), "the HPA")
        await cluster.wait(lambda: _equals(cluster.names(PDBS), ["demo-predictor"]), "the PDB")
        assert await cluster.names(SERVICES) == ["demo-predictor", "demo-predictor-latest"]
        gateway = bool(cluster.kmock.resources["gateway.networking.k8s.io/v1/httproutes"].verbs)
        if gateway:
            await cluster.wait(lambda: _equals(cluster.names(ROUTES), ["demo", "demo-latest"]), "the HTTPRoutes")
        for path in (f"{DEPLOYMENTS}/{v1}", f"{SERVICES}/demo-predictor", f"{HPAS}/demo-predictor"):
            owner = (await cluster.get(path))["metadata"]["ownerReferences"]
            assert owner == [{"apiVersion": "serving.ferry.dev/v1beta1", "kind": "InferenceService", "name": "demo",
                              "uid": "uid-demo", "controller": True, "blockOwnerDeletion": True}]
        assert await cluster.wait(lambda: cluster.status("latestCreatedRevision"), "status") == v1
        assert (await cluster.condition("Ready"))["status"] == "False"

        await cluster.make_ready(v1)
        await cluster.wait(lambda: _is(cluster.condition("Ready"), "True"), "Ready=True")
        obj = await cluster.isvc()
        assert obj["status"]["url"] == ("http://demo-default.example.com" if gateway
                                        else "http://demo-predictor.default.svc.cluster.local:8000")
        assert obj["status"]["modelStatus"]["states"]["activeModelState"] == "Loaded"
        assert "serving.ferry.dev/finalizer" in obj["metadata"]["finalizers"]
        assert "serving.ferry.dev/last-handled-configuration" in obj["metadata"]["annotations"]
        await cluster.wait(lambda: _true("Ready" in cluster.event_reasons()), "the Ready event")
        assert {"RevisionCreated", "TrafficChanged", "Ready"} <= cluster.event_reasons()


async def _true(value: bool) -> bool:
    return value


async def _is(condition: Any, status: str) -> bool:
    return (await condition).get("status") == status


async def test_canary_promote_and_rollback(cluster: Cluster) -> None:
    async with cluster.operator():
        await cluster.create_isvc(SPEC_V1)
        [v1] = await cluster.wait(lambda: cluster.names(DEPLOYMENTS), "v1")
        await cluster.make_ready(v1)
        await cluster.wait(lambda: _is(cluster.condition("Ready"), "True"), "v1 ready")

        assert await cluster.send("PATCH", f"{ISVC}/demo", {"spec": _spec("s3://b/v2", canary=25)}) == 200
        names = await cluster.wait(lambda: _two(cluster.names(DEPLOYMENTS)), "v2 Deployment")
        [v2] = [n for n in names if n != v1]
        await cluster.wait(lambda: _equals(cluster.traffic(), [(v1, 100), (v2, 0)]), "v2 created without traffic")
        await cluster.make_ready(v2)
        await cluster.wait(lambda: _equals(cluster.traffic(), [(v1, 75), (v2, 25)]), "25% canary")
        hpa = await cluster.get(f"{HPAS}/demo-predictor")
        assert hpa["spec"]["scaleTargetRef"]["name"] == v1
        assert "serving.ferry.dev/revision" not in (await cluster.get(f"{SERVICES}/demo-predictor"))["spec"]["selector"]

        assert await cluster.send("PATCH", f"{ISVC}/demo", {"spec": {"predictor": {"canaryTrafficPercent": 0}}}) == 200
        await cluster.wait(lambda: _equals(cluster.traffic(), [(v1, 100), (v2, 0)]), "rollback")
        selector = (await cluster.get(f"{SERVICES}/demo-predictor"))["spec"]["selector"]
        assert selector["serving.ferry.dev/revision"] == v1.rsplit("-", 1)[1]

        assert await cluster.send("PATCH", f"{ISVC}/demo", {"spec": {"predictor": {"canaryTrafficPercent": None}}}) == 200
        await cluster.wait(lambda: _equals(cluster.traffic(), [(v2, 100)]), "promotion")
        await cluster.wait(lambda: _equals(cluster.names(DEPLOYMENTS), [v2]), "old revision retired")
        assert await cluster.status("previousRolledoutRevision") == v1
        assert (await cluster.get(f"{HPAS}/demo-predictor"))["spec"]["scaleTargetRef"]["name"] == v2
        assert await cluster.names(SERVICES) == ["demo-predictor", "demo-predictor-latest"]


async def _two(names: Any) -> Any:
    value = await names
    return value if len(value) == 2 else None


async def _equals(value: Any, expected: Any) -> bool:
    return await value == expected


async def test_delete_removes_children(plain_cluster: Cluster) -> None:
    cluster = plain_cluster
    async with cluster.operator():
        await cluster.create_isvc(SPEC_V1)
        await cluster.wait(lambda: cluster.get(f"{HPAS}/demo-predictor"), "children")
        await cluster.wait(lambda: _has_finalizer(cluster), "finalizer")
        assert await cluster.send("DELETE", f"{ISVC}/demo", {}) == 200
        await cluster.wait(lambda: _gone(cluster), "deletion")
        assert await cluster.names(DEPLOYMENTS) == [] and await cluster.names(SERVICES) == []
        assert await cluster.names(HPAS) == [] and await cluster.names(PDBS) == []


async def _has_finalizer(cluster: Cluster) -> bool:
    return bool(((await cluster.isvc()) or {}).get("metadata", {}).get("finalizers"))


async def _gone(cluster: Cluster) -> bool:
    return await cluster.isvc() is None


async def test_restart_creates_no_duplicates(plain_cluster: Cluster) -> None:
    cluster = plain_cluster
    kmock = cluster.kmock
    async with cluster.operator():
        await cluster.create_isvc(SPEC_V1)
        [v1] = await cluster.wait(lambda: cluster.names(DEPLOYMENTS), "v1")
        await cluster.make_ready(v1)
        await cluster.wait(lambda: _is(cluster.condition("Ready"), "True"), "ready")
    posts_before = len(kmock["post"])
    patches_before = len(kmock["patch"])
    async with cluster.operator():
        await asyncio.sleep(1.5)  # resume handler + several timer ticks
        assert await cluster.names(DEPLOYMENTS) == [v1]
        assert (await cluster.condition("Ready"))["status"] == "True"
    new_posts = [r for r in list(kmock["post"])[posts_before:] if "/events" not in str(r.url)]
    assert new_posts == []  # nothing created again
    new_patches = [str(r.url) for r in list(kmock["patch"])[patches_before:]]
    assert not any("/deployments/" in url or "/services/" in url for url in new_patches)


async def test_invalid_spec_sets_a_condition_and_recovers(plain_cluster: Cluster) -> None:
    cluster = plain_cluster
    bad = {"predictor": {"gpu": {"migProfile": "1g.5gb", "product": "NVIDIA-H100-80GB-HBM3"},
                         "model": {"storageUri": "s3://b/m"}}}
    async with cluster.operator():
        await cluster.create_isvc(bad)
        ready = await cluster.wait(lambda: cluster.condition("Ready"), "a condition")
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "unknown MIG profile '1g.5gb' for NVIDIA-H100-80GB-HBM3" in ready["message"]
        await asyncio.sleep(0.5)
        assert await cluster.names(DEPLOYMENTS) == []  # nothing created
        fixed = {"predictor": {**bad["predictor"], "gpu": {"migProfile": "1g.10gb", "product": "NVIDIA-H100-80GB-HBM3"}}}
        assert await cluster.send("PATCH", f"{ISVC}/demo", {"spec": fixed}) == 200
        [name] = await cluster.wait(lambda: cluster.names(DEPLOYMENTS), "a Deployment after the fix")
        container = (await cluster.get(f"{DEPLOYMENTS}/{name}"))["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        assert "InvalidSpec" in cluster.event_reasons()


async def test_api_errors_are_retried(plain_cluster: Cluster) -> None:
    cluster = plain_cluster
    kmock = cluster.kmock
    failing_create = kmock[f"post {DEPLOYMENTS}"][:1] << 500 << {"kind": "Status", "code": 500, "message": "etcd timeout"}
    conflict = kmock[f"post {SERVICES}"][:1] << 409 << {"kind": "Status", "code": 409, "message": "conflict"}
    unavailable = kmock[f"get {HPAS}/demo-predictor"][:2] << 503
    async with cluster.operator():
        await cluster.create_isvc(SPEC_V1)
        await cluster.wait(lambda: cluster.get(f"{HPAS}/demo-predictor"), "the HPA after 503s")
        await cluster.wait(lambda: cluster.status("latestCreatedRevision"), "status")
        assert len(await cluster.names(DEPLOYMENTS)) == 1
        assert await cluster.names(SERVICES) == ["demo-predictor", "demo-predictor-latest"]
    assert len(failing_create) == 1 and len(conflict) == 1 and len(unavailable) == 2
    assert len(kmock[f"post {DEPLOYMENTS}"]) >= 2  # the 500 was retried (then 409 -> patch path)


async def test_a_child_the_api_server_refuses_is_reported_beside_a_good_one(plain_cluster: Cluster) -> None:
    """Found by fuzzing: a pass-through field the API server rejects (here an affinity it cannot decode)
    made every reconcile raise, a kopf retry loop with no status; now it is a condition, once."""
    cluster = plain_cluster
    refused = cluster.kmock[f"post {DEPLOYMENTS}"][lambda r: r.data["metadata"]["name"].startswith("bad-")] << 422 << {
        "kind": "Status", "code": 422, "reason": "Invalid",
        "message": 'Deployment.apps "bad-predictor-x" is invalid: spec.template.spec.affinity.nodeAffinity: Invalid value'}
    bad = {"predictor": {"affinity": {"nodeAffinity": {"junk": 1}}, "model": {"storageUri": "s3://b/m"}}}
    async with cluster.operator():
        await cluster.create_isvc(bad, name="bad")
        await cluster.create_isvc(SPEC_V1, name="good")
        ready = await cluster.wait(lambda: _reason(cluster, "bad"), "the refusal in the status")
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "the API server refused to create deployments/bad-predictor-" in ready["message"]
        assert "affinity.nodeAffinity: Invalid value" in ready["message"]
        await cluster.wait(lambda: cluster.status("latestCreatedRevision", "good"), "the good one's status")
        assert [n for n in await cluster.names(DEPLOYMENTS) if n.startswith("good-")]
    assert len(refused) >= 1


async def _reason(cluster: Cluster, name: str) -> dict[str, Any]:
    ready = await cluster.condition("Ready", name)
    return ready if ready.get("reason") == "InvalidSpec" else {}


async def test_a_route_named_like_another_isvcs_tag_route_is_left_alone(kmock: Any) -> None:
    """Found by fuzzing: InferenceService ``x`` deleted its unused ``x-prev`` HTTPRoute, the main route of
    InferenceService ``x-prev``, and ``x-latest`` took over ``x``'s tag route. Others' objects are not touched."""
    _register(kmock, gateway=True)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        cluster = Cluster(kmock, session)
        async with cluster.operator():
            await cluster.create_isvc(SPEC_V1, name="x-prev")
            await cluster.wait(lambda: _equals(cluster.names(ROUTES), ["x-prev", "x-prev-latest"]), "x-prev's routes")
            await cluster.create_isvc(SPEC_V1, name="x")
            await cluster.wait(lambda: _equals(cluster.names(ROUTES), ["x", "x-latest", "x-prev", "x-prev-latest"]),
                               "x's routes")
            await cluster.wait(lambda: cluster.status("latestCreatedRevision", "x"), "x reconciled (deletes done)")
            await asyncio.sleep(0.5)
            assert "x-prev" in await cluster.names(ROUTES)  # x's unused "prev" route name: not x's object
            await cluster.create_isvc(SPEC_V1, name="x-latest")
            ready = await cluster.wait(lambda: _conflict(cluster, "x-latest"), "x-latest's name conflict")
            assert "HTTPRoute x-latest already exists and is controlled by InferenceService/x" in ready["message"]
            route = await cluster.get(f"{ROUTES}/x-latest")
            assert route["metadata"]["ownerReferences"][0]["name"] == "x"
            assert route["spec"]["hostnames"] == ["latest-x-default.example.com"]


async def _conflict(cluster: Cluster, name: str) -> dict[str, Any]:
    ready = await cluster.condition("Ready", name)
    return ready if ready.get("reason") == "NameConflict" else {}
