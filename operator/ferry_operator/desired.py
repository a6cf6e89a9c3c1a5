"""Pure reconciliation: an InferenceService body + observed Deployments -> what to do.

``compute`` returns the objects to apply (with owner references), the names to delete, the new
status and the Events to emit. It does no I/O, so every rollout step is testable as data;
:mod:`.reconcile` performs the result against the API server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry_operator import events, mig, naming, rollout, spec, specreader, status
from ferry_operator.builders import networking, scaling, workloads
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState

# Fields that change how a revision is rolled out or scaled, not what its pods run.
NON_REVISION_FIELDS = frozenset({
    "model_field", "min_replicas", "max_replicas", "scale_metric", "scale_target",
    "canary_traffic_percent", "timeout", "container_concurrency",
})
OPTIONAL_NAMES = {  # kind -> names that exist only in some plans (deleted when not desired)
    "Service": lambda isvc: [naming.tag_service(isvc, "prev")],
    "PodDisruptionBudget": lambda isvc: [naming.predictor(isvc)],
    "HTTPRoute": lambda isvc: [naming.route(isvc), naming.route(isvc, "latest"), naming.route(isvc, "prev")],
}


@dataclass(frozen=True)
class Apply:
    obj: dict[str, Any]
    keep_replicas: bool = False  # the HPA owns spec.replicas once the object exists


@dataclass(frozen=True)
class Desired:
    applies: tuple[Apply, ...]
    deletes: tuple[tuple[str, str], ...]  # (kind, name)
    status: dict[str, Any]
    events: tuple[events.Event, ...]
    plan: rollout.RolloutPlan | None = None


def revision_of(isvc: str, predictor: spec.PredictorSpec) -> str:
    fields = {k: v for k, v in dataclasses.asdict(predictor).items() if k not in NON_REVISION_FIELDS}
    return naming.revision_deployment(isvc, naming.revision_hash(fields))


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def compute(
    body: Mapping[str, Any],
    observed: Mapping[str, DeploymentState],
    *,
    config: OperatorConfig,
    gateway: bool,
    now: str,
) -> Desired:
    meta = body.get("metadata") or {}
    isvc, namespace = str(meta.get("name")), str(meta.get("namespace") or "default")
    generation = meta.get("generation")
    previous = body.get("status") or {}
    try:
        if len(isvc) > naming.MAX_NAME_LENGTH:
            raise spec.SpecError("metadata.name", f"must be at most {naming.MAX_NAME_LENGTH} characters")
        if not specreader.DNS1035_LABEL.match(isvc):
            # CR names may contain dots or start with a digit; the child Service names may not.
            raise spec.SpecError(
                "metadata.name", f"{isvc!r} must be a DNS-1035 label (a-z, 0-9 and '-', starting with a letter)"
            )
        label = naming.host_label(isvc, namespace, "latest")
        if gateway and len(label) > naming.MAX_LABEL_LENGTH:
            # Gateway API admits the route, but no DNS name or certificate can carry such a label.
            raise spec.SpecError("metadata.name", (
                f"with namespace {namespace!r}, the route host label {label!r} has {len(label)} characters; a DNS "
                f"label has at most {naming.MAX_LABEL_LENGTH}: shorten the name or the namespace"))
        parsed = spec.parse(body.get("spec"))
        gpu = mig.resolve(parsed.predictor.gpu)
        mig.check_written(parsed.predictor.model.resources.limits,
                          f"spec.predictor.{parsed.predictor.model_field}.resources.limits")
    except spec.SpecError as exc:
        new_status = status.invalid(previous, generation, "InvalidSpec", str(exc), now)
        return Desired((), (), new_status, tuple(events.diff(previous, new_status)))

    predictor = parsed.predictor
    component = (previous.get("components") or {}).get(naming.COMPONENT) or {}
    latest = revision_of(isvc, predictor)
    plan = rollout.plan(
        latest=latest,
        canary_percent=predictor.canary_traffic_percent,
        latest_rolledout=component.get("latestRolledoutRevision"),
        previous_rolledout=component.get("previousRolledoutRevision"),
        ready=frozenset(name for name, state in observed.items() if state.ready),
        existing=frozenset(observed),
    )
    applies = _objects(isvc, namespace, predictor, gpu, plan, observed, config, gateway)
    owner = owner_reference(body)
    for item in applies:
        item.obj["metadata"]["ownerReferences"] = [owner]
    wanted = {(a.obj["kind"], a.obj["metadata"]["name"]) for a in applies}
    deletes = [("Deployment", name) for name in sorted(observed) if name not in plan.keep]
    deletes += [(kind, name) for kind, names in OPTIONAL_NAMES.items() for name in names(isvc) if (kind, name) not in wanted]
    new_status = status.compute(
        isvc=isvc, namespace=namespace, generation=generation, plan=plan, observed=observed,
        previous=previous, gateway=gateway, config=config, now=now,
    )
    return Desired(tuple(applies), tuple(deletes), new_status, tuple(events.diff(previous, new_status)), plan)


def _objects(
    isvc: str,
    namespace: str,
    predictor: spec.PredictorSpec,
    gpu: mig.GpuResources,
    plan: rollout.RolloutPlan,
    observed: Mapping[str, DeploymentState],
    config: OperatorConfig,
    gateway: bool,
) -> list[Apply]:
    hash_of = {name: name.rsplit("-", 1)[-1] for name in (plan.latest, plan.stable) if name}
    latest_scaled_by_hpa = plan.hpa_target == plan.latest
    if latest_scaled_by_hpa:
        replicas = predictor.effective_min_replicas
    elif plan.phase == rollout.ROLLING_OUT:
        replicas = predictor.effective_min_replicas  # full capacity before it takes all traffic
    else:
        stable = observed.get(plan.stable or "")
        replicas = rollout.canary_replicas(
            plan.requested_percent or 0,
            stable.replicas if stable else predictor.effective_min_replicas,
            predictor.effective_min_replicas,
            exact_weights=gateway,
        )
    out = [
        Apply(
            workloads.deployment(
                isvc=isvc, namespace=namespace, revision=hash_of[plan.latest], predictor=predictor,
                gpu=gpu, config=config, replicas=replicas,
            ),
            keep_replicas=latest_scaled_by_hpa,
        ),
        Apply(networking.service(isvc=isvc, namespace=namespace, name=naming.predictor(isvc),
                                 revision=hash_of[plan.single] if plan.single else None)),
        Apply(networking.service(isvc=isvc, namespace=namespace, name=naming.tag_service(isvc, "latest"),
                                 revision=hash_of[plan.latest])),
        Apply(scaling.hpa(isvc=isvc, namespace=namespace, target=plan.hpa_target, predictor=predictor, config=config)),
    ]
    if plan.stable:
        out.append(Apply(networking.service(isvc=isvc, namespace=namespace, name=naming.tag_service(isvc, "prev"),
                                            revision=hash_of[plan.stable])))
    if predictor.effective_min_replicas > 1:
        out.append(Apply(scaling.pdb(isvc=isvc, namespace=namespace)))
    if gateway:
        weighted = [(naming.tag_service(isvc, t.tag), t.percent) for t in plan.traffic]
        routes: list[tuple[str | None, list[tuple[str, int]]]] = [(None, weighted)]
        routes += [(tag, [(naming.tag_service(isvc, tag), 100)]) for tag in ("latest", "prev") if tag == "latest" or plan.stable]
        for tag, backends in routes:
            out.append(Apply(networking.http_route(
                isvc=isvc, namespace=namespace, name=naming.route(isvc, tag),
                hostname=naming.host(isvc, namespace, config.ingress_domain, tag), backends=backends,
                gateway_name=config.gateway_name, gateway_namespace=config.gateway_namespace,
                timeout_s=predictor.timeout)))
    return out
