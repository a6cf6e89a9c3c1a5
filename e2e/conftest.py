"""Shared setup for the kind e2e suite: skip reasons, the cluster handle, failure dumps.

The suite runs only through e2e/run.sh, which creates the cluster, installs everything and sets
FERRY_E2E_CONTEXT. Without docker (and its engine), kind, kubectl or helm, or without that
variable, every test is skipped with the reason. On a failing test the InferenceServices, events
and pod logs of the test namespace are attached to the report and written to FERRY_E2E_ARTIFACTS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kube import Kubectl

TOOLS = ("docker", "kind", "kubectl", "helm")
FEATURE_MARKERS = {
    "e2e": "kind-based end-to-end tests (need docker and kind; run e2e/run.sh)",
    "e2e_install": "e2e: the charts installed the CRD, operator and monitoring glue",
    "e2e_infer": "e2e: config/ samples become Ready and answer HTTP and gRPC inference",
    "e2e_canary": "e2e: canary traffic split, promote and rollback",
    "e2e_autoscale": "e2e: the HPA reads avg_time_queue_us through prometheus-adapter",
    "e2e_cleanup": "e2e: deleting an InferenceService removes its children",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in FEATURE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def skip_reason() -> str | None:
    """Why the suite cannot run here, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"e2e needs {', '.join(TOOLS)}; missing on PATH: {', '.join(missing)}"
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return "e2e needs a running docker engine (docker info failed)"
    if not os.environ.get("FERRY_E2E_CONTEXT"):
        return "FERRY_E2E_CONTEXT is unset: run the suite through e2e/run.sh (it creates the kind cluster)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e_items = [item for item in items if item.get_closest_marker("e2e")]
    if not e2e_items:
        return
    reason = skip_reason()
    if reason:
        for item in e2e_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def kube() -> Kubectl:
    return Kubectl(context=os.environ["FERRY_E2E_CONTEXT"], namespace=os.environ.get("FERRY_E2E_NAMESPACE", "ferry-e2e"))


@pytest.fixture(scope="session")
def system() -> Kubectl:
    return Kubectl(context=os.environ["FERRY_E2E_CONTEXT"], namespace="ferry-system")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "FERRY_E2E_CONTEXT" not in os.environ:
        return
    kube = Kubectl(context=os.environ["FERRY_E2E_CONTEXT"], namespace=os.environ.get("FERRY_E2E_NAMESPACE", "ferry-e2e"))
    sections: list[tuple[str, str]] = []
    for title, args in [("inferenceservices", ("get", "inferenceservices", "-o", "yaml")),
                        ("resources", ("get", "all,hpa", "-o", "wide")),
                        ("events", ("get", "events", "--sort-by=.lastTimestamp"))]:
        try:
            sections.append((title, kube.run(*args)))
        except Exception as exc:  # a dump must never hide the real failure
            sections.append((title, f"<{exc}>"))
    try:
        for pod in kube.run("get", "pods", "-o", "name").split():
            sections.append((f"logs {pod}", kube.logs(pod)))
    except Exception as exc:
        sections.append(("logs", f"<{exc}>"))
    artifacts = Path(os.environ.get("FERRY_E2E_ARTIFACTS", "e2e/artifacts")) / item.name
    artifacts.mkdir(parents=True, exist_ok=True)
    for title, text in sections:
        report.sections.append((f"cluster: {title}", text[-20000:]))
        (artifacts / (title.replace("/", "_").replace(" ", "_") + ".txt")).write_text(text)


@pytest.fixture(scope="session")
def server_image() -> str:
    """The ferry-server image loaded into kind (also runs the in-cluster load Jobs)."""
    return os.environ.get("FERRY_E2E_SERVER_IMAGE", "ferry-server:e2e")
