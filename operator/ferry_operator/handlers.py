"""kopf wiring: thin handlers that call :mod:`.reconcile` and write status and Events.

Nothing is registered at import time: :func:`build_registry` creates a registry for one
operator instance (the CLI's or a test's) with its own settings and login.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from ferry_operator import api, naming, reconcile
from ferry_operator.config import OperatorConfig
from ferry_operator.observed import DeploymentState, observe

Login = Callable[..., "kopf.ConnectionInfo | None"]
INDEX = "deployments_by_isvc"


def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account first, then the kubeconfig (via the kubernetes client)."""
    info = kopf.login_with_service_account(**kwargs)
    if info is None:
        try:
            info = kopf.login_via_client(**kwargs)
        except ImportError:
            info = kopf.login_with_kubeconfig(**kwargs)
    return info


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch turning ``old`` into ``new`` (nulls for keys that disappeared)."""
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key not in new:
            patch[key] = None
        elif isinstance(new[key], Mapping) and isinstance(old.get(key), Mapping):
            inner = status_patch(old[key], new[key])
            if inner:
                patch[key] = inner
        elif old.get(key) != new[key]:
            patch[key] = new[key]
    return patch


def build_registry(config: OperatorConfig, *, login: Login = default_login) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    isvcs = (naming.GROUP, naming.VERSION, naming.PLURAL)

    @kopf.on.login(registry=registry)
    def authenticate(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(**kwargs)

    @kopf.on.startup(registry=registry)
    async def configure(*, settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
        settings.persistence.finalizer = config.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=config.prefix)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=config.prefix, key="last-handled-configuration"
        )
        settings.peering.standalone = True  # one replica (Recreate); no KopfPeering CRD needed
        settings.posting.level = logging.WARNING  # kopf's own log lines as Events: warnings only
        settings.networking.error_backoffs = [0.5, 1, 2, 5, 10]
        info = login(settings=settings, logger=logger, **kwargs)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials (service account or kubeconfig)")
        memo.kube = api.KubeApi(
            api.Connection.from_kopf(info), retries=config.api_retries, backoff=config.api_backoff_seconds
        )
        memo.discovery = reconcile.Discovery()

    @kopf.on.cleanup(registry=registry)
    async def close(*, memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "kube", None) is not None:
            await memo.kube.close()

    # The id is the keyword under which kopf hands the index to the other handlers.
    @kopf.index("apps", "v1", "deployments", id=INDEX, labels={naming.LABEL_ISVC: kopf.PRESENT}, registry=registry)
    def deployments_by_isvc(*, body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> Any:
        return {(namespace, labels[naming.LABEL_ISVC]): observe(body)}

    async def _reconcile(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, index: kopf.Index, logger: Any) -> None:
        lock: asyncio.Lock = memo.setdefault("lock", asyncio.Lock())
        applied: reconcile.Applied = memo.setdefault("applied", reconcile.Applied())
        meta = body.get("metadata") or {}
        observed: dict[str, DeploymentState] = {
            state.name: state for state in index.get((meta.get("namespace"), meta.get("name")), [])
        }
        async with lock:
            try:
                result = await reconcile.run(
                    body, kube=memo.kube, config=config, discovery=memo.discovery,
                    observed=observed, applied=applied, now=now(),
                )
            except api.ApiError as exc:
                raise kopf.TemporaryError(f"API server: {exc}", delay=config.retry_delay_seconds) from exc
        old = dict(body.get("status") or {})
        for key, value in status_patch(old, result.status).items():
            patch.status[key] = value
        for event in result.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)

    backoff = config.retry_delay_seconds

    @kopf.on.resume(*isvcs, registry=registry, backoff=backoff)
    @kopf.on.create(*isvcs, registry=registry, backoff=backoff)
    @kopf.on.update(*isvcs, registry=registry, backoff=backoff)
    async def reconcile_on_change(*, body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, logger: Any, **kwargs: Any) -> None:
        await _reconcile(body, memo, patch, kwargs[INDEX], logger)

    @kopf.timer(*isvcs, interval=config.resync_seconds, registry=registry, backoff=backoff)
    async def reconcile_on_timer(*, body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, logger: Any, **kwargs: Any) -> None:
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        await _reconcile(body, memo, patch, kwargs[INDEX], logger)

    @kopf.on.delete(*isvcs, registry=registry, backoff=backoff)
    async def clean_up(*, body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
        meta = body.get("metadata") or {}
        states = kwargs[INDEX].get((meta.get("namespace"), meta.get("name")), [])
        try:
            count = await reconcile.delete_children(
                body, kube=memo.kube, discovery=memo.discovery, deployments=sorted({s.name for s in states})
            )
        except api.ApiError as exc:
            raise kopf.TemporaryError(f"API server: {exc}", delay=config.retry_delay_seconds) from exc
        logger.info("deleted %d child objects", count)

    return registry
