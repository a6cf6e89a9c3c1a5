"""Pure parts of the tool installers (tests/support/perf_analyzer.py, tests/support/triton.py); no downloads."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from support import perf_analyzer, triton


def test_prepend_env_path_puts_dirs_first_without_duplicates() -> None:
    env = perf_analyzer.prepend_env_path({"LD_LIBRARY_PATH": "/b:/a", "X": "1"}, "LD_LIBRARY_PATH",
                                         [Path("/a"), "/c"])
    assert env == {"LD_LIBRARY_PATH": "/a:/c:/b", "X": "1"}
    assert perf_analyzer.prepend_env_path({}, "P", ["/x"]) == {"P": "/x"}


def test_located_command_and_missing_tool() -> None:
    ok = perf_analyzer.Located(Path("/bin/tool"), args=("--fixed",))
    assert ok.ok and ok.command("-x") == ["/bin/tool", "--fixed", "-x"]
    missing = perf_analyzer.Located(None, "no wheel for this platform")
    assert not missing.ok
    with pytest.raises(RuntimeError, match="no wheel for this platform"):
        missing.command()


def test_extract_wheel_takes_only_the_prefix_and_replaces_atomically(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        info = zipfile.ZipInfo("pkg/bin/tool")
        info.external_attr = 0o755 << 16
        archive.writestr(info, b"#!/bin/sh\n")
        archive.writestr("other/file", b"x")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "stale").write_text("old")
    perf_analyzer.extract_wheel(wheel, ["pkg/"], dest)
    assert (dest / "pkg" / "bin" / "tool").stat().st_mode & 0o111
    assert not (dest / "other").exists() and not (dest / "stale").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out.")] == []  # no temp dir left
    with pytest.raises(perf_analyzer.InstallError, match=r"has no member under \['nothing/'\]"):
        perf_analyzer.extract_wheel(wheel, ["nothing/"], tmp_path / "out2")


def test_run_step_failure_quotes_the_output() -> None:
    with pytest.raises(perf_analyzer.InstallError, match=r"step failed \(exit 3\): boom"):
        perf_analyzer.run_step([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
                               what="step")
    with pytest.raises(perf_analyzer.InstallError, match="not found"):
        perf_analyzer.run_step(["/nonexistent/tool"], what="tool")


def test_triton_stub_for_this_python_is_installed_or_explained(tmp_path: Path) -> None:
    root = tmp_path / "tritonserver"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").write_bytes(b"")
    (root / "backends" / "python").mkdir(parents=True)
    (root / "python_backend_stubs" / "3.1").mkdir(parents=True)
    with pytest.raises(perf_analyzer.InstallError, match=r"no python backend stub for Python 3\.\d+ \(has \['3\.1'\]\)"):
        triton._install_stub(root)
    here = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    here.mkdir()
    (here / "triton_python_backend_stub").write_bytes(b"stub")
    triton._install_stub(root)
    installed = root / "backends" / "python" / "triton_python_backend_stub"
    assert installed.read_bytes() == b"stub" and installed.stat().st_mode & 0o111


def test_triton_args_use_explicit_model_control() -> None:
    args = triton.triton_args(["/repo"], ["double_py"], http_port=1, grpc_port=2, metrics_port=3)
    assert "--model-control-mode=explicit" in args and "--load-model=double_py" in args
    assert {"--http-port=1", "--grpc-port=2", "--metrics-port=3", "--model-repository=/repo"} <= set(args)


@pytest.mark.parametrize(("source", "expected"), [
    ("import numpy as np\n", "SHIM\nimport numpy as np\n"),
    ('"""doc"""\nfrom __future__ import annotations\nimport numpy\n',
     '"""doc"""\nfrom __future__ import annotations\nSHIM\nimport numpy\n'),
])
def test_the_stubs_numpy_comes_first_after_future_imports(source: str, expected: str) -> None:
    assert triton._with_shim(source, "SHIM\n") == expected
