"""Acceptance 1 (slow): a quick sweep of the ONNX MLP and of a python model, default search settings.

Both models in one ``ferry-analyzer profile`` run must finish in under 10 minutes on the 2-core machine,
and for each the recommended configuration must beat the model's own configuration on the objective, both
measured as medians of their verification runs. The objective is p99 latency under a throughput floor of
500 infer/s: Ferry's default configs are already tuned for throughput (dynamic batching on; a throughput
sweep finds gains within the noise of a shared 2-core machine), while their queue delays cost latency.
The figures are printed (run with ``-s``) and the report is rendered from the run's checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from serving_pod.analyzer.checkpoint import FILENAME
from serving_pod.analyzer.cli import main
from support.server import DEFAULT_MODELS


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_quick_sweep_of_mlp_onnx_and_double_py(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code = main(["profile", "--model-repository", str(DEFAULT_MODELS), "--profile-models", "mlp_onnx,double_py",
                 "--checkpoint-directory", str(tmp_path / "ck"), "--output-model-repository", str(tmp_path / "out"),
                 "--objective", "latency", "--min-throughput", "500", "--no-progress"])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert elapsed < 600, f"sweep took {elapsed:.0f} s"
    data = json.loads((tmp_path / "ck" / FILENAME).read_text())
    with capsys.disabled():
        print(f"\n[analyzer acceptance] both models in {elapsed:.0f} s ({data['settings']})")
        for model in ("mlp_onnx", "double_py"):
            print(f"[analyzer acceptance] {data['models'][model]['result']['message']}")
            print(f"[analyzer acceptance] {model}: {len(data['models'][model]['measurements'])} measurements")
    for model in ("mlp_onnx", "double_py"):
        result = data["models"][model]["result"]
        assert result["recommended"] is not None and result["default"] is not None
        assert result["gain"] > 0, result["message"]
        assert (tmp_path / "out" / model / "config.pbtxt").is_file()
    assert main(["report", "--checkpoint-directory", str(tmp_path / "ck"), "--output", str(tmp_path / "r.html")]) == 0
