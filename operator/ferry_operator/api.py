"""The one module that talks to the Kubernetes API server (aiohttp, JSON merge-patch).

``KubeApi.apply`` is idempotent: GET, then create when absent or merge-patch when the live
object differs from the desired one; a 409 on create (the object appeared meanwhile, or an
earlier attempt succeeded but its answer was lost) falls back to patching. 429/5xx answers and
connection errors are retried with exponential backoff; what still fails raises
:class:`ApiError`, which the handlers turn into a kopf retry.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import aiohttp

log = logging.getLogger(__name__)

RETRIABLE = frozenset({409, 429, 500, 502, 503, 504})
# Maps the operator owns entirely: keys it no longer wants are removed (merge-patch would keep them).
OWNED_MAPS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Service": (("spec", "selector"),),
}


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


RESOURCES: Mapping[str, Resource] = {
    "Deployment": Resource("apps", "v1", "deployments"),
    "Service": Resource("", "v1", "services"),
    "HorizontalPodAutoscaler": Resource("autoscaling", "v2", "horizontalpodautoscalers"),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets"),
    "HTTPRoute": Resource("gateway.networking.k8s.io", "v1", "httproutes"),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Refused(ApiError):
    """The object itself is the problem (invalid, or another owner's): retrying cannot help.

    ``reason`` is the status condition reason the InferenceService gets.
    """

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(status, message)
        self.reason = reason


REFUSED = frozenset({400, 422})  # BadRequest / Invalid: the API server's validation said no


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((ref.get("uid") for ref in refs if ref.get("controller")), None)


def _foreign(live: Mapping[str, Any], owner_uid: str | None) -> str | None:
    """The controller of ``live`` when it is not ``owner_uid`` (names can collide across owners)."""
    refs = (live.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), None)
    if owner_uid and ref is not None and ref.get("uid") != owner_uid:
        return f"{ref.get('kind')}/{ref.get('name')}"
    return None


@dataclass(frozen=True)
class Connection:
    """Where and how to reach the API server (built from a ``kopf.ConnectionInfo``)."""

    server: str
    token: str | None = None
    token_path: str | None = None  # re-read on 401: projected service account tokens rotate
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None

    @classmethod
    def from_kopf(cls, info: Any) -> Connection:
        ca_data = info.ca_data
        if isinstance(ca_data, str):
            ca_data = base64.b64decode(ca_data)
        sa_token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
        return cls(
            server=str(info.server).rstrip("/"),
            token=info.token,
            token_path=sa_token if info.server == "https://kubernetes.default.svc" else None,
            ca_path=str(info.ca_path) if info.ca_path else None,
            ca_data=ca_data,
            insecure=bool(info.insecure),
            certificate_path=str(info.certificate_path) if info.certificate_path else None,
            private_key_path=str(info.private_key_path) if info.private_key_path else None,
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_path, cadata=self.ca_data.decode() if self.ca_data else None)
        if self.certificate_path and self.private_key_path:
            context.load_cert_chain(self.certificate_path, self.private_key_path)
        return context


def contains(live: Any, desired: Any) -> bool:
    """True when every field of ``desired`` is present and equal in ``live`` (server defaults ignored)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(contains(live.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(map(contains, live, desired))
    return live == desired or (isinstance(desired, (int, float)) and str(live) == str(desired))


class KubeApi:
    """Async client; create with ``KubeApi(connection)`` and close with ``await api.close()``."""

    def __init__(self, connection: Connection, *, retries: int = 4, backoff: float = 0.2) -> None:
        self.connection = connection
        self.retries = retries
        self.backoff = backoff
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.connection.token:
                headers["Authorization"] = f"Bearer {self.connection.token}"
            self._session = aiohttp.ClientSession(
                base_url=self.connection.server,
                headers=headers,
                connector=aiohttp.TCPConnector(ssl=self.connection.ssl_context()),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def request(
        self, method: str, path: str, *, json: Any = None, content_type: str | None = None,
        retry_conflicts: bool = True,
    ) -> tuple[int, Any]:
        """One API call with retries on 429/5xx (and 409 unless disabled); returns (status, body)."""
        headers = {"Content-Type": content_type} if content_type else None
        attempt = 0
        while True:
            try:
                async with self._client().request(method, path, json=json, headers=headers) as response:
                    status = response.status
                    body = await response.json(content_type=None) if await response.read() else None
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                status, body = 0, {"message": f"connection failed: {exc!r}"}
            if status == 401 and attempt == 0 and self._reload_token():
                attempt += 1
                continue
            retriable = status == 0 or (status in RETRIABLE and (status != 409 or retry_conflicts))
            if not retriable or attempt >= self.retries:
                return status, body
            attempt += 1
            delay = self.backoff * 2 ** (attempt - 1)
            log.info("%s %s -> %s; retry %d in %.1fs", method, path, status or "error", attempt, delay)
            await asyncio.sleep(delay)

    def _reload_token(self) -> bool:
        if not self.connection.token_path:
            return False
        try:
            with open(self.connection.token_path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError:
            return False
        self.connection = dataclasses.replace(self.connection, token=token)
        if self._session is not None:
            self._session.headers["Authorization"] = f"Bearer {token}"
        return True

    @staticmethod
    def _raise(status: int, body: Any, what: str) -> NoReturn:
        message = body.get("message") if isinstance(body, Mapping) else None
        if status in REFUSED:
            raise Refused(status, f"the API server refused to {what}: {message or body}", "InvalidSpec")
        raise ApiError(status, f"{what}: {message or body}")

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        status, body = await self.request("GET", resource.path(namespace, name))
        if status == 404:
            return None
        if status != 200:
            self._raise(status, body, f"get {resource.plural}/{name}")
        return body

    async def served(self, resource: Resource) -> bool:
        """Whether the API server serves ``resource`` (e.g. Gateway API's HTTPRoute)."""
        base = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
        status, body = await self.request("GET", base)
        if status != 200 or not isinstance(body, Mapping):
            return False
        return any(r.get("name") == resource.plural for r in body.get("resources") or [])

    async def apply(self, obj: Mapping[str, Any], *, keep: tuple[str, ...] = ()) -> str:
        """Create or merge-patch ``obj``; top-level ``spec`` keys in ``keep`` are never overwritten.

        Returns "created", "patched" or "unchanged".
        """
        resource = RESOURCES[obj["kind"]]
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
        for _ in range(3):
            live = await self.get(resource, namespace, name)
            if live is None:
                status, body = await self.request(
                    "POST", resource.path(namespace), json=obj, retry_conflicts=False
                )
                if status in (200, 201):
                    return "created"
                if status == 409:
                    continue  # exists after all: go round and patch it
                self._raise(status, body, f"create {resource.plural}/{name}")
            other = _foreign(live, controller_uid(obj))
            if other:
                raise Refused(409, f"{obj['kind']} {name} already exists and is controlled by {other}", "NameConflict")
            wanted = _without(obj, keep) if _has_spec_keys(live, keep) else dict(obj)
            if contains(live, wanted) and _owned_maps_equal(live, wanted):
                return "unchanged"
            status, body = await self.request(
                "PATCH", resource.path(namespace, name), json=_patch(live, wanted),
                content_type="application/merge-patch+json",
            )
            if status == 200:
                return "patched"
            if status != 404:
                self._raise(status, body, f"patch {resource.plural}/{name}")
        raise ApiError(409, f"{resource.plural}/{name} kept changing while being applied")

    async def delete(self, kind: str, namespace: str | None, name: str, *, owner_uid: str | None = None) -> bool:
        """Delete (foreground-free, background propagation); False when it did not exist.

        With ``owner_uid``, an object controlled by someone else is left alone (and False returned):
        ``<isvc>-prev`` may be another InferenceService's HTTPRoute.
        """
        resource = RESOURCES[kind]
        if owner_uid:
            live = await self.get(resource, namespace, name)
            if live is None or _foreign(live, owner_uid):
                return False
        status, body = await self.request(
            "DELETE", resource.path(namespace, name), json={"propagationPolicy": "Background"}
        )
        if status == 404:
            return False
        if status not in (200, 202):
            self._raise(status, body, f"delete {resource.plural}/{name}")
        return True


def _patch(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """``wanted`` as a merge patch, with nulls for stale keys of the maps in OWNED_MAPS."""
    patch = _copy(wanted)
    for path in OWNED_MAPS.get(str(wanted.get("kind")), ()):
        old, new = _dig(live, path), _dig(patch, path)
        if isinstance(old, Mapping) and isinstance(new, dict):
            new.update({key: None for key in old if key not in new})
    return patch


def _owned_maps_equal(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(_dig(live, path) == _dig(wanted, path) for path in OWNED_MAPS.get(str(wanted.get("kind")), ()))


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def _has_spec_keys(live: Mapping[str, Any], keep: tuple[str, ...]) -> bool:
    spec = live.get("spec") or {}
    return any(key in spec for key in keep)


def _without(obj: Mapping[str, Any], keep: tuple[str, ...]) -> dict[str, Any]:
    out = dict(obj)
    out["spec"] = {k: v for k, v in (obj.get("spec") or {}).items() if k not in keep}
    return out
