"""Kubernetes Events for important transitions, derived by diffing old and new status (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry_operator import naming

NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


def _component(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return (status.get("components") or {}).get(naming.COMPONENT) or {}


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _traffic(component: Mapping[str, Any]) -> str:
    return ", ".join(f"{t['revisionName']} {t['percent']}% ({t['tag']})" for t in component.get("traffic") or [])


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    events: list[Event] = []
    ready_old, ready_new = _condition(old, "Ready"), _condition(new, "Ready")
    if ready_new.get("reason") == "InvalidSpec":
        if ready_old.get("message") != ready_new.get("message"):
            events.append(Event(WARNING, "InvalidSpec", str(ready_new.get("message"))))
        return events
    before, after = _component(old), _component(new)
    if after.get("latestCreatedRevision") and before.get("latestCreatedRevision") != after.get("latestCreatedRevision"):
        events.append(Event(NORMAL, "RevisionCreated", f"revision {after['latestCreatedRevision']} created"))
    if before.get("latestRolledoutRevision") and before.get("latestRolledoutRevision") != after.get("latestRolledoutRevision"):
        events.append(Event(NORMAL, "Promoted", f"revision {after.get('latestRolledoutRevision')} rolled out to 100%"))
    if _traffic(before) != _traffic(after) and after.get("traffic"):
        events.append(Event(NORMAL, "TrafficChanged", f"traffic: {_traffic(after)}"))
    if ready_new.get("status") != ready_old.get("status"):
        if ready_new.get("status") == "True":
            events.append(Event(NORMAL, "Ready", str(ready_new.get("message"))))
        elif ready_old.get("status") == "True" or ready_new.get("reason") not in ("RevisionNotReady",):
            events.append(Event(WARNING, str(ready_new.get("reason")), str(ready_new.get("message"))))
    return events
