"""Status and Events as pure functions of the plan and the observed Deployments."""

from __future__ import annotations

from ferry_operator import events, rollout, status
from ferry_operator.config import OperatorConfig
from ferry_operator.handlers import status_patch
from ferry_operator.observed import DeploymentState, observe

PLAN = rollout.plan(latest="d-predictor-b", canary_percent=None, latest_rolledout=None, previous_rolledout=None,
                    ready=frozenset(), existing=frozenset())


def _compute(observed: dict[str, DeploymentState], previous: dict | None = None, now: str = "t1") -> dict:
    return status.compute(isvc="d", namespace="ns", generation=3, plan=PLAN, observed=observed, previous=previous or {},
                          gateway=False, config=OperatorConfig(), now=now)


def test_observe_deployment() -> None:
    state = observe({"metadata": {"name": "d-predictor-b", "labels": {"serving.ferry.dev/revision": "b"}},
                     "spec": {"replicas": 3}, "status": {"readyReplicas": 2, "availableReplicas": 2}})
    assert (state.revision, state.replicas, state.ready, state.failed) == ("b", 3, True, False)
    stuck = observe({"metadata": {"name": "x"}, "spec": {}, "status": {"conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}]}})
    assert stuck.failed and stuck.failure_reason == "ProgressDeadlineExceeded"


def test_ready_status_shape() -> None:
    ready = DeploymentState("d-predictor-b", "b", 2, 2, 2)
    new = _compute({"d-predictor-b": ready})
    assert new["observedGeneration"] == 3
    assert new["address"] == {"url": "http://d-predictor.ns.svc.cluster.local:8000"}
    assert [(c["type"], c["status"]) for c in new["conditions"]] == [
        ("PredictorReady", "True"), ("IngressReady", "True"), ("Ready", "True")]
    assert new["modelStatus"] == {"transitionStatus": "UpToDate",
                                  "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"}}


def test_failed_load_is_reported() -> None:
    failed = DeploymentState("d-predictor-b", "b", 1, 0, 0, "ProgressDeadlineExceeded", "ReplicaSet has timed out")
    new = _compute({"d-predictor-b": failed})
    ready = next(c for c in new["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert new["modelStatus"]["transitionStatus"] == "BlockedByFailedLoad"
    assert new["modelStatus"]["lastFailureInfo"] == {"reason": "ProgressDeadlineExceeded", "message": "ReplicaSet has timed out"}


def test_transition_time_moves_only_with_status() -> None:
    first = _compute({}, now="t1")
    again = _compute({}, previous=first, now="t2")
    assert {c["lastTransitionTime"] for c in again["conditions"] if c["type"] == "Ready"} == {"t1"}
    ready = _compute({"d-predictor-b": DeploymentState("d-predictor-b", "b", 1, 1, 1)}, previous=again, now="t3")
    assert next(c for c in ready["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == "t3"


def test_events_from_transitions() -> None:
    first = _compute({})
    assert [e.reason for e in events.diff({}, first)] == ["RevisionCreated", "TrafficChanged"]
    ready = _compute({"d-predictor-b": DeploymentState("d-predictor-b", "b", 1, 1, 1)}, previous=first)
    assert [(e.type, e.reason) for e in events.diff(first, ready)] == [("Normal", "Ready")]
    assert events.diff(ready, ready) == []
    invalid = status.invalid(ready, 4, "InvalidSpec", "spec.predictor: bad", "t9")
    assert [(e.type, e.reason, e.message) for e in events.diff(ready, invalid)] == [("Warning", "InvalidSpec", "spec.predictor: bad")]
    assert invalid["components"] == ready["components"]  # what runs is still reported


def test_status_patch_nulls_removed_keys() -> None:
    old = {"url": "a", "components": {"predictor": {"latestReadyRevision": "x", "traffic": [1]}}, "gone": 1}
    new = {"url": "a", "components": {"predictor": {"traffic": [2]}}}
    assert status_patch(old, new) == {"gone": None, "components": {"predictor": {"latestReadyRevision": None, "traffic": [2]}}}
    assert status_patch(new, new) == {}
