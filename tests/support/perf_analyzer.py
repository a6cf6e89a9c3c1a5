"""Install and locate perf_analyzer 2.50, Triton's C++ load generator, for tests and benchmarks.

The binary is taken from the ``tritonclient==2.50.0`` wheel (newer wheels need glibc 2.38). It links
``libb64.so.0d`` (Debian ``libb64-0d``) and ``libcudart.so.12`` (PyPI ``nvidia-cuda-runtime-cu12``, no GPU
needed). Downloads are cached under ``<repo>/.tools/`` and guarded by a file lock, so parallel test workers
install once. Installers never raise: they return :class:`Located` with ``path=None`` and a human reason.
The shared helpers here (tools dir, lock, pip download, wheel extraction) are reused by ``triton.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PERF_ANALYZER_VERSION = "2.50.0"
CUDART_REQUIREMENT = "nvidia-cuda-runtime-cu12==12.9.79"
LIBB64_SONAME = "libb64.so.0d"
_MEMBER = f"tritonclient-{PERF_ANALYZER_VERSION}.data/data/bin/perf_analyzer"
_SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib", "/usr/local/lib")


@dataclass(frozen=True)
class Located:
    """An external tool: ``[path, *args]`` run under ``env``; ``path`` is None when unavailable (see ``reason``)."""

    path: Path | None
    reason: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.path is not None

    def command(self, *extra: str) -> list[str]:
        if self.path is None:
            raise RuntimeError(f"tool unavailable: {self.reason}")
        return [str(self.path), *self.args, *extra]


class InstallError(Exception):
    """A step of an installation failed; the message is meant for a human (and a pytest skip)."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def tools_dir() -> Path:
    """Where downloaded tools live: ``$FERRY_TOOLS_DIR`` or ``<repo>/.tools`` (gitignored)."""
    return Path(os.environ.get("FERRY_TOOLS_DIR") or repo_root() / ".tools")


@contextlib.contextmanager
def locked(tools: Path) -> Iterator[None]:
    """Serialize installers across processes (pytest-xdist workers, benchmark runs)."""
    tools.mkdir(parents=True, exist_ok=True)
    with open(tools / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(cmd: Sequence[str], *, what: str, timeout: float = 600, env: Mapping[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run one installation step; failure becomes an :class:`InstallError` quoting the tail of its output."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, cwd=cwd)
    except FileNotFoundError as exc:
        raise InstallError(f"{what}: {cmd[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{what}: timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise InstallError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc


def pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel without dependencies (never installs it); returns the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    run_step([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--retries", "1",
              "--timeout", "30", "--disable-pip-version-check", "-d", str(dest), requirement],
             what=f"pip download {requirement}")
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('-', '_').lower()}-{version}"
    wheels = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(stem))
    if not wheels:
        raise InstallError(f"pip download {requirement} produced no wheel in {dest}")
    return wheels[-1]


def extract_wheel(wheel: Path, prefixes: Sequence[str], dest: Path) -> None:
    """Unzip the members under ``prefixes`` into ``dest`` atomically (a half-extracted dir never appears)."""
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.infolist() if m.filename.startswith(tuple(prefixes))]
            if not members:
                raise InstallError(f"{wheel.name} has no member under {list(prefixes)}")
            for member in members:
                target = Path(archive.extract(member, tmp))
                if not member.is_dir():
                    mode = (member.external_attr >> 16) & 0o777
                    target.chmod(mode | 0o644 if mode else 0o644)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepend_env_path(env: Mapping[str, str], var: str, dirs: Sequence[Path | str]) -> dict[str, str]:
    """A copy of ``env`` with ``dirs`` put first in the path-list variable ``var``."""
    out = dict(env)
    parts = [str(d) for d in dirs] + [p for p in out.get(var, "").split(os.pathsep) if p]
    out[var] = os.pathsep.join(dict.fromkeys(parts))
    return out


def _perf_binary(tools: Path) -> Path:
    home = tools / f"perf_analyzer-{PERF_ANALYZER_VERSION}"
    binary = home / _MEMBER
    if not binary.exists():
        wheel = pip_download(f"tritonclient=={PERF_ANALYZER_VERSION}", tools / "wheels")
        extract_wheel(wheel, [_MEMBER], home)
    binary.chmod(0o755)
    return binary


def _cudart_dir(tools: Path) -> Path:
    home = tools / "cudart-cu12"
    libdir = home / "nvidia" / "cuda_runtime" / "lib"
    if not (libdir / "libcudart.so.12").exists():
        tmp = Path(tempfile.mkdtemp(prefix="cudart.", dir=tools))
        try:
            run_step([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                      "--target", str(tmp), CUDART_REQUIREMENT], what=f"pip install --target {CUDART_REQUIREMENT}")
            if home.exists():
                shutil.rmtree(home)
            tmp.rename(home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not (libdir / "libcudart.so.12").exists():
        raise InstallError(f"{CUDART_REQUIREMENT} did not provide {libdir}/libcudart.so.12")
    return libdir


def system_has_library(soname: str) -> bool:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
        if f"{soname} " in listing:
            return True
    return any(Path(d, soname).exists() for d in _SYSTEM_LIB_DIRS)


def _libb64_dirs(tools: Path) -> list[Path]:
    """System libb64 if present, else a copy already unpacked into .tools (machines with no network get
    theirs that way); as root apt-get install it; otherwise download and unpack the .deb into .tools."""
    if system_has_library(LIBB64_SONAME):
        return []
    local = tools / "libb64"
    unpacked = sorted(local.glob(f"**/{LIBB64_SONAME}"))
    if unpacked:
        return [unpacked[0].parent]
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if os.geteuid() == 0 and shutil.which("apt-get"):
        install = ["apt-get", "install", "-y", "--no-install-recommends", "libb64-0d"]
        try:
            run_step(install, what="apt-get install libb64-0d", env=apt_env)
        except InstallError:
            run_step(["apt-get", "update"], what="apt-get update", env=apt_env)
            run_step(install, what="apt-get install libb64-0d", env=apt_env)
        if system_has_library(LIBB64_SONAME):
            return []
    local.mkdir(parents=True, exist_ok=True)
    run_step(["apt-get", "download", "libb64-0d"], what="apt-get download libb64-0d", cwd=local)
    debs = sorted(local.glob("libb64-0d_*.deb"))
    if not debs:
        raise InstallError("apt-get download libb64-0d produced no .deb")
    run_step(["dpkg-deb", "-x", str(debs[-1]), str(local / "root")], what="dpkg-deb -x libb64-0d")
    found = sorted(local.glob(f"**/{LIBB64_SONAME}"))
    if not found:
        raise InstallError(f"{LIBB64_SONAME} not found after unpacking libb64-0d")
    return [found[0].parent]


def ensure_perf_analyzer(tools: Path | None = None) -> Located:
    """Install (once) and verify perf_analyzer 2.50; the returned env has ``LD_LIBRARY_PATH`` set."""
    tools = tools or tools_dir()
    if sys.platform != "linux":
        return Located(None, f"perf_analyzer {PERF_ANALYZER_VERSION} is a Linux binary (platform: {sys.platform})")
    try:
        with locked(tools):
            binary = _perf_binary(tools)
            libdirs = [_cudart_dir(tools), *_libb64_dirs(tools)]
    except (InstallError, OSError, zipfile.BadZipFile) as exc:
        return Located(None, f"cannot install perf_analyzer {PERF_ANALYZER_VERSION}: {exc}")
    env = prepend_env_path(os.environ, "LD_LIBRARY_PATH", libdirs)
    try:
        run_step([str(binary), "--version"], what="perf_analyzer --version", env=env, timeout=60)
    except InstallError as exc:
        return Located(None, f"perf_analyzer {PERF_ANALYZER_VERSION} does not run here: {exc}")
    return Located(binary, "", env)


@functools.cache
def cached_perf_analyzer() -> Located:
    """:func:`ensure_perf_analyzer` once per process."""
    return ensure_perf_analyzer()


def check_shared_memory_run(server: Any, protocol: str, kind: str, model: str = "idt") -> None:
    """For tests: perf_analyzer ``--shared-memory <kind>`` (system or cuda) against ``server`` (anything with
    ``http_url``, ``grpc_url`` and ``client``) succeeds and the model counted inferences; skips without it."""
    binary, env = perf_analyzer_cmd()
    url = server.http_url if protocol == "http" else server.grpc_url
    proc = subprocess.run(
        [str(binary), "-m", model, "-u", url, "-i", protocol, "--shared-memory", kind,
         "--output-shared-memory-size", "1024", "-b", "2", "--measurement-interval", "500",
         "--max-trials", "10", "--stability-percentage", "999"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Throughput" in proc.stdout
    stats = server.client("http").get_inference_statistics(model)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) > 0


def perf_analyzer_cmd() -> tuple[Path, dict[str, str]]:
    """For tests: ``(binary, env)`` or ``pytest.skip`` with the installer's reason."""
    import pytest

    located = cached_perf_analyzer()
    if located.path is None:
        pytest.skip(located.reason)
    return located.path, dict(located.env)
