"""Lint and render a Helm chart with the real Helm library (helm-sdkpy), no cluster needed.

helm-sdkpy exposes Helm's Go actions (lint, install, ...) but no `helm template`. To get the
manifests Helm really renders, `render` runs a client-side `helm install` (wait=False) against
kmock's in-memory Kubernetes emulator, with the `memory` release driver, and returns the release
manifest: the same text `helm template` would print (crds/ excluded, as Helm never templates them).

It runs as a subprocess (jobs as JSON on stdin, outcomes as JSON on stdout) because Go reads
HELM_DRIVER once, when the shared library starts, and a test process may already have loaded it;
batching all jobs of a test module into one subprocess pays Go's start-up once.

Used by tests/deploy/test_chart.py; the role of the emulator is only to answer discovery and
accept the objects Helm creates.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Kinds the chart may render: plural path -> (kind, namespaced). Discovery must know every kind
# Helm creates, or Helm refuses with "no matches for kind".
_RESOURCES: dict[str, tuple[str, bool]] = {
    "v1/namespaces": ("Namespace", False),
    "v1/secrets": ("Secret", True),
    "v1/serviceaccounts": ("ServiceAccount", True),
    "v1/configmaps": ("ConfigMap", True),
    "v1/services": ("Service", True),
    "apps/v1/deployments": ("Deployment", True),
    "rbac.authorization.k8s.io/v1/clusterroles": ("ClusterRole", False),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": ("ClusterRoleBinding", False),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
    "monitoring.coreos.com/v1/podmonitors": ("PodMonitor", True),
    "monitoring.coreos.com/v1/servicemonitors": ("ServiceMonitor", True),
    "monitoring.coreos.com/v1/prometheusrules": ("PrometheusRule", True),
}
_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


class HelmUnavailable(RuntimeError):
    """helm-sdkpy (or kmock) cannot be imported or loaded here."""


def _kubeconfig(server: str) -> str:
    # helm-sdkpy takes a path or YAML text (it looks for "apiVersion:"), so block-style YAML.
    import yaml

    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "render", "user": {"token": "render"}}],
        "contexts": [{"name": "render", "context": {"cluster": "emulator", "user": "render"}}],
        "current-context": "render",
    })


async def _render(chart: str, values: dict[str, Any], namespace: str, release: str) -> dict[str, str]:
    import helm_sdkpy
    import kmock
    from kmock._internal import apps  # the Server bundle is not re-exported by kmock 0.8

    async with kmock.KubernetesEmulator() as emulator, apps.Server(emulator) as server:
        for key, (kind, namespaced) in _RESOURCES.items():
            emulator.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=_VERBS)
        # kmock 0.8 answers /api/v1 with groupVersion "/v1", which Go's discovery rejects.
        core = [
            {"name": key.split("/")[-1], "kind": kind, "namespaced": namespaced,
             "singularName": kind.lower(), "verbs": sorted(_VERBS)}
            for key, (kind, namespaced) in _RESOURCES.items() if key.startswith("v1/")
        ]
        emulator["get /api/v1"] << {
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": core,
        }
        config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=_kubeconfig(str(server.url)))
        result = await helm_sdkpy.Install(config).run(
            release, chart, values=values or None, wait=False, timeout=60,
        )
        return {"manifest": str(result["manifest"]), "notes": str(result.get("info", {}).get("notes", ""))}


def _lint(chart: str) -> dict[str, Any]:
    import helm_sdkpy

    config = helm_sdkpy.Configuration(namespace="default")
    return asyncio.run(helm_sdkpy.Lint(config).run(chart))


@dataclass(frozen=True)
class Job:
    """One Helm action: `lint` a chart, or `render` it with `values`."""

    command: str
    chart: str
    values: dict[str, Any] = field(default_factory=dict)
    namespace: str = "ferry-system"
    release: str = "ferry"


@dataclass(frozen=True)
class Outcome:
    result: Any
    error: str | None = None


def run_many(jobs: list[Job]) -> list[Outcome]:
    """Run the jobs in one fresh interpreter (one Go start-up); HelmUnavailable if Helm can't load."""
    payload = json.dumps([asdict(job) for job in jobs])
    env = {**os.environ, "HELM_DRIVER": "memory"}
    proc = subprocess.run([sys.executable, __file__], input=payload, capture_output=True, text=True,
                          env=env, timeout=300)
    if proc.returncode == 3:
        raise HelmUnavailable(proc.stderr.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"helm_render.py failed ({proc.returncode}):\n{proc.stderr.strip()}")
    return [Outcome(**item) for item in json.loads(proc.stdout)]


def run(command: str, chart: Path, values: dict[str, Any] | None = None) -> Any:
    """One job; a Helm error becomes RuntimeError carrying Helm's message."""
    (outcome,) = run_many([Job(command, str(chart), values or {})])
    if outcome.error is not None:
        raise RuntimeError(f"helm {command} {chart} failed: {outcome.error}")
    return outcome.result


def _execute(job: Job) -> Outcome:
    import helm_sdkpy

    try:
        if job.command == "lint":
            return Outcome(_lint(job.chart))
        if job.command == "render":
            return Outcome(asyncio.run(_render(job.chart, job.values, job.namespace, job.release)))
        return Outcome(None, f"unknown command {job.command!r}: expected lint or render")
    except helm_sdkpy.HelmError as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}")


def main() -> int:
    """Jobs as a JSON list on stdin, outcomes as a JSON list on stdout."""
    try:
        import helm_sdkpy  # noqa: F401
        import kmock  # noqa: F401
    except Exception as exc:  # ImportError, or the Go library failing to load
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    jobs = [Job(**item) for item in json.loads(sys.stdin.read())]
    print(json.dumps([asdict(_execute(job)) for job in jobs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
