"""One reconciliation of one InferenceService: compute (pure) -> apply/delete (API) -> status.

Children are re-applied only when what is desired changed since the last successful apply in
this process, or every ``full_resync_seconds`` (drift repair), so the frequent readiness timer
costs no API calls while nothing moves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry_operator import api, desired, events, naming, status
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState

log = logging.getLogger(__name__)


@dataclass
class Discovery:
    """Whether Gateway API is served, re-checked every ``ttl`` seconds."""

    ttl: float = 300.0
    _routes: bool | None = None
    _checked: float = 0.0

    async def routes_served(self, kube: api.KubeApi) -> bool:
        if self._routes is None or time.monotonic() - self._checked > self.ttl:
            self._routes = await kube.served(api.RESOURCES["HTTPRoute"])
            self._checked = time.monotonic()
        return self._routes


@dataclass
class Applied:
    """Per-object memory of the last successful apply (kept in kopf's per-object memo)."""

    fingerprint: str = ""
    at: float = field(default=0.0)


def gateway_mode(config: OperatorConfig, routes_served: bool) -> bool:
    return routes_served if config.traffic_mode == "auto" else config.traffic_mode == "gateway"


def fingerprint(result: desired.Desired) -> str:
    data = [(a.obj, a.keep_replicas) for a in result.applies], list(result.deletes)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


async def run(
    body: Mapping[str, Any],
    *,
    kube: api.KubeApi,
    config: OperatorConfig,
    discovery: Discovery,
    observed: Mapping[str, DeploymentState],
    applied: Applied,
    now: str,
) -> desired.Desired:
    """Reconcile ``body``; raises api.ApiError when the API server keeps failing.

    An object the API server refuses (invalid, or a name another owner holds) is reported in
    the status instead: retrying the same object cannot succeed until the spec changes.
    """
    routes = await discovery.routes_served(kube)
    result = desired.compute(body, observed, config=config, gateway=gateway_mode(config, routes), now=now)
    if not result.applies:
        return result  # invalid spec: nothing is created, nothing running is touched
    mark = fingerprint(result)
    if mark == applied.fingerprint and time.monotonic() - applied.at < config.full_resync_seconds:
        return result
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace")
    for item in result.applies:
        try:
            outcome = await kube.apply(item.obj, keep=("replicas",) if item.keep_replicas else ())
        except api.Refused as exc:
            log.warning("%s", exc)
            previous = body.get("status") or {}
            refused = status.invalid(previous, meta.get("generation"), exc.reason, str(exc), now)
            return dataclasses.replace(result, status=refused, events=tuple(events.diff(previous, refused)))
        if outcome != "unchanged":
            log.info("%s %s/%s", outcome, item.obj["kind"], item.obj["metadata"]["name"])
    for kind, name in result.deletes:
        if kind == "HTTPRoute" and not routes:
            continue
        if await kube.delete(kind, namespace, name, owner_uid=meta.get("uid")):
            log.info("deleted %s/%s", kind, name)
    applied.fingerprint, applied.at = mark, time.monotonic()
    return result


async def delete_children(
    body: Mapping[str, Any], *, kube: api.KubeApi, discovery: Discovery, deployments: list[str]
) -> int:
    """Delete everything the operator made for ``body`` (owner references also let GC do it)."""
    meta = body.get("metadata") or {}
    isvc, namespace = str(meta.get("name")), meta.get("namespace")
    routes = await discovery.routes_served(kube)
    targets = [("Deployment", name) for name in deployments]
    targets += [("Service", naming.predictor(isvc)), ("Service", naming.tag_service(isvc, "latest"))]
    targets += [("HorizontalPodAutoscaler", naming.predictor(isvc))]
    targets += [(kind, name) for kind, names in desired.OPTIONAL_NAMES.items() for name in names(isvc)]
    count = 0
    for kind, name in targets:
        if kind == "HTTPRoute" and not routes:
            continue
        count += await kube.delete(kind, namespace, name, owner_uid=meta.get("uid"))
    return count
