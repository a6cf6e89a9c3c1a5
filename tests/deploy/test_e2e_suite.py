"""The kind e2e suite (e2e/) is well-formed even where it cannot run.

Here (no docker engine, no kind) it must be collected, skipped with a reason naming what is
missing, never run by the default `pytest` invocation, and e2e/run.sh must be valid bash (and
shellcheck-clean when shellcheck is installed) and refuse to start without its tools.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "e2e"
RUN_SH = E2E / "run.sh"
FEATURES = {"e2e_install", "e2e_infer", "e2e_canary", "e2e_autoscale", "e2e_cleanup"}


def _markers(module: ast.Module) -> set[str]:
    """Names used as pytest.mark.<name> in the module-level `pytestmark`."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    names.add(sub.attr)
    return names


def _e2e_tests() -> dict[Path, list[str]]:
    tests: dict[Path, list[str]] = {}
    for path in sorted(E2E.glob("test_*.py")):
        module = ast.parse(path.read_text())
        tests[path] = [n.name for n in module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return tests


def _pytest(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.pop("FERRY_E2E_CONTEXT", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "pytest", str(E2E), "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_every_e2e_module_has_the_e2e_marker_and_one_feature_marker() -> None:
    tests = _e2e_tests()
    assert set(p.stem for p in tests) >= {"test_install", "test_inference", "test_canary", "test_autoscaling", "test_cleanup"}
    seen: set[str] = set()
    for path in tests:
        markers = _markers(ast.parse(path.read_text()))
        assert "e2e" in markers, f"{path.name} lacks pytest.mark.e2e"
        features = markers & FEATURES
        assert len(features) == 1, f"{path.name} feature markers: {features}"
        seen |= features
    assert seen == FEATURES


def test_suite_is_collected_and_skipped_here_with_the_reason() -> None:
    expected = sum(len(names) for names in _e2e_tests().values())
    assert expected >= 9
    proc = _pytest("-m", "e2e", "-o", "addopts=", "-rs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(rf"\b{expected} skipped\b", proc.stdout), proc.stdout
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons, proc.stdout
    # here: no kind (and no docker engine); a laptop with the tools but no cluster: run.sh's variable
    pattern = r"missing on PATH: [a-z, ]+$|running docker engine|FERRY_E2E_CONTEXT is unset: run the suite through e2e/run.sh"
    assert all(re.search(pattern, line) for line in reasons), reasons


def test_skip_reason_names_every_missing_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e import conftest

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no tool at all
    assert conftest.skip_reason() == "e2e needs docker, kind, kubectl, helm; missing on PATH: docker, kind, kubectl, helm"


def test_default_run_deselects_e2e() -> None:
    expected = sum(len(names) for names in _e2e_tests().values())
    proc = _pytest()  # the project's addopts: -m 'not slow and not e2e and not gpu'
    assert proc.returncode == 5, proc.stdout  # "no tests ran": all deselected
    assert f"{expected} deselected" in proc.stdout


def test_run_sh_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n", str(RUN_SH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(RUN_SH, os.X_OK), "e2e/run.sh must be executable"


def test_run_sh_passes_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    proc = subprocess.run(["shellcheck", "--severity=style", str(RUN_SH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_run_sh_refuses_to_start_without_its_tools(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname",):  # what the script needs before it checks for its tools
        os.symlink(shutil.which(tool) or f"/usr/bin/{tool}", bin_dir / tool)
    proc = subprocess.run([shutil.which("bash") or "/bin/bash", str(RUN_SH)], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, timeout=30)
    assert proc.returncode == 2
    assert "docker is not installed" in proc.stderr
