"""The batching benchmark (benchmarks/batching.py): generated repository, table and plot without servers; the
statistics readout against a running in-process server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks import batching, report, servers


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_repository_has_a_batched_and_an_unbatched_copy(tmp_path: Path) -> None:
    names = batching.make_repository(servers.BENCH_MODELS / "mlp_onnx", tmp_path)
    assert names == {"batched": "mlp_onnx_batched", "unbatched": "mlp_onnx_unbatched"}
    on, off = (_config(tmp_path / names[k] / "config.pbtxt") for k in ("batched", "unbatched"))
    assert on.name == "mlp_onnx_batched" and on.dynamic_batching.max_queue_delay_microseconds == 200
    assert off.name == "mlp_onnx_unbatched" and not off.HasField("dynamic_batching")
    assert on.max_batch_size == off.max_batch_size == 64
    original = (servers.BENCH_MODELS / "mlp_onnx" / "1" / "model.onnx").read_bytes()
    assert all((tmp_path / n / "1" / "model.onnx").read_bytes() == original for n in names.values())


def test_repository_refuses_a_model_that_cannot_batch(tmp_path: Path) -> None:
    source = tmp_path / "src" / "nobatch"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text('name: "nobatch"\nbackend: "python"\nmax_batch_size: 0\n')
    with pytest.raises(SystemExit, match="max_batch_size 0; batching needs >= 2"):
        batching.make_repository(source, tmp_path / "out")


def test_table_lists_ratio_per_concurrency() -> None:
    m = report.Measurement
    summaries = report.summarize([m("batched", "http", 16, 1, 3000, 8000), m("unbatched", "http", 16, 1, 1000, 20000),
                                  m("batched", "http", 1, 1, 500, 2000)])
    table = batching.format_table(summaries)
    assert "3000.0" in table and "1000.0" in table and "3.00" in table
    assert len(table.splitlines()) == 2  # c=1 lacks its unbatched twin and is left out
    (ratio,) = report.ratios(summaries, "unbatched")
    assert ratio.throughput_ratio == 3.0 and math.isclose(ratio.p99_ratio, 0.4)


def test_cpu_ceiling_is_the_shared_cpus_over_server_and_client_cpu_per_inference() -> None:
    s = report.Summary
    batched = s("batched", "http", 16, 6500.0, 5000.0, 3, server_cpu_us=143.0, client_cpu_us=113.0)
    unbatched = s("unbatched", "http", 16, 4700.0, 6000.0, 3, server_cpu_us=211.0, client_cpu_us=118.0)
    line = batching.cpu_ceiling(batched, unbatched, 2)
    # 2 CPUs / 256 us = 7812.5 infer/s at most, 1.66x the 4700 measured unbatched
    assert "batched 143 us server + 113 us client" in line and "at most 7812 infer/s, 1.66x" in line
    no_client = s("batched", "http", 16, 6500.0, 5000.0, 3, server_cpu_us=143.0)  # CPU not read: no claim
    assert batching.cpu_ceiling(no_client, unbatched, 2) == ""


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    m = report.Measurement
    summaries = report.summarize([m(label, "http", c, 1, c * f, 1000 + c * 100) for label, f in
                                  (("batched", 300.0), ("unbatched", 100.0)) for c in (1, 2, 4)])
    message = batching.plot(summaries, tmp_path / "p.png", "t")
    assert message.startswith("wrote") and (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_profile_reads_a_running_servers_statistics(tmp_path: Path) -> None:
    """Batch size and per-request stage times from Ferry's own statistics after real inferences."""
    import numpy as np
    import tritonclient.http as httpclient
    from concurrent.futures import ThreadPoolExecutor

    from support.server import ServerThread, make_options

    names = batching.make_repository(servers.BENCH_MODELS / "mlp_onnx", tmp_path)
    thread = ServerThread(make_options([tmp_path], model_control_mode="explicit", load_models=tuple(names.values()),
                                       autocomplete=False))
    handle = thread.start()
    try:
        port = handle.server.http_port

        def infer(model: str) -> None:
            client = httpclient.InferenceServerClient(handle.http_url)
            item = httpclient.InferInput("INPUT0", [1, 256], "FP32")
            item.set_data_from_numpy(np.ones((1, 256), np.float32))
            client.infer(model, [item])
            client.close()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(infer, [names["batched"]] * 32 + [names["unbatched"]] * 8))
        batched, unbatched = (batching.server_profile(port, names[k]) for k in ("batched", "unbatched"))
    finally:
        thread.stop()
    assert 1.0 <= batched["batch_size"] <= 8.0 and unbatched["batch_size"] == 1.0
    assert all(profile[stage] > 0 for profile in (batched, unbatched) for stage in ("compute_infer", "queue"))
    assert batching.format_profile("batched", batched).startswith("batched: average batch ")
    # a server that cannot be read, or statistics without executions, give NaN rather than an error
    assert all(math.isnan(v) for v in batching.server_profile(1, "nothing").values())
    assert all(math.isnan(v) for v in batching.execution_profile({"execution_count": 0}).values())
