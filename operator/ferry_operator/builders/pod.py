"""The serving pod template: ferry-server container, storage-initializer init container, volumes.

The container runs ``ferry-server`` with tritonserver's flag names on 8000/8001/8002; models
come from ``/mnt/models``, an emptyDir filled by ``ferry-server download <storageUri> /mnt/models``
before the server starts (pvc:// claims are mounted read-only under ``/mnt/pvc/<claim>`` and copied).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferry_operator import naming
from ferry_operator.config import OperatorConfig
from ferry_operator.mig import GPU_TOLERATION, GpuResources, has_gpu_resources
from ferry_operator.spec import PredictorSpec, ServingOptions

MODEL_VOLUME = "model-store"
SHM_VOLUME = "dshm"
PVC_VOLUME = "model-pvc"
CONTAINER = "ferry-server"
INITIALIZER = "storage-initializer"
# Variables the storage initializer inherits from the predictor's env (credentials, endpoints, proxies).
INITIALIZER_ENV_PREFIXES = ("AWS_", "S3_", "GOOGLE_", "GCS_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def server_args(options: ServingOptions, user_args: tuple[str, ...]) -> list[str]:
    """ferry-server flags: repository and ports first, serving options, then the user's args."""
    args = []
    if not any(a.split("=", 1)[0] in ("--model-repository", "--model-store") for a in user_args):
        args.append(f"--model-repository={naming.MODEL_DIR}")
    args += [
        f"--http-port={naming.HTTP_PORT}",
        f"--grpc-port={naming.GRPC_PORT}",
        f"--metrics-port={naming.METRICS_PORT}",
    ]
    if options.model_control_mode:
        args.append(f"--model-control-mode={options.model_control_mode}")
    args += [f"--load-model={name}" for name in options.load_models]
    if options.repository_poll_secs is not None:
        args.append(f"--repository-poll-secs={options.repository_poll_secs}")
    if options.strict_readiness is not None:
        args.append(f"--strict-readiness={str(options.strict_readiness).lower()}")
    if options.exit_timeout_secs is not None:
        args.append(f"--exit-timeout-secs={options.exit_timeout_secs}")
    if options.log_verbose is not None:
        args.append(f"--log-verbose={options.log_verbose}")
    args += [f"--backend-config={item}" for item in options.backend_config]
    return args + list(user_args)


def _probe(path: str, period: int, failures: int, initial: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }
    if initial:
        probe["initialDelaySeconds"] = initial
    return probe


def resources(predictor: PredictorSpec, gpu: GpuResources) -> dict[str, Any]:
    limits = {**predictor.model.resources.limits, **gpu.limits}
    requests = dict(predictor.model.resources.requests)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def uses_gpu(predictor: PredictorSpec, gpu: GpuResources) -> bool:
    return bool(gpu.limits) or has_gpu_resources(predictor.model.resources.limits)


def server_container(predictor: PredictorSpec, gpu: GpuResources, config: OperatorConfig) -> dict[str, Any]:
    env = [dict(item) for item in predictor.model.env]
    if uses_gpu(predictor, gpu) and not any(item["name"] == "FERRY_INSTANCE_KIND" for item in env):
        env.append({"name": "FERRY_INSTANCE_KIND", "value": "KIND_GPU"})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": predictor.model.image or config.server_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["ferry-server"],
        "args": server_args(predictor.serving, predictor.model.args),
        "ports": [
            {"name": "http", "containerPort": naming.HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": naming.GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": naming.METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": _probe("/v2/health/live", 10, 3),
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        # Model loading can take minutes: liveness starts only after the first ready answer.
        "startupProbe": _probe("/v2/health/ready", 10, config.startup_failure_threshold),
        "volumeMounts": [
            {"name": MODEL_VOLUME, "mountPath": naming.MODEL_DIR},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if env:
        container["env"] = env
    res = resources(predictor, gpu)
    if res:
        container["resources"] = res
    return container


def pvc_claim(storage_uri: str | None) -> str | None:
    if storage_uri and storage_uri.startswith("pvc://"):
        return storage_uri[len("pvc://"):].split("/", 1)[0]
    return None


def initializer_container(predictor: PredictorSpec, config: OperatorConfig) -> dict[str, Any] | None:
    uri = predictor.model.storage_uri
    if not uri:
        return None
    env = [dict(e) for e in predictor.model.env if str(e["name"]).startswith(INITIALIZER_ENV_PREFIXES)]
    env.append({"name": "FERRY_PVC_ROOT", "value": naming.PVC_ROOT})
    mounts: list[dict[str, Any]] = [{"name": MODEL_VOLUME, "mountPath": naming.MODEL_DIR}]
    claim = pvc_claim(uri)
    if claim:
        mounts.append({"name": PVC_VOLUME, "mountPath": f"{naming.PVC_ROOT}/{claim}", "readOnly": True})
    container: dict[str, Any] = {
        "name": INITIALIZER,
        "image": config.storage_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["ferry-server", "download"],
        "args": [uri, naming.MODEL_DIR],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if predictor.storage_secret_name:
        container["envFrom"] = [{"secretRef": {"name": predictor.storage_secret_name}}]
    return container


def pod_spec(predictor: PredictorSpec, gpu: GpuResources, config: OperatorConfig) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": MODEL_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": config.shm_size}},
    ]
    claim = pvc_claim(predictor.model.storage_uri)
    if claim:
        volumes.append({"name": PVC_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    exit_timeout = predictor.serving.exit_timeout_secs
    spec: dict[str, Any] = {
        "containers": [server_container(predictor, gpu, config)],
        "volumes": volumes,
        # ferry-server drains for --exit-timeout-secs after SIGTERM; leave it room to finish.
        "terminationGracePeriodSeconds": (config.exit_timeout_secs if exit_timeout is None else exit_timeout) + 15,
    }
    init = initializer_container(predictor, config)
    if init:
        spec["initContainers"] = [init]
    node_selector: Mapping[str, str] = {**predictor.node_selector, **gpu.node_selector}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    tolerations = [dict(t) for t in predictor.tolerations]
    if uses_gpu(predictor, gpu):
        # GPU nodes are usually tainted; user-written nvidia.com/gpu limits get the toleration too.
        for toleration in gpu.tolerations or (GPU_TOLERATION,):
            if dict(toleration) not in tolerations:
                tolerations.append(dict(toleration))
    if tolerations:
        spec["tolerations"] = tolerations
    if predictor.affinity:
        spec["affinity"] = dict(predictor.affinity)
    if predictor.service_account_name:
        spec["serviceAccountName"] = predictor.service_account_name
    if predictor.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in predictor.image_pull_secrets]
    return spec
