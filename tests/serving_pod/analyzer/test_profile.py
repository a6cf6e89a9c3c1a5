"""Real sweeps, kept tiny: ``ferry-analyzer profile`` against a ``ferry-server`` it starts itself.

One brute sweep of the ONNX MLP (2 configurations x 2 concurrencies, perf_analyzer when it can be had,
otherwise the built-in generator) is shared by the module; the latency-budget tests re-rank its
checkpoint (no new measurement), the resume test drops one measurement and checks only that one is
taken again. A quick-mode sweep of the python model runs with the built-in load generator.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from serving_pod.analyzer.checkpoint import FILENAME
from serving_pod.analyzer.cli import main
from serving_pod.analyzer.measure import Measurement
from serving_pod.analyzer.space import ConfigPoint, point_of, read_base_config
from support.perf_analyzer import cached_perf_analyzer
from support.server import DEFAULT_MODELS

pytestmark = pytest.mark.timeout(180)

WINDOW = ("--measurement-interval-ms", "200", "--stability-percentage", "100", "--max-trials", "3")


@dataclass(frozen=True)
class Sweep:
    root: Path
    args: tuple[str, ...]
    code: int
    stdout: str

    @property
    def checkpoint(self) -> dict:
        return json.loads((self.root / "ck" / FILENAME).read_text())

    def measurements(self, model: str = "mlp_onnx") -> list[Measurement]:
        return [Measurement.from_dict(m) for m in self.checkpoint["models"][model]["measurements"]]


def profile(root: Path, *extra: str, models: str = "mlp_onnx", checkpoint: Path | None = None,
            output: Path | None = None) -> tuple[int, str]:
    args = ["profile", "--model-repository", str(DEFAULT_MODELS), "--profile-models", models,
            "--checkpoint-directory", str(checkpoint or root / "ck"),
            "--output-model-repository", str(output or root / "out"), "--no-progress", *WINDOW, *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return code, out.getvalue()


def load_generator_args() -> tuple[str, ...]:
    located = cached_perf_analyzer()
    if located.path is None:
        return ("--load-generator", "builtin")
    return ("--load-generator", "perf_analyzer", "--perf-analyzer", str(located.path))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    root = tmp_path_factory.mktemp("analyzer")
    args = ("--run-config-search-mode", "brute", "--concurrency", "1,4", "--max-instance-count", "1",
            "--max-batch-sizes", "64", "--dynamic-batching", "off", *load_generator_args())
    code, stdout = profile(root, *args)
    return Sweep(root, args, code, stdout)


def test_tiny_sweep_recommends_and_writes_the_config(sweep: Sweep) -> None:
    assert sweep.code == 0, sweep.stdout
    result = sweep.checkpoint["models"]["mlp_onnx"]["result"]
    assert result["default_key"] == "i1-b64-db200"  # the model's own config.pbtxt
    measurements = sweep.measurements()
    assert {(m.config_key, m.concurrency) for m in measurements} == {
        ("i1-b64-db200", 1), ("i1-b64-db200", 4), ("i1-b64-nodb", 1), ("i1-b64-nodb", 4)}
    for m in measurements:
        assert m.ok, m.error
        assert m.throughput > 0 and m.p99_ms > 0
        assert m.compute_us and m.compute_us > 0 and m.queue_us is not None  # statistics extension deltas
        assert m.rss_mb and m.rss_mb > 20 and m.cpu_percent is not None  # psutil on the server pid
    best = max(measurements, key=lambda m: m.throughput)
    assert result["recommended"] == {"config_key": best.config_key, "concurrency": best.concurrency}
    written = read_base_config(sweep.root / "out" / "mlp_onnx", "mlp_onnx")
    expected = ConfigPoint.from_dict(sweep.checkpoint["models"]["mlp_onnx"]["configs"][best.config_key]["point"])
    assert point_of(written) == expected
    assert (sweep.root / "out" / "mlp_onnx" / "1" / "model.onnx").is_file()
    assert f"recommended {best.config_key} at concurrency {best.concurrency}" in sweep.stdout


async def test_written_model_loads_in_ferry(sweep: Sweep, server_factory) -> None:
    handle = await server_factory([sweep.root / "out"])
    assert handle.engine.model_ready("mlp_onnx")


def test_latency_budget_is_respected(sweep: Sweep, tmp_path: Path) -> None:
    measurements = sweep.measurements()
    unconstrained = max(measurements, key=lambda m: m.throughput)
    budget = min(m.p99_ms for m in measurements)  # only the lowest-latency point fits
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    code, stdout = profile(tmp_path, *sweep.args, "--latency-budget-ms", f"{budget:.3f}")
    assert code == 0, stdout
    assert "0 measurement(s) taken, 4 reused from the checkpoint" in stdout
    ref = json.loads((tmp_path / "ck" / FILENAME).read_text())["models"]["mlp_onnx"]["result"]["recommended"]
    chosen = next(m for m in measurements if (m.config_key, m.concurrency) == (ref["config_key"], ref["concurrency"]))
    assert chosen.p99_ms <= float(f"{budget:.3f}")
    if unconstrained.p99_ms > budget:
        assert chosen != unconstrained


def test_impossible_budget_says_so(sweep: Sweep, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    code, stdout = profile(tmp_path, *sweep.args, "--latency-budget-ms", "0.001")
    err = capsys.readouterr().err
    assert code == 3
    assert "no configuration of 'mlp_onnx' meets the constraints (p99 <= 0.001 ms); the closest was" in stdout
    assert "ferry-analyzer: error: no configuration meets the constraints for mlp_onnx" in err
    assert not (tmp_path / "out" / "mlp_onnx").exists()


def test_interrupted_sweep_resumes(sweep: Sweep, tmp_path: Path) -> None:
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    path = tmp_path / "ck" / FILENAME
    data = json.loads(path.read_text())
    dropped = data["models"]["mlp_onnx"]["measurements"].pop()
    data["models"]["mlp_onnx"]["result"] = None  # as if killed before the end
    path.write_text(json.dumps(data))
    code, stdout = profile(tmp_path, *sweep.args)
    assert code == 0, stdout
    assert "1 measurement(s) taken, 3 reused from the checkpoint" in stdout
    again = json.loads(path.read_text())["models"]["mlp_onnx"]["measurements"]
    assert len(again) == 4
    assert (again[-1]["config_key"], again[-1]["concurrency"]) == (dropped["config_key"], dropped["concurrency"])


def test_quick_sweep_of_a_python_model_with_the_builtin_generator(tmp_path: Path) -> None:
    code, stdout = profile(tmp_path, "--run-config-search-mode", "quick", "--concurrency", "1..2",
                           "--max-instance-count", "2", "--max-batch-sizes", "64", "--delays-us", "100",
                           "--preferred-batch-sizes", "none", "--load-generator", "builtin", models="double_py")
    assert code == 0, stdout
    data = json.loads((tmp_path / "ck" / FILENAME).read_text())
    assert data["settings"]["load_generator"] == "builtin"
    keys = {m["config_key"] for m in data["models"]["double_py"]["measurements"]}
    # the default, then one step along each dimension that has another value
    assert {"i1-b64-db100", "i2-b64-db100", "i1-b64-nodb"} <= keys
    assert (tmp_path / "out" / "double_py" / "1" / "model.py").is_file()
