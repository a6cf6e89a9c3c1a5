"""The CRD: valid as a CRD, structural, and its schema admits config/ samples and refuses bad ones."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from operator_support import (
    CRD_PATH, INVALID, K8S_VERSIONS, KSERVE, SAMPLES, crd, cr_errors, expectation, load, load_all, openapi_schema,
    validate_manifest,
)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_validates_as_a_crd(version: str) -> None:
    kubernetes_validate.validate(crd(), version, strict=True)


def test_crd_identity() -> None:
    spec = crd()["spec"]
    assert crd()["metadata"]["name"] == "inferenceservices.serving.ferry.dev"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "serving.ferry.dev", "InferenceService", "inferenceservices")
    assert spec["names"]["shortNames"] == ["fisvc"]
    version = spec["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["URL", "Ready", "Prev", "Latest", "PrevRolledoutRevision", "LatestReadyRevision", "Age"]


def _structural_problems(node: Mapping[str, Any], path: str) -> list[str]:
    """Kubernetes' structural schema rules that matter here: every node typed (or int-or-string /
    preserve-unknown), no ``additionalProperties`` beside ``properties``."""
    problems = []
    special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not special:
        problems.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: both properties and additionalProperties")
    for key, child in (node.get("properties") or {}).items():
        problems += _structural_problems(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            problems += _structural_problems(node[key], f"{path}.{key}")
    return problems


def test_schema_is_structural() -> None:
    assert _structural_problems(openapi_schema(), "openAPIV3Schema") == []


def test_every_status_field_written_is_in_the_schema() -> None:
    # Fields missing from the schema are silently pruned by the API server.
    status = openapi_schema()["properties"]["status"]["properties"]
    assert {"url", "address", "observedGeneration", "conditions", "components", "modelStatus"} <= set(status)
    component = status["components"]["additionalProperties"]["properties"]
    assert set(component) == {"url", "latestCreatedRevision", "latestReadyRevision", "latestRolledoutRevision",
                              "previousRolledoutRevision", "traffic"}


@pytest.mark.parametrize("path", SAMPLES + KSERVE, ids=lambda p: p.name)
def test_samples_are_admitted(path: Path) -> None:
    assert cr_errors(load(path)) == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_samples_are_refused_with_their_reason(path: Path) -> None:
    expected = expectation(path)
    assert expected, f"{path.name} states no '# expect:' line"
    errors = cr_errors(load(path))
    assert errors, f"{path.name} was admitted"
    assert any(expected in error for error in errors), errors


MANIFESTS = sorted((CRD_PATH.parents[1] / "config" / "rbac").glob("*.yaml")) + sorted(
    (CRD_PATH.parents[1] / "config" / "manager").glob("*.yaml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_operator_manifests_are_valid(path: Path) -> None:
    for obj in load_all(path):
        validate_manifest(obj)


def test_rbac_covers_every_child_kind() -> None:
    from ferry_operator.api import RESOURCES

    rules = next(o for p in MANIFESTS for o in load_all(p) if o["kind"] == "ClusterRole")["rules"]
    granted = {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    for resource in RESOURCES.values():
        assert {"get", "create", "patch", "delete", "list", "watch"} <= granted[(resource.group, resource.plural)]
    assert "patch" in granted[("serving.ferry.dev", "inferenceservices/status")]
    assert "create" in granted[("", "events")]


@pytest.mark.parametrize("name", ["a.b", "1abc"])
def test_names_that_cannot_name_a_service_are_refused(name: str) -> None:
    """Found by fuzzing: CR names may have dots or a leading digit; ``<name>-predictor`` Services may not."""
    from ferry_operator import desired
    from ferry_operator.config import OperatorConfig

    obj = {"apiVersion": "serving.ferry.dev/v1beta1", "kind": "InferenceService",
           "metadata": {"name": name, "namespace": "default", "uid": "u"}, "spec": {"predictor": {"model": {}}}}
    assert any("DNS-1035" in error for error in cr_errors(obj))
    result = desired.compute(obj, {}, config=OperatorConfig(), gateway=False, now="t")  # kmock: no CEL
    assert result.applies == () and "metadata.name" in result.status["conditions"][0]["message"]
