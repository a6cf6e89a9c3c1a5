"""The socket-free HTTP path harness (benchmarks/http_path.py): it drives the real engine and connection
protocol, reports a figure for each variant, refuses bad arguments, and stops on a response that is not 200."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
import uvloop

from benchmarks import http_path, servers


def test_every_variant_gets_a_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert http_path.main(["--models", "mlp_onnx,double_py", "--connections", "4", "--requests", "64"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    labels = [" ".join(row[:-3]) for row in rows]
    assert labels == ["mlp_onnx batched", "mlp_onnx unbatched", "double_py"]
    for row in rows:
        assert row[-3:-1] == ["4", "64"] and math.isfinite(float(row[-1])) and float(row[-1]) > 0


def test_a_request_the_model_refuses_stops_the_run(tmp_path: Path) -> None:
    shutil.copytree(servers.BENCH_MODELS / "double_py", tmp_path / "double_py")
    wrong = http_path.infer_request("double_py", "NOT_AN_INPUT", 16, "OUTPUT0")
    with pytest.raises(RuntimeError, match=r"model 'double_py' answered HTTP/1.1 400 Bad Request: .*unexpected inference input 'NOT_AN_INPUT'"):
        uvloop.run(http_path.measure(tmp_path, "double_py", wrong, 2, 4))


@pytest.mark.parametrize("argv, message", [
    (["--models", "resnet"], r"unknown model\(s\) \['resnet'\]"),
    (["--connections", "0"], "--connections must be >= 1"),
    (["--connections", "8", "--requests", "4"], "--requests >= --connections"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        http_path.parse_args(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
