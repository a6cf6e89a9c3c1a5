"""Dockerfile.server and Dockerfile.operator, checked without a Docker engine.

No image can be built here, so the Dockerfiles are parsed: every COPY source must exist in the
tree and survive .dockerignore, ENTRYPOINT must be a console script of pyproject.toml whose target
function exists, the final USER must be non-root, the base pinned, a HEALTHCHECK must probe the
endpoint the chart and the server really serve, and the operator image must carry every
third-party package the operator imports.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERFILES = ["Dockerfile.server", "Dockerfile.operator"]


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    if pending:
        raise ValueError(f"dangling line continuation: {pending!r}")
    return instructions


def _load(name: str) -> list[Instruction]:
    return parse((ROOT / name).read_text())


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.replace("**/", "")) or rel.startswith(pat.rstrip("/") + "/"):
            ignored = not negate
    return ignored


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instruction
    return value


def _console_script_target(script: str) -> tuple[Path, str]:
    scripts = PYPROJECT["project"]["scripts"]
    assert script in scripts, f"{script} is not a console script of pyproject.toml ({sorted(scripts)})"
    module, _, func = scripts[script].partition(":")
    package_dirs = PYPROJECT.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    top, *rest = module.split(".")
    base = ROOT / package_dirs.get(top, top)
    path = base.joinpath(*rest).with_suffix(".py") if rest else base / "__init__.py"
    return path, func


def test_parse_joins_continuations_and_rejects_dangling() -> None:
    assert parse("FROM a\n# c\nRUN x \\\n  # inner\n  && y\n") == [
        Instruction("FROM", "a"), Instruction("RUN", "x && y")]
    with pytest.raises(ValueError, match="dangling"):
        parse("RUN x \\\n")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_and_are_not_dockerignored(name: str) -> None:
    patterns = _dockerignore()
    copies = [i for i in _load(name) if i.keyword in ("COPY", "ADD")]
    assert copies
    for instruction in copies:
        parts = shlex.split(instruction.args)
        if any(p.startswith("--from=") for p in parts):
            continue
        sources = [p for p in parts if not p.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist in the repository"
            assert not _ignored(source, patterns), f"{name}: COPY {source} is excluded by .dockerignore"


def test_dockerignore_rule_is_last_match_wins() -> None:
    assert _ignored("notes.md", ["*.md", "!README.md"])
    assert not _ignored("README.md", ["*.md", "!README.md"])
    assert _ignored("tests/deploy/x.py", ["tests"])


@pytest.mark.parametrize(("name", "script"), [("Dockerfile.server", "ferry-server"),
                                              ("Dockerfile.operator", "ferry-operator")])
def test_entrypoint_is_an_existing_console_script(name: str, script: str) -> None:
    instructions = _load(name)
    (entrypoint,) = [i for i in instructions if i.keyword == "ENTRYPOINT"]
    assert _exec_form(entrypoint) == [script]
    path, func = _console_script_target(script)
    assert path.exists(), f"{script} -> {path.relative_to(ROOT)} does not exist (yet)"
    defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert func in defined, f"{path.relative_to(ROOT)} defines no {func}()"


@pytest.mark.parametrize(("name", "parser"), [
    ("Dockerfile.server", "serving_pod.cli:build_parser"),
    ("Dockerfile.operator", "ferry_operator.main:_parser"),
])
def test_default_cmd_is_accepted_by_the_real_command_line(name: str, parser: str) -> None:
    (cmd,) = [i for i in _load(name) if i.keyword == "CMD"]
    module_name, _, func = parser.partition(":")
    module = pytest.importorskip(module_name)
    args = getattr(module, func)().parse_args(_exec_form(cmd))
    if name == "Dockerfile.server":
        assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 8001, 8002)
        assert args.model_repository == []  # the embedded default repository
    with pytest.raises(SystemExit):  # and the parser is strict, so the check can fail
        getattr(module, func)().parse_args(["--no-such-flag"])


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_non_root_from_a_pinned_base(name: str) -> None:
    instructions = _load(name)
    users = [i.args for i in instructions if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), f"{name} must end as a non-root USER"
    assert re.fullmatch(r"\d+:\d+", users[-1]), "numeric uid:gid so runAsNonRoot can verify it"
    (arg,) = [i.args for i in instructions if i.keyword == "ARG" and i.args.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", arg), arg
    assert all(i.args.split()[0] in ("${PYTHON_IMAGE}",) for i in instructions if i.keyword == "FROM")


@pytest.mark.parametrize(("name", "url"), [
    ("Dockerfile.server", "http://127.0.0.1:8000/v2/health/live"),
    ("Dockerfile.operator", "http://127.0.0.1:8080/healthz"),
])
def test_healthcheck_probes_the_served_endpoint(name: str, url: str) -> None:
    (health,) = [i for i in _load(name) if i.keyword == "HEALTHCHECK"]
    assert url in health.args
    assert "--start-period=" in health.args


def test_server_image_exposes_triton_ports_and_has_a_gpu_variant() -> None:
    instructions = _load("Dockerfile.server")
    exposed = {p for i in instructions if i.keyword == "EXPOSE" for p in i.args.split()}
    assert exposed == {"8000", "8001", "8002"}
    run = " ".join(i.args for i in instructions if i.keyword == "RUN")
    assert '".[gpu]"' in run and "onnxruntime-gpu" in run
    gpu_extra = " ".join(PYPROJECT["project"]["optional-dependencies"]["gpu"])
    assert "onnxruntime-gpu" in gpu_extra and "tensorrt" in gpu_extra
    # the storage initializer is the same console script: the build proves it runs
    assert "ferry-server download --help" in run


def _distribution_closure(requirements: list[str]) -> set[str]:
    """Installed distributions reachable from `requirements` (names normalised)."""
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    todo = [re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in requirements]
    seen: set[str] = set()
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.split(r"[<>=!~\[; (]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen


def test_operator_image_installs_every_operator_import() -> None:
    package = ROOT / "operator" / "ferry_operator"
    if not package.exists():
        pytest.fail("operator/ferry_operator does not exist (yet)")
    (arg,) = [i.args for i in _load("Dockerfile.operator") if i.keyword == "ARG" and i.args.startswith("OPERATOR_REQUIREMENTS=")]
    installed = _distribution_closure(shlex.split(arg.partition("=")[2])[0].split())
    local = {"ferry_operator", "serving_pod"}
    modules: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = sorted(m for m in modules - local - set(sys.stdlib_module_names))
    owners = metadata.packages_distributions()
    missing = [m for m in third_party
               if not any(re.sub(r"[-_.]+", "-", d).lower() in installed for d in owners.get(m, [m]))]
    assert missing == [], f"Dockerfile.operator OPERATOR_REQUIREMENTS lacks the packages providing {missing}"


def test_server_cli_has_the_storage_initializer_subcommand() -> None:
    try:
        import serving_pod.cli  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"serving_pod.cli is not importable (yet): {exc}")
    code = "import sys; from serving_pod.cli import main; sys.argv = ['ferry-server', 'download', '--help']; main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower()
