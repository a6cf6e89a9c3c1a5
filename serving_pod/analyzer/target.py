"""The server under test: a ``ferry-server`` the analyzer starts, or a remote one, driven over HTTP.

Either way the server runs in explicit model control: each candidate is loaded through the repository
extension (``POST /v2/repository/models/<m>/load`` with a ``config`` override), so one server process
serves the whole sweep. :class:`LocalServer` binds its ports to 0 on 127.0.0.1 and reads the chosen ports
from the server's startup log line; a server that exits or never becomes ready raises
:class:`~serving_pod.analyzer.errors.ServerError` quoting its log. Neighbours: ``measure`` (uses
:meth:`ServerClient.statistics` and ``pid``), ``profile`` (lifecycle).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving_pod.analyzer.errors import InputError, ServerError

# tritonserver logs one line per service it started, gRPC's before HTTP's
_STARTED_HTTP = re.compile(r"Started HTTPService at \S+:(?P<port>\d+)")
_STARTED_GRPC = re.compile(r"Started GRPCInferenceService at \S+:(?P<port>\d+)")


class ServerClient:
    """The few HTTP calls the analyzer needs (stdlib only: works against any Triton-compatible server)."""

    def __init__(self, http_url: str, timeout: float = 120.0) -> None:
        self.http_url = http_url.removeprefix("http://").rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://{self.http_url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    @staticmethod
    def _error(payload: bytes) -> str:
        try:
            return str(json.loads(payload).get("error", payload.decode(errors="replace")))
        except (ValueError, AttributeError):
            return payload.decode(errors="replace")

    def live(self) -> bool:
        try:
            return self._call("GET", "/v2/health/live")[0] == 200
        except OSError:
            return False

    def model_ready(self, model: str) -> bool:
        try:
            return self._call("GET", f"/v2/models/{model}/ready")[0] == 200
        except OSError:
            return False

    def load(self, model: str, config_json: str | None = None) -> None:
        """Load (or reload) ``model``; with ``config_json`` the on-disk config is replaced by it."""
        body = {"parameters": {"config": config_json}} if config_json is not None else {}
        status, payload = self._request("POST", f"/v2/repository/models/{model}/load", body)
        if status != 200:
            raise LoadError(f"server refused to load '{model}' (HTTP {status}): {self._error(payload)}")

    def unload(self, model: str) -> None:
        status, payload = self._request("POST", f"/v2/repository/models/{model}/unload", {})
        if status != 200:
            raise LoadError(f"server refused to unload '{model}' (HTTP {status}): {self._error(payload)}")

    def model_config(self, model: str) -> dict[str, Any]:
        """The configuration the server serves ``model`` with (``GET /v2/models/<m>/config``)."""
        status, payload = self._request("GET", f"/v2/models/{model}/config")
        if status != 200:
            raise ServerError(f"configuration of '{model}' unavailable (HTTP {status}): {self._error(payload)}")
        return json.loads(payload)

    def statistics(self, model: str) -> dict[str, Any]:
        """The statistics extension's entry for ``model`` (all versions summed by ``stats``)."""
        status, payload = self._request("GET", f"/v2/models/{model}/stats")
        if status != 200:
            raise ServerError(f"statistics of '{model}' unavailable (HTTP {status}): {self._error(payload)}")
        return json.loads(payload)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        try:
            return self._call(method, path, body)
        except OSError as exc:
            raise ServerError(f"server at {self.http_url} unreachable: {exc}") from None


class LoadError(ServerError):
    """A candidate configuration the server would not load (recorded, the sweep goes on)."""


@dataclass(frozen=True)
class LaunchSettings:
    """How :class:`LocalServer` starts ``ferry-server``."""

    repository: Path
    command: tuple[str, ...] = (sys.executable, "-m", "serving_pod")
    extra_args: tuple[str, ...] = ()
    http_port: int = 0
    startup_timeout_s: float = 60.0
    log_path: Path | None = None

    @staticmethod
    def parse_command(text: str) -> tuple[str, ...]:
        try:
            parts = tuple(shlex.split(text))
        except ValueError as exc:
            raise InputError(f"invalid --server-command {text!r}: {exc}") from None
        if not parts:
            raise InputError("--server-command is empty")
        return parts


class LocalServer:
    """A ``ferry-server`` subprocess in explicit model control mode (use as a context manager)."""

    def __init__(self, settings: LaunchSettings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: ServerClient | None = None
        self.grpc_url: str | None = None
        self.log_path = settings.log_path or Path(os.devnull)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        s = self.settings
        return [*s.command, f"--model-repository={s.repository}", "--model-control-mode=explicit",
                "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                f"--http-port={s.http_port}", "--grpc-port=0", "--metrics-port=0", "--log-info=true", *s.extra_args]

    def start(self) -> ServerClient:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # so `serving_pod` imports from a source checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            raise ServerError(f"cannot start the server ({shlex.join(self.settings.command)}): {exc}") from None
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise ServerError(f"the server exited with code {code} before it was ready; its log ends:\n"
                                  f"{self.log_tail()}")
            text = self._log_text()
            match = _STARTED_HTTP.search(text)
            if match:
                client = ServerClient(f"127.0.0.1:{match['port']}")
                if client.live():
                    self.client = client
                    grpc = _STARTED_GRPC.search(text)
                    self.grpc_url = f"127.0.0.1:{grpc['port']}" if grpc and grpc["port"] != "0" else None
                    return client
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"the server was not ready after {self.settings.startup_timeout_s:g} s; "
                                  f"its log ends:\n{self.log_tail()}")
            time.sleep(0.05)

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 12) -> str:
        text = self._log_text().strip()
        return "\n".join(text.splitlines()[-lines:]) if text else "(empty log)"

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Session:
    """The server under test, started (or reached) on first use: a sweep whose every point is already in the
    checkpoint re-ranks without any server. Use as a context manager; a started server is stopped at exit."""

    def __init__(self, *, launch: LaunchSettings | None, server_url: str | None = None,
                 server_grpc_url: str | None = None) -> None:
        self.launch, self.server_url, self.server_grpc_url = launch, server_url, server_grpc_url
        self.local: LocalServer | None = None
        self._client: ServerClient | None = None

    @property
    def remote(self) -> bool:
        return self.server_url is not None

    def client(self) -> ServerClient:
        if self._client is None:
            if self.server_url:
                self._client = remote_client(self.server_url)
            else:
                assert self.launch is not None
                self.local = LocalServer(self.launch)
                self._client = self.local.start()
        return self._client

    @property
    def pid(self) -> int | None:
        return self.local.pid if self.local else None

    def url(self, protocol: str) -> str:
        client = self.client()
        if protocol == "http":
            return client.http_url
        grpc_url = self.server_grpc_url if self.remote else (self.local.grpc_url if self.local else None)
        if not grpc_url:
            raise InputError("--protocol grpc needs the server's gRPC address (--server-grpc-url with --server-url)")
        return grpc_url

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.local is not None:
            self.local.stop()


def remote_client(url: str) -> ServerClient:
    """A client for ``--server-url``; the server must be live now."""
    client = ServerClient(url, timeout=60.0)
    if not client.live():
        raise ServerError(f"no live server at {url} (GET /v2/health/live failed); start it with "
                          "--model-control-mode=explicit or let ferry-analyzer start one (omit --server-url)")
    return client


def server_extra_args(values: Sequence[str]) -> tuple[str, ...]:
    """``--server-arg`` values as given (each one flag, e.g. ``--log-verbose=1``)."""
    for value in values:
        if not value.startswith("--"):
            raise InputError(f"invalid --server-arg {value!r}: pass one ferry-server flag, e.g. --log-verbose=1")
    return tuple(values)
