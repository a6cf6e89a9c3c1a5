"""Real sweeps, kept tiny: ``ferry-analyzer profile`` against a ``ferry-server`` it starts itself.

One brute sweep of the ONNX MLP (2 configurations x 2 concurrencies, perf_analyzer when it can be had,
otherwise the built-in generator) is shared by the module; the latency-budget tests re-rank its
checkpoint (no new measurement), the resume test drops one measurement and checks only that one is
taken again. A quick-mode sweep of the python model runs with the built-in load generator.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from serving_pod.analyzer.checkpoint import FILENAME
from serving_pod.analyzer.space import ConfigPoint, point_of, read_base_config
from support.server import DEFAULT_MODELS

pytestmark = pytest.mark.timeout(180)

def test_tiny_sweep_recommends_and_writes_the_config(sweep) -> None:
    assert sweep.code == 0, sweep.stdout
    result = sweep.checkpoint["models"]["mlp_onnx"]["result"]
    assert result["default_key"] == "i1-b64-db200"  # the model's own config.pbtxt
    measurements = sweep.measurements()
    assert {(m.config_key, m.concurrency) for m in measurements if m.trial == 0} == {
        ("i1-b64-db200", 1), ("i1-b64-db200", 4), ("i1-b64-nodb", 1), ("i1-b64-nodb", 4)}
    verified = {(m.config_key, m.concurrency) for m in measurements if m.trial == 1}
    assert 1 <= len(verified) <= 2 and any(key == "i1-b64-db200" for key, _ in verified)  # default included
    for m in measurements:
        assert m.ok, m.error
        assert m.throughput > 0 and m.p99_ms > 0
        assert m.compute_us and m.compute_us > 0 and m.queue_us is not None  # statistics extension deltas
        assert m.rss_mb and m.rss_mb > 20 and m.cpu_percent is not None  # psutil on the server pid
        if m.config_key == "i1-b64-nodb":
            assert m.avg_batch == 1.0  # really unbatched: every execution ran one request
    medians = sweep.medians()
    key, concurrency = max(verified, key=lambda point: medians[point][0])  # best median throughput wins
    assert result["recommended"] == {"config_key": key, "concurrency": concurrency}
    best = next(m for m in measurements if (m.config_key, m.concurrency) == (key, concurrency))
    written = read_base_config(sweep.root / "out" / "mlp_onnx", "mlp_onnx")
    expected = ConfigPoint.from_dict(sweep.checkpoint["models"]["mlp_onnx"]["configs"][best.config_key]["point"])
    assert point_of(written) == expected
    assert (sweep.root / "out" / "mlp_onnx" / "1" / "model.onnx").is_file()
    assert f"recommended {best.config_key} at concurrency {best.concurrency}" in sweep.stdout
    assert "default_served_as" not in result and "note:" not in sweep.stdout  # served as written


def test_unbatched_candidate_the_server_batches_is_refused(tmp_path: Path, run_profile) -> None:
    """With config auto-complete on (the server's default) the "off" candidate comes back with dynamic batching:
    it is recorded as not loaded, with the reason and the flag to use, instead of being measured batched."""
    code, stdout = run_profile(tmp_path, "--run-config-search-mode", "brute", "--concurrency", "1",
                               "--max-instance-count", "1", "--max-batch-sizes", "64", "--dynamic-batching", "off",
                               "--verify-runs", "0", "--load-generator", "builtin")
    assert code == 0, stdout
    data = json.loads((tmp_path / "ck" / FILENAME).read_text())["models"]["mlp_onnx"]
    error = data["configs"]["i1-b64-nodb"]["error"]
    assert "serves 'mlp_onnx' as i1-b64-db0, not i1-b64-nodb" in error
    assert "--disable-auto-complete-config" in error
    assert {m["config_key"] for m in data["measurements"]} == {"i1-b64-db200"}  # nothing measured for "off"
    assert data["result"]["recommended"]["config_key"] == "i1-b64-db200"


def test_own_config_served_otherwise_is_named(tmp_path: Path, run_profile) -> None:
    """A model whose config has no scheduler: the server batches it (auto-complete). The default is measured as
    served, and the result says so instead of calling it unbatched."""
    repo = tmp_path / "repo"
    shutil.copytree(DEFAULT_MODELS / "mlp_onnx", repo / "mlp_onnx")
    config = repo / "mlp_onnx" / "config.pbtxt"
    config.write_text(re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config.read_text()))
    assert "dynamic_batching" not in config.read_text()
    code, stdout = run_profile(tmp_path, "--model-repository", str(repo), "--run-config-search-mode", "brute",
                               "--concurrency", "1", "--max-instance-count", "1", "--max-batch-sizes", "64",
                               "--dynamic-batching", "off", "--verify-runs", "0", "--load-generator", "builtin")
    assert code == 0, stdout
    result = json.loads((tmp_path / "ck" / FILENAME).read_text())["models"]["mlp_onnx"]["result"]
    assert result["default_key"] == "i1-b64-nodb" and result["default_served_as"] == "i1-b64-db0"
    assert "the server serves the model's own config (i1-b64-nodb) as i1-b64-db0 (config auto-complete)" in stdout


async def test_written_model_loads_in_ferry(sweep, server_factory) -> None:
    handle = await server_factory([sweep.root / "out"])
    assert handle.engine.model_ready("mlp_onnx")


def test_latency_budget_is_respected(sweep, tmp_path: Path, run_profile) -> None:
    medians = sweep.medians()
    unconstrained = sweep.checkpoint["models"]["mlp_onnx"]["result"]["recommended"]
    budget = math.ceil(min(p99 for _, p99, _ in medians.values()) * 1000) / 1000  # only the lowest-latency point fits
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    code, stdout = run_profile(tmp_path, *sweep.args, "--latency-budget-ms", f"{budget:.3f}", "--verify-runs", "0")
    assert code == 0, stdout
    assert "0 measurement(s) taken" in stdout  # re-ranked from the checkpoint, no server needed
    ref = json.loads((tmp_path / "ck" / FILENAME).read_text())["models"]["mlp_onnx"]["result"]["recommended"]
    chosen = (ref["config_key"], ref["concurrency"])
    assert medians[chosen][1] <= budget
    if medians[(unconstrained["config_key"], unconstrained["concurrency"])][1] > budget:
        assert ref != unconstrained


def test_impossible_budget_says_so(sweep, tmp_path: Path, run_profile, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    code, stdout = run_profile(tmp_path, *sweep.args, "--latency-budget-ms", "0.001")
    err = capsys.readouterr().err
    assert code == 3
    assert "no configuration of 'mlp_onnx' meets the constraints (p99 <= 0.001 ms); the closest was" in stdout
    assert "ferry-analyzer: error: no configuration meets the constraints for mlp_onnx" in err
    assert not (tmp_path / "out" / "mlp_onnx").exists()


def test_interrupted_sweep_resumes(sweep, tmp_path: Path, run_profile) -> None:
    shutil.copytree(sweep.root / "ck", tmp_path / "ck")
    path = tmp_path / "ck" / FILENAME
    data = json.loads(path.read_text())
    dropped = data["models"]["mlp_onnx"]["measurements"].pop()
    data["models"]["mlp_onnx"]["result"] = None  # as if killed before the end
    path.write_text(json.dumps(data))
    code, stdout = run_profile(tmp_path, *sweep.args)
    assert code == 0, stdout
    total = len(sweep.measurements())
    assert f"1 measurement(s) taken, {total - 1} reused from the checkpoint" in stdout
    again = json.loads(path.read_text())["models"]["mlp_onnx"]["measurements"]
    assert len(again) == total
    assert [again[-1][k] for k in ("config_key", "concurrency", "trial")] == \
        [dropped[k] for k in ("config_key", "concurrency", "trial")]


def test_quick_sweep_of_a_python_model_with_the_builtin_generator(tmp_path: Path, run_profile) -> None:
    code, stdout = run_profile(tmp_path, "--run-config-search-mode", "quick", "--concurrency", "1..2",
                           "--max-instance-count", "2", "--max-batch-sizes", "64", "--delays-us", "100",
                           "--preferred-batch-sizes", "none", "--load-generator", "builtin", "--verify-runs", "0",
                           "--server-arg=--disable-auto-complete-config", models="double_py")
    assert code == 0, stdout
    data = json.loads((tmp_path / "ck" / FILENAME).read_text())
    assert data["settings"]["load_generator"] == "builtin"
    keys = {m["config_key"] for m in data["models"]["double_py"]["measurements"]}
    # the default and its instance-count neighbour, then batching off from whichever of the two won
    assert {"i1-b64-db100", "i2-b64-db100"} <= keys
    assert keys & {"i1-b64-nodb", "i2-b64-nodb"}
    assert keys <= {"i1-b64-db100", "i2-b64-db100", "i1-b64-nodb", "i2-b64-nodb"}
    assert (tmp_path / "out" / "double_py" / "1" / "model.py").is_file()
