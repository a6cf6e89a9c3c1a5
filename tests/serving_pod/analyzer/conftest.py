"""Fixtures of the analyzer suite: ``run_profile`` (in-process ``ferry-analyzer profile``) and ``sweep``,
one real tiny brute sweep of the ONNX MLP shared by the package's tests (profile, budget, resume, report)."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from serving_pod.analyzer.checkpoint import FILENAME
from serving_pod.analyzer.cli import main
from serving_pod.analyzer.measure import Measurement
from support.perf_analyzer import cached_perf_analyzer
from support.server import DEFAULT_MODELS

#: short windows: the suite must stay fast on a 2-core machine
WINDOW = ("--measurement-interval-ms", "200", "--stability-percentage", "100", "--max-trials", "3")
ProfileFn = Callable[..., tuple[int, str]]


def profile(root: Path, *extra: str, models: str = "mlp_onnx", checkpoint: Path | None = None,
            output: Path | None = None) -> tuple[int, str]:
    """``ferry-analyzer profile`` on the default models with short windows; ``(exit code, stdout)``."""
    args = ["profile", "--model-repository", str(DEFAULT_MODELS), "--profile-models", models,
            "--checkpoint-directory", str(checkpoint or root / "ck"),
            "--output-model-repository", str(output or root / "out"), "--no-progress", *WINDOW, *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return code, out.getvalue()


def load_generator_args() -> tuple[str, ...]:
    """perf_analyzer when it can be installed (the preferred generator), else the built-in one."""
    located = cached_perf_analyzer()
    if located.path is None:
        return ("--load-generator", "builtin")
    return ("--load-generator", "perf_analyzer", "--perf-analyzer", str(located.path))


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

    def medians(self, model: str = "mlp_onnx") -> dict[tuple[str, int], tuple[float, float, int]]:
        """(config, concurrency) -> (median throughput, median p99, runs), computed here independently."""
        runs: dict[tuple[str, int], list[Measurement]] = {}
        for m in self.measurements(model):
            if m.ok:
                runs.setdefault((m.config_key, m.concurrency), []).append(m)
        return {point: (statistics.median(m.throughput for m in ms), statistics.median(m.p99_ms for m in ms), len(ms))
                for point, ms in runs.items()}


@pytest.fixture
def run_profile() -> ProfileFn:
    return profile


@pytest.fixture(scope="package")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """2 configurations (the model's own, and dynamic batching off) x concurrency 1 and 4, then the best point
    and the default's best measured once more (verification). The server runs without config auto-complete,
    which would turn dynamic batching back on for the "off" configuration."""
    root = tmp_path_factory.mktemp("analyzer")
    args = ("--run-config-search-mode", "brute", "--concurrency", "1,4", "--max-instance-count", "1",
            "--max-batch-sizes", "64", "--dynamic-batching", "off", "--verify-runs", "1", "--verify-top", "1",
            "--server-arg=--disable-auto-complete-config", *load_generator_args())
    code, stdout = profile(root, *args)
    return Sweep(root, args, code, stdout)
