"""A thin kubectl wrapper for the e2e suite: one place that talks to the kind cluster.

Everything goes through the `kubectl` binary with an explicit --context (set by e2e/run.sh), so the
suite runs against exactly the cluster the script created. Waits use time.monotonic() deadlines
and raise TimeoutError with the last observed state, which the failure dump then complements.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its stderr."""


@dataclass(frozen=True)
class Kubectl:
    context: str
    namespace: str

    def run(self, *args: str, stdin: str | None = None, namespaced: bool = True, timeout: float = 120) -> str:
        cmd = ["kubectl", "--context", self.context, *(["-n", self.namespace] if namespaced else []), *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise KubectlError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def get(self, kind: str, name: str | None = None, selector: str | None = None) -> dict[str, Any]:
        args = ["get", kind, *([name] if name else []), *(["-l", selector] if selector else []), "-o", "json"]
        return json.loads(self.run(*args))

    def exists(self, kind: str, name: str) -> bool:
        return bool(self.run("get", kind, name, "--ignore-not-found", "-o", "name").strip())

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.run("apply", "-f", "-", stdin=text)

    def apply_file(self, path: str) -> None:
        self.run("apply", "-f", path)

    def patch_merge(self, kind: str, name: str, patch: dict[str, Any]) -> None:
        self.run("patch", kind, name, "--type=merge", "-p", json.dumps(patch))

    def delete(self, kind: str, name: str, wait: bool = True) -> None:
        self.run("delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}", timeout=300)

    def raw(self, path: str) -> str:
        """GET through the API server (e.g. a pod's metrics via the pods/proxy subresource)."""
        return self.run("get", "--raw", path, namespaced=False)

    def pod_metrics(self, pod: str, port: int = 8002) -> str:
        return self.raw(f"/api/v1/namespaces/{self.namespace}/pods/{pod}:{port}/proxy/metrics")

    def events(self) -> str:
        return self.run("get", "events", "--sort-by=.lastTimestamp")

    def logs(self, pod: str) -> str:
        return self.run("logs", pod, "--all-containers", "--tail=300")

    @contextmanager
    def port_forward(self, target: str, *remote_ports: int) -> Iterator[dict[int, int]]:
        """`kubectl port-forward` to random local ports; yields {remote: local}."""
        cmd = ["kubectl", "--context", self.context, "-n", self.namespace, "port-forward",
               "--address=127.0.0.1", target, *(f":{p}" for p in remote_ports)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ports: dict[int, int] = {}
            deadline = time.monotonic() + 30
            assert proc.stdout is not None
            while len(ports) < len(remote_ports):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise KubectlError(f"port-forward {target} failed: {proc.stderr.read() if proc.stderr else ''}")
                line = proc.stdout.readline()
                match = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)", line)
                if match:
                    ports[int(match.group(2))] = int(match.group(1))
            yield ports
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 2.0) -> T:
    """Poll `probe` until it returns a truthy value; TimeoutError names `what` and the last error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (KubectlError, KeyError, IndexError, ValueError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def condition(obj: dict[str, Any], kind: str) -> str | None:
    """Status ('True'/'False'/'Unknown') of a status condition, None when absent."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def counter(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus text-format counter over the series matching `labels`."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{key}="{val}"' in series for key, val in labels.items()):
            total += float(value)
    return total
