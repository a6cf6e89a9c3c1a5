"""The typed InferenceService spec and its parser (the CRD's ``spec`` as frozen dataclasses).

Every dataclass field carries its CRD property name in ``metadata["json"]``; a test walks these
and the CRD's openAPIV3Schema and fails when they disagree, so the YAML in ``crds/`` and this
module cannot drift. The parser re-checks what the CRD checks (kmock and old clusters do not
validate) and the cross-field rules, raising :class:`SpecError` with the offending path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry_operator import specreader

SpecError = specreader.SpecError

SCALE_METRICS = ("queue", "cpu", "memory", "concurrency", "rps")
SUPPORTED_SCALE_METRICS = ("queue", "cpu", "memory")
PROTOCOLS = ("v1", "v2", "grpc-v2")
RUNTIMES = ("ferry", "ferry-server", "triton", "tritonserver", "kserve-tritonserver")
MIG_STRATEGIES = ("mixed", "single")
CONTROL_MODES = ("none", "poll", "explicit")
STORAGE_SCHEMES = ("s3://", "gs://", "http://", "https://", "pvc://", "file://")
STORAGE_URI = re.compile(r"(s3|gs|https?|pvc|file)://.+|/.*")  # the CRD's storageUri pattern
UNSUPPORTED_COMPONENTS = ("transformer", "explainer")  # in the CRD for KServe YAML; refused here
LEGACY_MODEL_FIELD = "triton"  # predictor.triton: KServe's legacy spelling of predictor.model
LEGACY_OMITS = ("modelFormat", "runtime")  # fields predictor.triton does not have
MAX_REPLICAS = 2**31 - 1  # Deployment and HPA replica counts are int32
MAX_TIMEOUT = 99999 * 3600  # Gateway API durations allow at most 5 digits per unit (99999h)
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")  # or hugepages-<size>, or a domain/name


def _j(name: str, default: Any = None, *, factory: Any = None) -> Any:
    """A dataclass field annotated with its CRD property name."""
    if factory is not None:
        return field(default_factory=factory, metadata={"json": name})
    return field(default=default, metadata={"json": name})


@dataclass(frozen=True)
class ModelFormat:
    name: str = _j("name", "")
    version: str | None = _j("version")


@dataclass(frozen=True)
class Resources:
    requests: Mapping[str, str] = _j("requests", factory=dict)
    limits: Mapping[str, str] = _j("limits", factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """``predictor.model`` (or the legacy ``predictor.triton``, which has no modelFormat/runtime)."""

    storage_uri: str | None = _j("storageUri")
    model_format: ModelFormat | None = _j("modelFormat")
    runtime: str | None = _j("runtime")
    runtime_version: str | None = _j("runtimeVersion")  # accepted for KServe YAML; the image decides
    protocol_version: str | None = _j("protocolVersion")
    image: str | None = _j("image")
    args: tuple[str, ...] = _j("args", ())
    env: tuple[Mapping[str, Any], ...] = _j("env", ())
    resources: Resources = _j("resources", factory=Resources)
    ports: tuple[Mapping[str, Any], ...] = _j("ports", ())  # accepted; Ferry always serves 8000/8001/8002


@dataclass(frozen=True)
class GpuSpec:
    count: int = _j("count", 1)
    mig_profile: str | None = _j("migProfile")
    mig_strategy: str = _j("migStrategy", "mixed")
    product: str | None = _j("product")


@dataclass(frozen=True)
class ServingOptions:
    """Options passed to ``ferry-server`` as tritonserver-named flags."""

    model_control_mode: str | None = _j("modelControlMode")
    load_models: tuple[str, ...] = _j("loadModels", ())
    repository_poll_secs: int | None = _j("repositoryPollSecs")
    strict_readiness: bool | None = _j("strictReadiness")
    exit_timeout_secs: int | None = _j("exitTimeoutSecs")
    log_verbose: int | None = _j("logVerbose")
    backend_config: tuple[str, ...] = _j("backendConfig", ())


@dataclass(frozen=True)
class PredictorSpec:
    model: ModelSpec = _j("model", factory=ModelSpec)
    model_field: str = field(default="model")  # which of model / triton (legacy alias) was written
    min_replicas: int = _j("minReplicas", 1)
    max_replicas: int | None = _j("maxReplicas")
    scale_metric: str = _j("scaleMetric", "queue")
    scale_target: int | None = _j("scaleTarget")
    canary_traffic_percent: int | None = _j("canaryTrafficPercent")
    timeout: int | None = _j("timeout")
    container_concurrency: int | None = _j("containerConcurrency")  # accepted; not enforced
    node_selector: Mapping[str, str] = _j("nodeSelector", factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = _j("tolerations", ())
    affinity: Mapping[str, Any] | None = _j("affinity")
    service_account_name: str | None = _j("serviceAccountName")
    image_pull_secrets: tuple[str, ...] = _j("imagePullSecrets", ())
    storage_secret_name: str | None = _j("storageSecretName")
    gpu: GpuSpec | None = _j("gpu")
    serving: ServingOptions = _j("serving", factory=ServingOptions)

    @property
    def effective_max_replicas(self) -> int:
        return max(self.max_replicas or 0, self.effective_min_replicas)

    @property
    def effective_min_replicas(self) -> int:
        # Scale to zero needs Knative or KEDA; a plain HPA keeps at least one pod.
        return max(self.min_replicas, 1)


@dataclass(frozen=True)
class InferenceServiceSpec:
    predictor: PredictorSpec = _j("predictor", factory=PredictorSpec)


def parse(spec: Mapping[str, Any] | None) -> InferenceServiceSpec:
    """Parse ``body["spec"]`` or raise :class:`SpecError` naming the field and the rule."""
    r = specreader.Reader(spec, "spec")
    for name in UNSUPPORTED_COMPONENTS:
        if r.has(name):
            raise SpecError(f"spec.{name}", "is not supported by Ferry: only spec.predictor is served")
    if r.has("default") and not r.has("predictor"):
        raise SpecError("spec.default", "is the serving.kubeflow.org/v1alpha2 shape (default/canary): write "
                                        "spec.predictor (v1beta1), with canaryTrafficPercent inside it")
    r.known(("predictor", *UNSUPPORTED_COMPONENTS))
    return InferenceServiceSpec(predictor=_predictor(r.child("predictor", required=True)))


def _predictor(r: specreader.Reader) -> PredictorSpec:
    r.known((*specreader.json_names(PredictorSpec), LEGACY_MODEL_FIELD))
    if r.has("model") == r.has("triton"):
        raise SpecError(r.path, "exactly one of 'model' or 'triton' must be set")
    which = "model" if r.has("model") else "triton"
    min_replicas = r.integer("minReplicas", 1, minimum=0, maximum=MAX_REPLICAS)
    max_replicas = r.opt_int("maxReplicas", minimum=1, maximum=MAX_REPLICAS)
    if max_replicas is not None and min_replicas > max_replicas:
        raise SpecError(f"{r.path}.minReplicas", f"must be <= maxReplicas ({min_replicas} > {max_replicas})")
    metric = r.enum("scaleMetric", SCALE_METRICS, "queue")
    if metric not in SUPPORTED_SCALE_METRICS:
        raise SpecError(
            f"{r.path}.scaleMetric",
            f"{metric!r} needs Knative; Ferry scales on {', '.join(SUPPORTED_SCALE_METRICS)}",
        )
    target = r.opt_int("scaleTarget", minimum=1)
    if metric in ("cpu", "memory") and target is not None and target > 100:
        raise SpecError(f"{r.path}.scaleTarget", f"is a utilization percentage for {metric}: 1..100, got {target}")
    model = _model(r.child(which, required=True), legacy=which == "triton")
    gpu = _gpu(r.child("gpu")) if r.has("gpu") else None
    written = [n for n in {**model.resources.requests, **model.resources.limits} if n.startswith("nvidia.com/")]
    if gpu is not None and written:
        # Both would end up in one pod: the gpu block's limit silently overrides (or adds to) these.
        raise SpecError(f"{r.path}.{which}.resources", f"{written[0]} conflicts with {r.path}.gpu: request GPUs in one place")
    return PredictorSpec(
        model=model,
        model_field=which,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        scale_metric=metric,
        scale_target=target,
        canary_traffic_percent=r.opt_int("canaryTrafficPercent", minimum=0, maximum=100),
        timeout=r.opt_int("timeout", minimum=1, maximum=MAX_TIMEOUT),
        container_concurrency=r.opt_int("containerConcurrency", minimum=0),
        node_selector=r.label_map("nodeSelector"),
        tolerations=_tolerations(r),
        affinity=r.opt_obj("affinity"),
        service_account_name=r.opt_name("serviceAccountName"),
        image_pull_secrets=tuple(str(s.get("name", "")) for s in r.obj_list("imagePullSecrets")),
        storage_secret_name=r.opt_name("storageSecretName"),
        gpu=gpu,
        serving=_serving(r.child("serving")),
    )


def _model(r: specreader.Reader, *, legacy: bool) -> ModelSpec:
    names = specreader.json_names(ModelSpec)
    r.known(tuple(n for n in names if not legacy or n not in LEGACY_OMITS))
    uri = r.opt_str("storageUri")
    if r.data.get("storageUri") == "" or (uri is not None and not STORAGE_URI.fullmatch(uri)):
        # The CRD's pattern, read as the API server (RE2) reads it: "s3://" alone, "" or a line break are refused.
        raise SpecError(f"{r.path}.storageUri", f"unsupported URI {r.data.get('storageUri')!r}: use "
                                                f"{', '.join(s + '<location>' for s in STORAGE_SCHEMES)} or /<path>")
    claim = uri[len("pvc://"):].partition("/")[0] if uri is not None and uri.startswith("pvc://") else None
    if claim == "":
        raise SpecError(f"{r.path}.storageUri", f"{uri!r} names no claim (pvc://<claim>/<path>)")
    if claim is not None and specreader.name_problem(claim):
        raise SpecError(f"{r.path}.storageUri", f"claim {specreader.name_problem(claim)}")
    runtime = r.opt_str("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise SpecError(f"{r.path}.runtime", f"{runtime!r} is not served by Ferry (use one of {', '.join(RUNTIMES)})")
    protocol = r.opt_enum("protocolVersion", PROTOCOLS)
    if protocol == "v1":
        raise SpecError(f"{r.path}.protocolVersion", "Ferry serves the V2 (Open Inference) protocol: use v2 or grpc-v2")
    fmt = r.child("modelFormat") if r.has("modelFormat") else None
    if fmt is not None:
        fmt.known(("name", "version"))
    resources = r.child("resources")
    resources.known(("requests", "limits"))
    image = r.opt_str("image")
    if image is not None and image != image.strip():
        raise SpecError(f"{r.path}.image", f"{image!r} has leading or trailing whitespace")
    args = r.str_list("args")
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in ("--http-port", "--grpc-port", "--metrics-port"):
            raise SpecError(f"{r.path}.args", f"{flag} is set by the operator (probes and Services depend on it)")
    return ModelSpec(
        storage_uri=uri,
        model_format=ModelFormat(fmt.text("name"), fmt.opt_str("version")) if fmt is not None else None,
        runtime=runtime,
        runtime_version=r.opt_str("runtimeVersion"),
        protocol_version=protocol,
        image=image,
        args=args,
        env=_env(r),
        resources=_resources(resources),
        ports=r.obj_list("ports"),
    )


def _tolerations(r: specreader.Reader) -> tuple[Mapping[str, Any], ...]:
    """The API server's toleration rules (pod validation), reported here rather than on every apply."""
    tolerations = r.obj_list("tolerations")
    for index, item in enumerate(tolerations):
        where = f"{r.path}.tolerations[{index}]"
        exists = item.get("operator") == "Exists"
        if not item.get("key") and not exists:
            raise SpecError(where, "operator must be Exists when key is empty")
        if exists and item.get("value"):
            raise SpecError(f"{where}.value", "must be empty when operator is Exists")
        if item.get("tolerationSeconds") is not None and item.get("effect") not in (None, "NoExecute"):
            raise SpecError(f"{where}.tolerationSeconds", "needs effect NoExecute")
        problem = specreader.label_key_problem(str(item["key"])) if item.get("key") else None
        problem = problem or (specreader.label_value_problem(str(item["value"])) if item.get("value") else None)
        if problem:
            raise SpecError(where, problem)
    return tolerations


def _env(r: specreader.Reader) -> tuple[Mapping[str, Any], ...]:
    env = r.obj_list("env", required_key="name")
    for index, item in enumerate(env):
        if "=" in str(item["name"]):
            raise SpecError(f"{r.path}.env[{index}].name", f"{item['name']!r} contains '='")
        if item.get("value") is not None and item.get("valueFrom") is not None:
            raise SpecError(f"{r.path}.env[{index}]", "value and valueFrom are mutually exclusive")
    return env


def _resources(r: specreader.Reader) -> Resources:
    """Quantities plus the API server's container rules, so a bad one is reported, not retried."""
    requests, limits = r.quantity_map("requests"), r.quantity_map("limits")
    for name in {**requests, **limits}:
        if "/" not in name and name not in STANDARD_RESOURCES and not name.startswith("hugepages-"):
            raise SpecError(f"{r.path}.limits.{name}" if name in limits else f"{r.path}.requests.{name}",
                            f"unknown resource: use {', '.join(STANDARD_RESOURCES)}, hugepages-<size> or <domain>/<name>")
    for name, value in requests.items():
        limit = limits.get(name)
        if _extended(name) and limit is None:
            raise SpecError(f"{r.path}.limits.{name}", f"is required: {name} cannot be overcommitted (set it in limits)")
        if limit is None:
            continue
        asked, allowed = specreader.quantity(value), specreader.quantity(limit)
        if asked > allowed:  # type: ignore[operator]
            raise SpecError(f"{r.path}.requests.{name}", f"must be <= limits.{name} ({value} > {limit})")
        if _extended(name) and asked != allowed:
            raise SpecError(f"{r.path}.requests.{name}", f"must equal limits.{name} ({value} != {limit}): it cannot be overcommitted")
    for name, value in limits.items():
        number = specreader.quantity(value)
        if _extended(name) and number is not None and number != int(number):
            raise SpecError(f"{r.path}.limits.{name}", f"must be a whole number, got {value!r}")
    return Resources(requests, limits)


def _extended(name: str) -> bool:
    """An extended resource (``<domain>/<name>`` outside kubernetes.io, e.g. nvidia.com/gpu): whole, never overcommitted."""
    return "/" in name and not name.startswith("kubernetes.io/")


def _gpu(r: specreader.Reader) -> GpuSpec:
    r.known(specreader.json_names(GpuSpec))
    if r.has("migStrategy") and not r.has("migProfile"):
        raise SpecError(f"{r.path}.migStrategy", "needs migProfile (the MIG slice to request)")
    return GpuSpec(
        count=r.integer("count", 1, minimum=1, maximum=16),
        mig_profile=r.opt_str("migProfile"),
        mig_strategy=r.enum("migStrategy", MIG_STRATEGIES, "mixed"),
        product=r.opt_str("product"),
    )


def _serving(r: specreader.Reader) -> ServingOptions:
    r.known(specreader.json_names(ServingOptions))
    mode, load_models = r.opt_enum("modelControlMode", CONTROL_MODES), r.str_list("loadModels")
    if load_models and mode != "explicit":  # ferry-server refuses --load-model otherwise, as tritonserver does
        raise SpecError(f"{r.path}.loadModels", "needs modelControlMode explicit (as tritonserver, ferry-server "
                                                "loads models by name only in explicit mode)")
    return ServingOptions(
        model_control_mode=mode,
        load_models=load_models,
        repository_poll_secs=r.opt_int("repositoryPollSecs", minimum=1),
        strict_readiness=r.opt_bool("strictReadiness"),
        exit_timeout_secs=r.opt_int("exitTimeoutSecs", minimum=0, maximum=3600),
        log_verbose=r.opt_int("logVerbose", minimum=0, maximum=10),
        backend_config=r.str_list("backendConfig"),
    )
