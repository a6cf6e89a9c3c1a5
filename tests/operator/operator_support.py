"""Shared helpers for the operator tests: the CRD, CR validation (schema + CEL), manifests.

CR validation mirrors what the API server does on ``kubectl apply``: the structural schema
with strict field validation (unknown fields rejected; kubectl's default since 1.27) and the
CEL ``x-kubernetes-validations`` rules, evaluated by cel-python.
"""

from __future__ import annotations

import copy
import re
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "serving.ferry.dev_inferenceservices.yaml"
SAMPLES = sorted((ROOT / "config" / "samples").glob("*.yaml"))
DATA = Path(__file__).resolve().parent / "data"
INVALID = sorted((DATA / "invalid").glob("*.yaml"))
KSERVE = sorted((DATA / "kserve").glob("*.yaml"))
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def expectation(path: Path, key: str = "expect") -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


def crd() -> dict[str, Any]:
    return load(CRD_PATH)


def openapi_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (structural, Kubernetes flavour) -> JSON Schema with strict unknown fields."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _cel_program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(schema: Mapping[str, Any], value: Any, path: str = "") -> Iterator[str]:
    import celpy

    for rule in schema.get("x-kubernetes-validations", []):
        program = _cel_program(rule["rule"])
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            yield f"{path or '<root>'}: {rule.get('message', rule['rule'])}"
    if isinstance(value, Mapping):
        for key, child in value.items():
            sub = (schema.get("properties") or {}).get(key) or schema.get("additionalProperties")
            if isinstance(sub, Mapping):
                yield from cel_errors(sub, child, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, child in enumerate(value):
            yield from cel_errors(schema["items"], child, f"{path}[{index}]")


def cr_errors(obj: Mapping[str, Any]) -> list[str]:
    """Every reason the API server would refuse ``obj`` (empty when it would be admitted)."""
    schema = openapi_schema()
    validator = jsonschema.Draft7Validator(to_json_schema(schema))
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]
    if not errors:
        errors += list(cel_errors(schema, obj))
    return errors


def validate_manifest(obj: Mapping[str, Any]) -> None:
    """Validate a rendered child against Kubernetes' own schemas (strict: no unknown fields)."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(copy.deepcopy(dict(obj)), version, strict=True)


def body(spec: Mapping[str, Any], *, name: str = "demo", namespace: str = "default",
         status: Mapping[str, Any] | None = None, uid: str = "uid-1") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "serving.ferry.dev/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
        "spec": dict(spec),
    }
    if status is not None:
        obj["status"] = dict(status)
    return obj


_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_http_route(obj: dict[str, Any]) -> None:
    """The Gateway API v1 HTTPRoute rules kubernetes-validate cannot check (no CRD schemas)."""
    assert obj["apiVersion"] == "gateway.networking.k8s.io/v1" and obj["kind"] == "HTTPRoute"
    spec_ = obj["spec"]
    assert set(spec_) <= {"parentRefs", "hostnames", "rules"}
    assert 1 <= len(spec_["parentRefs"]) <= 32 and all(ref["name"] for ref in spec_["parentRefs"])
    assert all(_HOST.match(h) and len(h) <= 253 for h in spec_["hostnames"])
    for rule in spec_["rules"]:
        assert set(rule) <= {"matches", "backendRefs", "timeouts", "filters", "name"}
        for ref in rule["backendRefs"]:
            assert 0 <= ref["weight"] <= 1_000_000 and 1 <= ref["port"] <= 65535 and ref["kind"] == "Service"
        for value in rule.get("timeouts", {}).values():
            assert _DURATION.match(value)
    assert len(obj["metadata"]["name"]) <= 253
