"""KFServing-style canary: P% to the new revision, promote to 100%, roll back to the previous.

Traffic is sent from inside the cluster (a Job hitting the predictor Service) and attributed to
revisions by each pod's own nv_inference_request_success counter, read through pods/proxy.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e import spec
from e2e.kube import Kubectl, wait_for
from e2e.workloads import run_load, served_by_revision, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_canary, pytest.mark.timeout(1800)]

NAME = "e2e-canary"
REQUESTS = 400
# Without a Gateway API implementation (plain kind) the split follows the replica ratio behind the
# predictor Service: 3 stable pods + round(3 * 25 / 75) = 1 canary pod = 25 %.
STABLE_REPLICAS, CANARY_PERCENT = 3, 25


def _traffic(obj: dict[str, Any]) -> dict[str, int]:
    """status.traffic as {tag-or-latest: percent}."""
    out: dict[str, int] = {}
    for entry in obj.get("status", {}).get("components", {}).get("predictor", {}).get("traffic", []):
        key = entry.get("tag") or ("latest" if entry.get("latestRevision") else entry["revisionName"])
        out[key] = out.get(key, 0) + int(entry.get("percent", 0))
    return out


def _wait_traffic(kube: Kubectl, expected: dict[str, int]) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = kube.get(spec.RESOURCE, NAME)
        return obj if _traffic(obj) == expected else None

    return wait_for(f"{NAME} traffic {expected}", probe, timeout=600)


def _revisions(obj: dict[str, Any]) -> tuple[str, str | None]:
    predictor = obj["status"]["components"]["predictor"]
    return predictor["latestReadyRevision"], predictor.get("previousRolledoutRevision")


def _share(kube: Kubectl, image: str, job: str) -> dict[str, float]:
    before = served_by_revision(kube, NAME)
    run_load(kube, job, spec.predictor_service(NAME), image=image, requests=REQUESTS)
    after = served_by_revision(kube, NAME)
    served = {rev: after.get(rev, 0.0) - before.get(rev, 0.0) for rev in after}
    total = sum(served.values())
    assert total >= REQUESTS, f"only {total} of {REQUESTS} requests were counted: {served}"
    return {rev: count / total for rev, count in served.items()}


def test_canary_split_promote_and_rollback(kube: Kubectl, server_image: str) -> None:
    kube.apply(spec.inference_service(NAME, env_marker="v1", min_replicas=STABLE_REPLICAS))
    try:
        first = wait_ready(kube, NAME)
        _wait_traffic(kube, {"latest": 100})
        v1, _ = _revisions(first)

        # A spec change with canaryTrafficPercent P: the new revision gets P %, v1 keeps 100-P %.
        kube.apply(spec.inference_service(NAME, env_marker="v2", canary_percent=CANARY_PERCENT,
                                          min_replicas=STABLE_REPLICAS))
        split = _wait_traffic(kube, {"latest": CANARY_PERCENT, "prev": 100 - CANARY_PERCENT})
        v2, prev = _revisions(split)
        assert v2 != v1 and prev == v1
        share = _share(kube, server_image, "load-canary")
        # 400 requests at p = 0.25: sd ~ 2.2 points; kube-proxy's random choice per connection.
        assert abs(share.get(v2, 0.0) - CANARY_PERCENT / 100) <= 0.12, f"canary share {share}"
        assert abs(share.get(v1, 0.0) - (1 - CANARY_PERCENT / 100)) <= 0.12, f"stable share {share}"

        # Promote: drop canaryTrafficPercent -> v2 takes 100 %.
        kube.apply(spec.inference_service(NAME, env_marker="v2", min_replicas=STABLE_REPLICAS))
        promoted = _wait_traffic(kube, {"latest": 100})
        assert _revisions(promoted) == (v2, v1)
        wait_for("v1 pods gone", lambda: v1 not in served_by_revision(kube, NAME), timeout=300)
        share = _share(kube, server_image, "load-promoted")
        assert share.get(v2, 0.0) == 1.0, f"after promote {share}"

        # Roll back: a v3 canary pinned to 0 % -> all traffic stays on v2 (the previous revision).
        kube.apply(spec.inference_service(NAME, env_marker="v3", canary_percent=0, min_replicas=STABLE_REPLICAS))
        rolled = _wait_traffic(kube, {"latest": 0, "prev": 100})
        v3, prev = _revisions(rolled)
        assert prev == v2 and v3 not in (v1, v2)
        share = _share(kube, server_image, "load-rollback")
        assert share.get(v2, 0.0) == 1.0, f"after rollback {share}"
    finally:
        kube.delete(spec.RESOURCE, NAME)
