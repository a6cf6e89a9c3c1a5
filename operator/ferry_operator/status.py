"""InferenceService status, computed from the plan and the observed Deployments (pure).

Shape follows KServe: ``url``, ``address.url``, conditions ``PredictorReady``,
``IngressReady`` and ``Ready`` (= both), ``components.predictor`` with the revision fields
and ``traffic[]``, ``modelStatus`` and ``observedGeneration``. ``lastTransitionTime`` only
moves when a condition's status changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ferry_operator import naming, rollout
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


def condition(
    kind: str, status: str, reason: str, message: str, previous: Sequence[Mapping[str, Any]], now: str
) -> dict[str, Any]:
    old = next((c for c in previous if c.get("type") == kind), None)
    since = now if old is None or old.get("status") != status else old.get("lastTransitionTime", now)
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def _ready_count(state: DeploymentState | None) -> str:
    return f"{state.available_replicas if state else 0}/{state.replicas if state else 0}"


def predictor_condition(
    plan: rollout.RolloutPlan, observed: Mapping[str, DeploymentState]
) -> tuple[str, str, str]:
    latest = observed.get(plan.latest)
    if latest is not None and latest.failed:
        return FALSE, latest.failure_reason or "Failed", f"revision {plan.latest}: {latest.failure_message}"
    not_ready = [t.revision for t in plan.traffic if t.percent > 0 and not _is_ready(observed, t.revision)]
    if not _is_ready(observed, plan.latest):
        where = f"; traffic stays on {plan.stable}" if plan.stable and plan.stable not in not_ready else ""
        return FALSE, "RevisionNotReady", (
            f"revision {plan.latest} has {_ready_count(latest)} available replicas{where}"
        )
    if not_ready:
        return FALSE, "RevisionNotReady", f"revision {not_ready[0]} has no available replicas"
    return TRUE, "RevisionReady", f"revision {plan.latest} is ready"


def _is_ready(observed: Mapping[str, DeploymentState], revision: str) -> bool:
    state = observed.get(revision)
    return state is not None and state.ready


def ingress_message(plan: rollout.RolloutPlan, observed: Mapping[str, DeploymentState], gateway: bool) -> str:
    if gateway:
        return "HTTPRoute weights: " + ", ".join(f"{t.revision} {t.percent}%" for t in plan.traffic)
    if plan.single:
        return f"Service {'selects'} revision {plan.single} only"
    pods = {t.revision: (observed[t.revision].available_replicas if t.revision in observed else 0) for t in plan.traffic}
    total = sum(pods.values()) or 1
    share = ", ".join(f"{rev} {count}/{total} pods ({round(100 * count / total)}%)" for rev, count in pods.items())
    return f"traffic split by replica proportion (no Gateway API): {share}"


def model_status(plan: rollout.RolloutPlan, observed: Mapping[str, DeploymentState]) -> dict[str, Any]:
    latest = observed.get(plan.latest)
    serving_ready = any(_is_ready(observed, t.revision) for t in plan.traffic if t.percent > 0)
    if latest is not None and latest.failed:
        target, transition = "FailedToLoad", "BlockedByFailedLoad"
    elif latest is not None and latest.ready:
        target, transition = "Loaded", "UpToDate"
    else:
        target, transition = "Loading", "InProgress"
    active = "Loaded" if serving_ready else ("FailedToLoad" if target == "FailedToLoad" else "Pending")
    status: dict[str, Any] = {
        "transitionStatus": transition,
        "states": {"activeModelState": active, "targetModelState": target},
    }
    if target == "FailedToLoad" and latest is not None:
        status["lastFailureInfo"] = {"reason": latest.failure_reason, "message": latest.failure_message or ""}
    return status


def compute(
    *,
    isvc: str,
    namespace: str,
    generation: int | None,
    plan: rollout.RolloutPlan,
    observed: Mapping[str, DeploymentState],
    previous: Mapping[str, Any],
    gateway: bool,
    config: OperatorConfig,
    now: str,
) -> dict[str, Any]:
    old_conditions = previous.get("conditions") or []
    address = f"http://{naming.predictor(isvc)}.{namespace}.svc.{config.cluster_domain}:{naming.HTTP_PORT}"
    url = f"http://{naming.host(isvc, namespace, config.ingress_domain)}" if gateway else address
    p_status, p_reason, p_message = predictor_condition(plan, observed)
    i_reason = "HTTPRouteConfigured" if gateway else "ServiceConfigured"
    ready = TRUE if p_status == TRUE else FALSE
    old_component = (previous.get("components") or {}).get(naming.COMPONENT) or {}
    latest_ready = plan.latest if _is_ready(observed, plan.latest) else old_component.get("latestReadyRevision")
    if latest_ready not in observed and latest_ready != plan.latest:
        latest_ready = None
    component: dict[str, Any] = {
        "url": url,
        "latestCreatedRevision": plan.latest,
        "latestReadyRevision": latest_ready,
        "latestRolledoutRevision": plan.latest_rolledout,
        "previousRolledoutRevision": plan.previous_rolledout,
        "traffic": [
            {"revisionName": t.revision, "tag": t.tag, "percent": t.percent, "latestRevision": t.latest}
            for t in plan.traffic
        ],
    }
    return {
        "url": url,
        "address": {"url": address},
        "observedGeneration": generation,
        "conditions": [
            condition("PredictorReady", p_status, p_reason, p_message, old_conditions, now),
            condition("IngressReady", TRUE, i_reason, ingress_message(plan, observed, gateway), old_conditions, now),
            condition("Ready", ready, p_reason if ready == FALSE else "Ready",
                      p_message if ready == FALSE else f"{isvc} is serving", old_conditions, now),
        ],
        "components": {naming.COMPONENT: {k: v for k, v in component.items() if v is not None}},
        "modelStatus": model_status(plan, observed),
    }


def invalid(previous: Mapping[str, Any], generation: int | None, reason: str, message: str, now: str) -> dict[str, Any]:
    """Status for a spec that cannot be served: what is running keeps running and is reported."""
    old_conditions = previous.get("conditions") or []
    keep = {k: v for k, v in previous.items() if k in ("url", "address", "components")}
    return {
        **keep,
        "observedGeneration": generation,
        "conditions": [
            condition("PredictorReady", FALSE, reason, message, old_conditions, now),
            condition("IngressReady", UNKNOWN, reason, "not reconciled: invalid spec", old_conditions, now),
            condition("Ready", FALSE, reason, message, old_conditions, now),
        ],
        "modelStatus": {
            "transitionStatus": "InvalidSpec",
            "states": {"activeModelState": (previous.get("modelStatus") or {}).get("states", {}).get("activeModelState", "Pending"),
                       "targetModelState": "FailedToLoad"},
            "lastFailureInfo": {"reason": reason, "message": message},
        },
    }
