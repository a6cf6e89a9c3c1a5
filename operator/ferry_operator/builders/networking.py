"""Services and Gateway API HTTPRoutes.

``<isvc>-predictor`` carries the traffic: its selector names one revision while one revision
has all the traffic, and every revision of the InferenceService while traffic is split (then
kube-proxy spreads requests over ready pods, i.e. by replica proportion). The ``latest`` and
``prev`` Services always select exactly one revision. With Gateway API, HTTPRoute weights
split the external traffic exactly between the tag Services.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferry_operator import naming

ROUTE_API = "gateway.networking.k8s.io/v1"


def _ports() -> list[dict[str, Any]]:
    return [
        {"name": "http", "port": naming.HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": naming.GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
         "appProtocol": "kubernetes.io/h2c"},
        {"name": "metrics", "port": naming.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
    ]


def service(*, isvc: str, namespace: str, name: str, revision: str | None) -> dict[str, Any]:
    """A ClusterIP Service selecting ``revision``'s pods, or all of ``isvc``'s when None."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(isvc)},
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector(isvc, revision),
            "ports": _ports(),
        },
    }


def duration(seconds: int) -> str:
    """Gateway API duration: at most 5 digits per unit, so 100000 s is "27h46m40s", not "100000s"."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


def http_route(
    *,
    isvc: str,
    namespace: str,
    name: str,
    hostname: str,
    backends: Sequence[tuple[str, int]],
    gateway_name: str,
    gateway_namespace: str,
    timeout_s: int | None,
) -> dict[str, Any]:
    """HTTPRoute sending ``hostname`` to ``backends`` ((Service name, weight) pairs)."""
    rule: dict[str, Any] = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [
            {"group": "", "kind": "Service", "name": svc, "port": naming.HTTP_PORT, "weight": weight}
            for svc, weight in backends
        ],
    }
    if timeout_s:
        rule["timeouts"] = {"request": duration(timeout_s)}
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(isvc)},
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "name": gateway_name, "namespace": gateway_namespace}],
            "hostnames": [hostname],
            "rules": [rule],
        },
    }
