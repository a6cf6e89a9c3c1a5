"""Install and locate NVIDIA Triton 2.51 (CPU, python backend) — the side-by-side anchor for benchmarks.

Triton comes from the ``nvidia-pytriton==0.7.0`` wheel, downloaded with ``--no-deps`` and unzipped into
``.tools/`` (never pip-installed). Layout kept as in the wheel so the binaries' RPATHs find
``nvidia_pytriton.libs``: ``pytriton/tritonserver/bin/tritonserver`` and ``backends/python/``, into which the
python backend stub for *this* interpreter is copied. The stub embeds libpython, so ``LD_LIBRARY_PATH`` starts
with this interpreter's ``LIBDIR`` (else the system libpython is picked and the stub fails). Triton exits when
any model fails to load: start it with ``--model-control-mode=explicit --load-model=NAME`` (:func:`triton_args`).
Shared install helpers live in ``perf_analyzer.py``.

numpy: the 2.51 stub is built against numpy 1. Under numpy 2 (this project's) a python model's output tensors
reach the server empty: every answer has ``binary_data_size: 0``, so Triton did less work than the model asks
for and answered wrongly. The stub starts Python in isolated mode (no ``PYTHONPATH``, no user site), so
:func:`triton_repositories` hands Triton copies of the repositories whose python ``model.py`` files first put
``numpy==1.26.4`` (unzipped into ``.tools/``) on ``sys.path``; the models are otherwise the same files.

Live Triton only in slow tests: tests/conftest.py calls :func:`forbid_live_triton` around every test not marked
``slow``, and :func:`running_triton` then refuses to start, as does :func:`cached_triton` (so :func:`triton_or_skip`
and the tests' own launchers too): the default suite compares with recorded answers and never installs Triton.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from .perf_analyzer import (
    InstallError,
    Located,
    extract_wheel,
    locked,
    pip_download,
    prepend_env_path,
    tools_dir,
)

TRITON_VERSION = "2.51.0"
PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"
STUB_NUMPY_REQUIREMENT = "numpy==1.26.4"  # the stub's numpy (module docstring)
_PREFIXES = ("pytriton/tritonserver/", "nvidia_pytriton.libs/")
_STUB = "triton_python_backend_stub"

#: the node id of the running test that may not start a live Triton (not marked slow); None: allowed
_live_forbidden_in: str | None = None


class LiveTritonForbidden(RuntimeError):
    """:func:`running_triton` or :func:`cached_triton` called from a default-suite test (one not marked ``slow``)."""


def forbid_live_triton(test: str | None) -> None:
    """Forbid :func:`running_triton` and :func:`cached_triton` while ``test`` (a pytest node id) runs; ``None``
    allows them again."""
    global _live_forbidden_in
    _live_forbidden_in = test


def _refuse_in_default_suite() -> None:
    if _live_forbidden_in is not None:
        raise LiveTritonForbidden(f"live Triton in a default-suite test ({_live_forbidden_in}): mark it "
                                  "@pytest.mark.slow and compare against recorded answers")


def _python_libdir() -> Path:
    """The directory holding this interpreter's shared libpython (the stub must load exactly this one)."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise InstallError(f"{sys.executable} has no shared libpython (built without --enable-shared); "
                           "Triton's python backend stub needs one")
    libdir = Path(str(sysconfig.get_config_var("LIBDIR")))
    soname = str(sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY"))
    if not (libdir / soname).exists():
        raise InstallError(f"shared libpython {libdir / soname} not found")
    return libdir


def _unpack(tools: Path) -> Path:
    home = tools / f"triton-{TRITON_VERSION}"
    if not (home / "pytriton" / "tritonserver" / "bin" / "tritonserver").exists():
        wheel = pip_download(PYTRITON_REQUIREMENT, tools / "wheels")
        extract_wheel(wheel, _PREFIXES, home)
    return home / "pytriton" / "tritonserver"


def _install_stub(root: Path) -> None:
    """Copy the stub built for this Python into ``backends/python/`` (re-copied when the Python changes)."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / py / _STUB
    if not source.exists():
        have = sorted(p.name for p in (root / "python_backend_stubs").iterdir())
        raise InstallError(f"{PYTRITON_REQUIREMENT} has no python backend stub for Python {py} (has {have})")
    target = root / "backends" / "python" / _STUB
    if not target.exists() or target.read_bytes() != source.read_bytes():
        shutil.copyfile(source, target)
    target.chmod(0o755)
    (root / "bin" / "tritonserver").chmod(0o755)


def _stub_numpy(tools: Path) -> Path:
    """numpy 1 for the stub (module docstring), unzipped from its wheel into ``tools``; the directory to import from."""
    home = tools / f"triton-{TRITON_VERSION}-numpy1"
    if not (home / "numpy" / "__init__.py").exists():
        wheel = pip_download(STUB_NUMPY_REQUIREMENT, tools / "wheels")
        extract_wheel(wheel, ("numpy/", "numpy.libs/"), home)
    return home


def _shim(numpy_dir: Path) -> str:
    return f"import sys; sys.path.insert(0, {str(numpy_dir)!r})  # Triton 2.51's stub needs numpy 1 (tests/support/triton.py)\n"


def _with_shim(source: str, shim: str) -> str:
    """``shim`` as the first statement after any ``from __future__`` imports (which must come first)."""
    lines = source.splitlines(keepends=True)
    at = max((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")), default=0)
    return "".join(lines[:at]) + shim + "".join(lines[at:])


def triton_repositories(repositories: Sequence[Path | str], tools: Path | None = None) -> list[Path]:
    """Copies of ``repositories`` for Triton (kept under ``tools``, made again when a source changes) in which every
    python model's ``model.py`` starts by putting the stub's numpy 1 on ``sys.path`` (module docstring)."""
    tools = tools or tools_dir()
    with locked(tools):
        numpy_dir = _stub_numpy(tools)
    shim = _shim(numpy_dir)
    copies = []
    for source in map(Path, repositories):
        source = source.resolve()
        target = tools / "triton-repositories" / source.as_posix().strip("/").replace("/", "_")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        for model_py in target.glob("*/*/model.py"):
            model_py.write_text(_with_shim(model_py.read_text(), shim))
        copies.append(target)
    return copies


def ensure_triton(tools: Path | None = None) -> Located:
    """Install (once) and verify Triton; ``command()`` already carries ``--backend-directory`` and
    ``--cache-directory`` (so ``--cache-config local,size=<bytes>`` finds the wheel's local cache)."""
    tools = tools or tools_dir()
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return Located(None, f"Triton {TRITON_VERSION} from {PYTRITON_REQUIREMENT} needs Linux x86_64")
    try:
        libdir = _python_libdir()
        with locked(tools):
            root = _unpack(tools)
            _install_stub(root)
            _stub_numpy(tools)
    except (InstallError, OSError, zipfile.BadZipFile) as exc:
        return Located(None, f"cannot install Triton {TRITON_VERSION}: {exc}")
    env = prepend_env_path(os.environ, "LD_LIBRARY_PATH", [libdir])
    if sys.prefix != sys.base_prefix:  # a venv: the stub's embedded interpreter must still see its packages
        env = prepend_env_path(env, "PYTHONPATH", site.getsitepackages())
    server = root / "bin" / "tritonserver"
    try:  # `--help` exits 1 after printing usage; a missing library fails before that
        proc = subprocess.run([str(server), "--help"], capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Located(None, f"tritonserver {TRITON_VERSION} does not run here: {exc}")
    if "Usage: tritonserver" not in proc.stdout + proc.stderr:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return Located(None, f"tritonserver {TRITON_VERSION} does not run here (exit {proc.returncode}): {tail}")
    # --cache-directory: the wheel's caches/ (libtritoncache_local.so), else `--cache-config local,...` looks in /opt
    return Located(server, "", env, ("--backend-directory", str(root / "backends"),
                                     "--cache-directory", str(root / "caches")))


@functools.cache
def _ensured_once() -> Located:
    return ensure_triton()


def cached_triton() -> Located:
    """:func:`ensure_triton` once per process; refused in a default-suite test (module docstring)."""
    _refuse_in_default_suite()
    return _ensured_once()


def triton_or_skip() -> Located:
    """For tests: the located Triton, or ``pytest.skip`` with the installer's reason."""
    import pytest

    located = cached_triton()
    if not located.ok:
        pytest.skip(located.reason)
    return located


def triton_args(model_repositories: Sequence[Path | str], load_models: Sequence[str], *, http_port: int,
                grpc_port: int, metrics_port: int) -> list[str]:
    """tritonserver flags for explicit model control on the given ports (CPU only, quiet)."""
    args = [f"--model-repository={repo}" for repo in model_repositories]
    args += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in load_models),
             f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
             "--allow-gpu-metrics=false", "--log-verbose=0"]
    return args


@contextlib.contextmanager
def running_triton(repository: Path | str, models: Sequence[str], *flags: str) -> Iterator[tuple[int, int, int]]:
    """For tests: Triton serving ``models`` of ``repository`` with ``flags``, ready; yields its (http, grpc,
    metrics) ports and kills it after. Skips (``triton_or_skip``) where Triton cannot be had; refuses (before that
    skip, so that it shows where Triton is missing too) in a test that :func:`forbid_live_triton` names."""
    from .server import free_ports, kill_process_group, wait_ready

    _refuse_in_default_suite()
    triton = triton_or_skip()
    http, grpc, metrics = free_ports(3)
    args = triton_args(triton_repositories([repository]), models, http_port=http, grpc_port=grpc, metrics_port=metrics)
    proc = subprocess.Popen(triton.command(*args, "--exit-timeout-secs=2", *flags), env=triton.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(http, proc, timeout=60)
        yield http, grpc, metrics
    finally:
        kill_process_group(proc)

