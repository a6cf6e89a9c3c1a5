"""Deleting an InferenceService removes every child the operator made (owner references + GC)."""

from __future__ import annotations

import pytest

from e2e import spec
from e2e.kube import Kubectl, wait_for
from e2e.workloads import wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_cleanup, pytest.mark.timeout(900)]

NAME = "e2e-cleanup"
CHILD_KINDS = "deployments,services,hpa,configmaps,pods"


def _children(kube: Kubectl) -> list[str]:
    return kube.run("get", CHILD_KINDS, "-l", spec.pod_selector(NAME), "-o", "name").split()


def test_delete_removes_children(kube: Kubectl) -> None:
    kube.apply(spec.inference_service(NAME))
    wait_ready(kube, NAME)
    children = _children(kube)
    assert any(c.startswith("deployment") for c in children) and any(c.startswith("service") for c in children)
    for child in children:
        if not child.startswith("pod/"):
            owners = kube.get(*child.split("/"))["metadata"].get("ownerReferences", [])
            assert any(o["kind"] in (spec.KIND, "Deployment", "ReplicaSet") for o in owners), child

    kube.delete(spec.RESOURCE, NAME)
    assert not kube.exists(spec.RESOURCE, NAME)
    wait_for("children garbage-collected", lambda: not _children(kube), timeout=300)
