"""The scaling benchmark (benchmarks/scaling.py): its generated repository, variants, order and table, and
``burn_py`` served by a real Ferry server at two instances (two processes) with the values the model defines."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks import report, scaling, servers


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_repository_has_one_copy_per_instance_count(tmp_path: Path) -> None:
    names = scaling.make_repository(servers.BENCH_MODELS / "burn_py", tmp_path)
    assert names == {1: "burn_py_x1", 2: "burn_py_x2"}
    for count, name in names.items():
        config = _config(tmp_path / name / "config.pbtxt")
        assert config.name == name and [g.count for g in config.instance_group] == [count]
        assert config.parameters["FERRY_ISOLATED"].string_value == "true"
        assert (tmp_path / name / "1" / "model.py").read_bytes() == \
            (servers.BENCH_MODELS / "burn_py" / "1" / "model.py").read_bytes()


def test_a_model_without_instance_groups_gets_one(tmp_path: Path) -> None:
    source = tmp_path / "src" / "plain"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text('name: "plain"\nbackend: "python"\n')
    names = scaling.make_repository(source, tmp_path / "out", (3,))
    group = _config(tmp_path / "out" / names[3] / "config.pbtxt").instance_group
    assert [(g.count, g.kind) for g in group] == [(3, model_config_pb2.ModelInstanceGroup.KIND_CPU)]


def test_variants_and_their_order(tmp_path: Path) -> None:
    args = scaling.parse_args(["--out", str(tmp_path)])
    variants = scaling.build_variants(args, tmp_path / "repo", servers.Ports(1, 2, 3))
    assert [v.label for v in variants] == ["ferry instances=1", "ferry instances=2",
                                           "ferry http-workers=1", "ferry http-workers=2"]
    assert [v.protocol for v in variants] == ["grpc", "grpc", "http", "http"]
    assert "--http-workers=2" in variants[3].spec.argv and "--load-model=burn_py_x2" in variants[1].spec.argv
    assert [v.label for v in scaling.round_order(variants, 2)] == [
        "ferry http-workers=2", "ferry http-workers=1", "ferry instances=2", "ferry instances=1"]


@pytest.mark.parametrize("argv, message", [
    (["--kinds", "threads"], "--kinds must be a comma list of instances, http-workers"),
    (["--rounds", "0"], "--rounds >= 1"),
    (["--workers", "2"], "--workers needs at least two counts >= 1"),
    (["--workers", "0,1"], "--workers needs at least two counts >= 1"),
    (["--workers", "1,two"], "--workers must be a comma list of integers"),
    (["--model-repository", "/nonexistent"], "model 'burn_py' not found"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        scaling.parse_args(argv)
    assert message in capsys.readouterr().err


def test_scaling_rows_and_table(tmp_path: Path) -> None:
    args = scaling.parse_args(["--kinds", "instances", "--out", str(tmp_path)])
    variants = scaling.build_variants(args, tmp_path / "repo", servers.Ports(1, 2, 3))
    m = report.Measurement
    summaries = report.summarize([m("ferry instances=1", "grpc", 16, 1, 500, 40000, server_cpu_us=2000),
                                  m("ferry instances=2", "grpc", 16, 1, 950, 30000, server_cpu_us=1700)])
    (row,) = scaling.scaling(variants, summaries)
    assert (row.server, row.kind) == ("ferry", "instances")
    assert (row.base, row.workers) == (1, 2)
    assert math.isclose(row.throughput_ratio, 1.9) and math.isclose(row.cores_base, 1.0)
    assert math.isclose(row.cores, 1.615)
    table = scaling.format_table(summaries, [row])
    assert "ferry instances=2        grpc    16     950.0   30.00              1700         1.61" in table
    assert "ferry instances             2/1   1.90   1.00 -> 1.61" in table


def test_more_worker_counts_each_against_the_fewest(tmp_path: Path) -> None:
    args = scaling.parse_args(["--kinds", "http-workers", "--workers", "4,1,2", "--out", str(tmp_path)])
    variants = scaling.build_variants(args, tmp_path / "repo", servers.Ports(1, 2, 3))
    assert [v.label for v in variants] == ["ferry http-workers=1", "ferry http-workers=2", "ferry http-workers=4"]
    assert [v.label for v in scaling.round_order(variants, 2)][0] == "ferry http-workers=4"
    m = report.Measurement
    summaries = report.summarize([m(f"ferry http-workers={n}", "http", 16, 1, thr, 4000, server_cpu_us=100)
                                  for n, thr in ((1, 10000), (2, 18000), (4, 30000))])
    rows = scaling.scaling(variants, summaries)
    assert [(r.base, r.workers, round(r.throughput_ratio, 2), r.cores) for r in rows] == [(1, 2, 1.8, 1.8), (1, 4, 3.0, 3.0)]


def _reference(values: np.ndarray, rounds: int) -> np.ndarray:
    out = []
    for v in values.tolist():
        r = 0.5 + 0.4 * (abs(v) % 1.0) if math.isfinite(v) else 0.5
        for _ in range(rounds):
            r = 3.7 * r * (1.0 - r)
        out.append(r)
    return np.array(out, np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_burn_py_at_two_instances_answers_as_defined(threaded_server, tmp_path: Path, protocol: str) -> None:
    names = scaling.make_repository(servers.BENCH_MODELS / "burn_py", tmp_path)
    server = threaded_server([tmp_path], model_control_mode="explicit", load_models=(names[2],))
    module = server.module(protocol)
    inputs = [np.linspace(-3, 3, 16, dtype=np.float32) + i for i in range(12)]
    inputs[0][3] = np.nan  # not finite: starts at 0.5

    def infer(x: np.ndarray) -> np.ndarray:
        tensor = module.InferInput("INPUT0", [16], "FP32")
        tensor.set_data_from_numpy(x)
        return server.client(protocol).infer(names[2], [tensor]).as_numpy("OUTPUT0")

    with ThreadPoolExecutor(4) as pool:
        for x, y in zip(inputs, pool.map(infer, inputs)):
            np.testing.assert_allclose(y, _reference(x, 1500), rtol=1e-5)
    pids = {i.process.pid for i in (inst._child for inst in server.engine.registry.get(names[2]).pool.instances)}
    assert len(pids) == 2  # one process per instance
