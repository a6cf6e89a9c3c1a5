"""In-cluster traffic for the e2e suite: a Job that sends inference requests to a Service.

`kubectl port-forward` to a Service pins one pod, so anything about traffic *distribution*
(canary split, autoscaling load) must come from inside the cluster. The Job runs the ferry-server
image (tritonclient is one of its dependencies) and prints one JSON line with its counts.
"""

from __future__ import annotations

import json
from typing import Any

from e2e import spec
from e2e.kube import Kubectl, condition, counter, wait_for

_LOAD_SCRIPT = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import tritonclient.http as http
url, model, total, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
reconnect = sys.argv[5] == "1"  # a new TCP connection per request: kube-proxy balances connections
def one(_):
    client = http.InferenceServerClient(url, network_timeout=60)
    meta = client.get_model_metadata(model)
    inputs = []
    for spec in meta["inputs"]:
        shape = [1 if d == -1 else d for d in spec["shape"]]
        dtype = http.triton_to_np_dtype(spec["datatype"])
        tensor = http.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(np.ones(shape, dtype=dtype))
        inputs.append(tensor)
    ok = 0
    for _ in range(total // workers):
        if reconnect:
            client.close()
            client = http.InferenceServerClient(url, network_timeout=60)
        try:
            client.infer(model, inputs)
            ok += 1
        except Exception as exc:
            print(exc, file=sys.stderr)
    client.close()
    return ok
with ThreadPoolExecutor(workers) as pool:
    ok = sum(pool.map(one, range(workers)))
print(json.dumps({"ok": ok, "total": total // workers * workers}))
"""


def load_job(name: str, target: str, *, image: str, requests: int, workers: int,
             reconnect: bool = True) -> dict[str, Any]:
    """A Job sending `requests` HTTP inferences of the default model to `target` (host:port)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 600,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "load",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", _LOAD_SCRIPT, target, spec.DEFAULT_MODEL, str(requests), str(workers), "1" if reconnect else "0"],
                }],
            }},
        },
    }


def run_load(kube: Kubectl, name: str, service: str, *, image: str, requests: int, workers: int = 4,
             reconnect: bool = True, timeout: float = 300) -> dict[str, int]:
    """Run a load Job to completion and return its counts (fails if it fails)."""
    kube.delete("job", name)
    kube.apply(load_job(name, f"{service}:{spec.HTTP_PORT}", image=image, requests=requests, workers=workers,
                        reconnect=reconnect))
    kube.run("wait", "--for=condition=complete", f"job/{name}", f"--timeout={int(timeout)}s", timeout=timeout + 30)
    counts = json.loads(kube.run("logs", f"job/{name}").strip().splitlines()[-1])
    assert counts["ok"] == counts["total"], f"load job {name}: {counts}"
    return counts


def served_by_revision(kube: Kubectl, isvc: str) -> dict[str, float]:
    """Successful inferences per revision, summed over that revision's pods (via pods/proxy)."""
    pods = kube.get("pods", selector=spec.pod_selector(isvc))["items"]
    totals: dict[str, float] = {}
    for pod in pods:
        if pod["status"].get("phase") != "Running":
            continue
        revision = pod["metadata"]["labels"].get(spec.REVISION_LABEL, "?")
        text = kube.pod_metrics(pod["metadata"]["name"], spec.METRICS_PORT)
        totals[revision] = totals.get(revision, 0.0) + counter(text, "nv_inference_request_success")
    return totals


def wait_ready(kube: Kubectl, name: str, timeout: float = 300) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = kube.get(spec.RESOURCE, name)
        return obj if condition(obj, "Ready") == "True" else None

    return wait_for(f"InferenceService {name} Ready", ready, timeout)


MODEL_STORE = "model-store"
MODEL_STORE_PORT = 8080
MODEL_TARBALL = "default-repository.tar.gz"

_MODEL_STORE_SCRIPT = f"""
import http.server, pathlib, tarfile
from importlib import resources
root = pathlib.Path(str(resources.files("serving_pod") / "default_models"))
www = pathlib.Path("/tmp/www")
www.mkdir(parents=True, exist_ok=True)
with tarfile.open(www / "{MODEL_TARBALL}", "w:gz") as tar:
    for model in sorted(p for p in root.iterdir() if p.is_dir()):
        tar.add(model, arcname=model.name)
handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(www))
http.server.ThreadingHTTPServer(("0.0.0.0", {MODEL_STORE_PORT}), handler).serve_forever()
"""


def model_store(image: str) -> list[dict[str, Any]]:
    """An in-cluster HTTP server offering ferry-server's embedded models as a tarball.

    The config/ samples point at remote storage (s3://, gs://, https://) a kind cluster cannot
    reach; the suite rewrites their storageUri to this store, which exercises the storage
    initializer's http(s) download and archive extraction for real.
    """
    labels = {"app.kubernetes.io/name": MODEL_STORE}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": MODEL_STORE, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{
                        "name": "store",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python", "-c", _MODEL_STORE_SCRIPT],
                        "ports": [{"containerPort": MODEL_STORE_PORT}],
                        "readinessProbe": {"httpGet": {"path": f"/{MODEL_TARBALL}", "port": MODEL_STORE_PORT}},
                    }]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": MODEL_STORE, "labels": labels},
            "spec": {"selector": labels, "ports": [{"port": MODEL_STORE_PORT, "targetPort": MODEL_STORE_PORT}]},
        },
    ]


def model_store_url(namespace: str) -> str:
    return f"http://{MODEL_STORE}.{namespace}.svc:{MODEL_STORE_PORT}/{MODEL_TARBALL}"
