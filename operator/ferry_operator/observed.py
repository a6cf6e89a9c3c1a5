"""What the operator reads back from the cluster: Deployment readiness, as frozen values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry_operator import naming


@dataclass(frozen=True)
class DeploymentState:
    """One revision's Deployment as observed (spec replicas and status counts)."""

    name: str
    revision: str
    replicas: int
    ready_replicas: int = 0
    available_replicas: int = 0
    failure_reason: str | None = None
    failure_message: str | None = None

    @property
    def ready(self) -> bool:
        return self.available_replicas > 0 or self.ready_replicas > 0

    @property
    def failed(self) -> bool:
        return self.failure_reason is not None and not self.ready


def observe(deployment: Mapping[str, Any]) -> DeploymentState:
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    reason = message = None
    for condition in status.get("conditions") or []:
        # Progressing=False (ProgressDeadlineExceeded) or ReplicaFailure=True: pods cannot come up.
        if (condition.get("type") == "Progressing" and condition.get("status") == "False") or (
            condition.get("type") == "ReplicaFailure" and condition.get("status") == "True"
        ):
            reason = condition.get("reason") or condition.get("type")
            message = condition.get("message") or ""
    return DeploymentState(
        name=str(meta.get("name", "")),
        revision=str((meta.get("labels") or {}).get(naming.LABEL_REVISION, "")),
        replicas=int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1),
        ready_replicas=int(status.get("readyReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
        failure_reason=reason,
        failure_message=message,
    )
