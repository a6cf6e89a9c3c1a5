"""config/ samples become Ready; an InferenceService answers over HTTP and gRPC (tritonclient)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from e2e import spec
from e2e.kube import Kubectl
from e2e.workloads import MODEL_STORE, model_store, model_store_url, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_infer, pytest.mark.timeout(900)]

SAMPLES = Path(__file__).resolve().parents[1] / "config" / "samples"


def _samples() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in sorted(SAMPLES.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == spec.KIND]


def _on_kind(doc: dict[str, Any], store_url: str) -> dict[str, Any] | None:
    """The sample with its remote storageUri pointed at the in-cluster store; None if it needs GPUs or names models."""
    doc = copy.deepcopy(doc)
    predictor = doc["spec"]["predictor"]
    if "gpu" in predictor or "nvidia.com/" in yaml.safe_dump(doc) or predictor.get("serving", {}).get("loadModels"):
        return None
    model = predictor.get("model") or predictor.get("triton") or {}
    if str(model.get("storageUri", "")).startswith("pvc://"):
        return None
    if "storageUri" in model:
        model["storageUri"] = store_url
    model.setdefault("resources", {})["requests"] = {"cpu": "100m", "memory": "256Mi"}
    predictor["minReplicas"] = min(int(predictor.get("minReplicas", 1)), 1)
    return doc


def test_every_config_sample_is_accepted_by_the_api_server(kube: Kubectl) -> None:
    samples = _samples()
    assert len(samples) >= 3, f"expected the operator's samples in {SAMPLES}"
    for name, doc in samples:
        out = kube.run("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
        assert "(server dry run)" in out, f"{name}: {out}"


@pytest.fixture(scope="module")
def store_url(kube: Kubectl, server_image: str) -> str:
    for manifest in model_store(server_image):
        kube.apply(manifest)
    kube.run("rollout", "status", f"deployment/{MODEL_STORE}", "--timeout=180s", timeout=200)
    return model_store_url(kube.namespace)


def test_config_samples_become_ready(kube: Kubectl, store_url: str) -> None:
    runnable = [(name, doc) for name, sample in _samples() if (doc := _on_kind(sample, store_url)) is not None]
    assert runnable, "no CPU sample in config/samples"
    for _, doc in runnable:
        kube.apply(doc)
    try:
        for name, doc in runnable:
            obj = wait_ready(kube, doc["metadata"]["name"], timeout=600)
            assert obj["status"]["url"], f"{name}: Ready without a url"
            assert obj["status"]["modelStatus"]["states"]["activeModelState"] == "Loaded", name
    finally:
        for _, doc in runnable:
            kube.delete(spec.RESOURCE, doc["metadata"]["name"], wait=False)


def _inputs(module, metadata: dict) -> list:
    inputs = []
    for item in metadata["inputs"]:
        shape = [1 if d == -1 else int(d) for d in item["shape"]]
        tensor = module.InferInput(item["name"], shape, item["datatype"])
        tensor.set_data_from_numpy(np.ones(shape, dtype=module.triton_to_np_dtype(item["datatype"])))
        inputs.append(tensor)
    return inputs


def test_infer_over_http_and_grpc(kube: Kubectl) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    name = "e2e-infer"
    kube.apply(spec.inference_service(name))
    try:
        wait_ready(kube, name)
        with kube.port_forward(f"svc/{spec.predictor_service(name)}", spec.HTTP_PORT, spec.GRPC_PORT) as ports:
            http = httpclient.InferenceServerClient(f"127.0.0.1:{ports[spec.HTTP_PORT]}")
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[spec.GRPC_PORT]}")
            assert http.is_server_ready() and grpc.is_server_ready()
            assert http.is_model_ready(spec.DEFAULT_MODEL) and grpc.is_model_ready(spec.DEFAULT_MODEL)
            metadata = http.get_model_metadata(spec.DEFAULT_MODEL)
            grpc_metadata = grpc.get_model_metadata(spec.DEFAULT_MODEL, as_json=True)
            assert [i["name"] for i in metadata["inputs"]] == [i["name"] for i in grpc_metadata["inputs"]]
            http_result = http.infer(spec.DEFAULT_MODEL, _inputs(httpclient, metadata))
            grpc_result = grpc.infer(spec.DEFAULT_MODEL, _inputs(grpcclient, metadata))
            for output in metadata["outputs"]:
                np.testing.assert_array_equal(http_result.as_numpy(output["name"]),
                                              grpc_result.as_numpy(output["name"]))
            http.close()
            grpc.close()
    finally:
        kube.delete(spec.RESOURCE, name)
