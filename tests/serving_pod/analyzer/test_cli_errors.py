"""Acceptance 4: bad inputs end with one clear error line and an exit code, never a traceback."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

from serving_pod.analyzer.cli import main
from support.server import DEFAULT_MODELS

pytestmark = pytest.mark.timeout(120)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def profile_args(tmp_path: Path, *extra: str, models: str = "mlp_onnx") -> list[str]:
    return ["profile", "--model-repository", str(DEFAULT_MODELS), "--profile-models", models,
            "--checkpoint-directory", str(tmp_path / "ck"), "--output-model-repository", str(tmp_path / "out"),
            "--no-progress", *extra]


@pytest.mark.parametrize(("extra", "message"), [
    (("--concurrency", "0"), "invalid --concurrency 0: must be >= 1"),
    (("--concurrency", "8..2"), "invalid --concurrency range '8..2': start 8 is above end 2"),
    (("--delays-us", "100,-5"), "invalid --delays-us -5: must be >= 0"),
    (("--max-batch-sizes", "big"), "invalid --max-batch-sizes 'big': not an integer"),
    (("--dynamic-batching", "maybe"), "invalid --dynamic-batching 'maybe'"),
    (("--preferred-batch-sizes", "max,all"), "invalid --preferred-batch-sizes 'max,all'"),
    (("--weights", "speed=2"), "invalid --weights 'speed=2'"),
    (("--measurement-interval-ms", "50"), "invalid --measurement-interval-ms 50: must be >= 100"),
    (("--max-trials", "2"), "invalid --max-trials 2"),
    (("--server-arg", "verbose"), "invalid --server-arg 'verbose'"),
    (("--server-http-port", "70000"), "invalid --server-http-port 70000"),
    (("--client-cpus", "x"), "invalid --client-cpus: invalid CPU list 'x'"),
    (("--client-cpus", "4096"), "invalid --client-cpus: CPU(s) [4096] not available here (this process may use"),
    (("--load-generator", "builtin", "--client-cpus", "0"),
     "--client-cpus needs perf_analyzer: the built-in load generator runs inside the analyzer's own process"),
])
def test_invalid_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                        message: str) -> None:
    code, err = run(capsys, *profile_args(tmp_path, *extra))
    assert code == 2
    assert f"ferry-analyzer: error: {message}" in err
    assert not (tmp_path / "ck").exists()  # rejected before anything ran


@pytest.mark.parametrize(("extra", "message"), [
    (("--max-instance-count", "0"), "--max-instance-count: must be >= 1, got 0"),
    (("--latency-budget-ms", "-3"), "--latency-budget-ms: must be a positive number, got '-3'"),
    (("--objective", "cheapest"), "--objective: invalid choice: 'cheapest'"),
    (("--run-config-search-mode", "random"), "--run-config-search-mode: invalid choice: 'random'"),
])
def test_invalid_flags_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        extra: tuple[str, ...], message: str) -> None:
    code, err = run(capsys, *profile_args(tmp_path, *extra))
    assert code == 2 and message in err


def test_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, *profile_args(tmp_path, models="mlp_onnx,no_such_model"))
    assert code == 2
    assert "error: unknown model 'no_such_model': not in" in err and "available: " in err and "mlp_onnx" in err


def test_missing_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = profile_args(tmp_path)
    args[args.index("--model-repository") + 1] = str(tmp_path / "nowhere")
    code, err = run(capsys, *args)
    assert code == 2 and "is not a directory" in err


def test_output_repository_is_protected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out" / "mlp_onnx").mkdir(parents=True)
    code, err = run(capsys, *profile_args(tmp_path))
    assert code == 2 and "pass --override-output-model-repository" in err
    same = profile_args(tmp_path)
    same[same.index("--output-model-repository") + 1] = str(DEFAULT_MODELS)
    code, err = run(capsys, *same)
    assert code == 2 and "must differ from --model-repository" in err


def test_server_that_fails_to_start_port_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(capsys, *profile_args(tmp_path, "--server-http-port", str(port)))
    assert code == 1
    assert "error: the server exited with code 1 before it was ready" in err
    assert "Address already in use" in err or "address already in use" in err.lower()


def test_server_that_rejects_its_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, *profile_args(tmp_path, "--server-arg=--no-such-flag=1"))
    assert code == 1
    assert "the server exited with code 2 before it was ready" in err and "--no-such-flag" in err


def test_server_command_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, *profile_args(tmp_path, "--server-command", str(tmp_path / "no-ferry-server")))
    assert code == 1 and "cannot start the server" in err and "No such file" in err


def test_server_that_never_becomes_ready(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    silent = f"{sys.executable} -c 'import time; time.sleep(30)'"  # takes the flags, never serves
    code, err = run(capsys, *profile_args(tmp_path, "--server-command", silent, "--server-startup-timeout-s", "1"))
    assert code == 1 and "the server was not ready after 1 s" in err


def test_unreachable_remote_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    code, err = run(capsys, *profile_args(tmp_path, "--server-url", f"127.0.0.1:{port}"))
    assert code == 1 and f"no live server at 127.0.0.1:{port}" in err


def test_report_without_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "report", "--checkpoint-directory", str(tmp_path), "--output", str(tmp_path / "r.html"))
    assert code == 2 and "no checkpoint in" in err and "run `ferry-analyzer profile` first" in err


def test_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([])
    captured = capsys.readouterr()
    assert code == 2 and "{profile,report}" in captured.err


def test_model_the_server_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(DEFAULT_MODELS / "mlp_onnx", repo / "mlp_onnx")
    config = repo / "mlp_onnx" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "INPUT0"', 'name: "NOT_AN_INPUT"'))
    args = profile_args(tmp_path, "--load-generator", "builtin")
    args[args.index("--model-repository") + 1] = str(repo)
    code, err = run(capsys, *args)
    assert code == 1
    assert "error: model 'mlp_onnx' does not load with its own configuration: server refused to load" in err
    assert "NOT_AN_INPUT" in err
