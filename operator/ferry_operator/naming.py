"""Names and labels of everything the operator creates, in one place.

Per InferenceService ``<isvc>``: Deployments ``<isvc>-predictor-<revision>`` (one per revision),
Services ``<isvc>-predictor`` (traffic), ``<isvc>-predictor-latest`` / ``-prev`` (tags),
HPA and PDB ``<isvc>-predictor``, HTTPRoutes ``<isvc>``, ``<isvc>-latest``, ``<isvc>-prev``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

GROUP = "serving.ferry.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
COMPONENT = "predictor"
MAX_NAME_LENGTH = 45  # "<isvc>-predictor-latest" must stay a 63-char DNS label
MAX_LABEL_LENGTH = 63  # RFC 1123 DNS label

LABEL_ISVC = f"{GROUP}/inferenceservice"
LABEL_COMPONENT = f"{GROUP}/component"
LABEL_REVISION = f"{GROUP}/revision"
ANNOTATION_REVISION_SPEC = f"{GROUP}/revision-spec"

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_DIR = "/mnt/models"
PVC_ROOT = "/mnt/pvc"


def predictor(isvc: str) -> str:
    return f"{isvc}-{COMPONENT}"


def revision_deployment(isvc: str, revision: str) -> str:
    return f"{isvc}-{COMPONENT}-{revision}"


def tag_service(isvc: str, tag: str) -> str:
    return f"{isvc}-{COMPONENT}-{tag}"


def route(isvc: str, tag: str | None = None) -> str:
    return f"{isvc}-{tag}" if tag else isvc


def host_label(isvc: str, namespace: str, tag: str | None = None) -> str:
    """The first DNS label of a route host: ``[<tag>-]<isvc>-<namespace>`` (at most 63 characters to resolve)."""
    return f"{tag}-{isvc}-{namespace}" if tag else f"{isvc}-{namespace}"


def host(isvc: str, namespace: str, domain: str, tag: str | None = None) -> str:
    return f"{host_label(isvc, namespace, tag)}.{domain}"


def selector(isvc: str, revision: str | None = None) -> dict[str, str]:
    labels = {LABEL_ISVC: isvc, LABEL_COMPONENT: COMPONENT}
    if revision:
        labels[LABEL_REVISION] = revision
    return labels


def labels(isvc: str, revision: str | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "ferry-server",
        "app.kubernetes.io/instance": isvc,
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": "ferry-operator",
        **selector(isvc, revision),
    }


def revision_hash(pod_fields: Mapping[str, Any]) -> str:
    """Ten hex digits of the SHA-256 of the canonical JSON of what shapes the pod."""
    canonical = json.dumps(pod_fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]
