"""perf_analyzer output parsing and flag building (benchmarks/perfcsv.py), on real perf_analyzer 2.50 output."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import perfcsv

DATA = Path(__file__).parent / "data"


def test_parse_csv_reads_every_row_in_microseconds() -> None:
    rows = perfcsv.parse_csv((DATA / "perf_two_rows.csv").read_text())
    assert [r.concurrency for r in rows] == [1, 16]
    assert rows[0].throughput == pytest.approx(1415.04)
    assert rows[0].p99_us == 1044 and rows[0].p50_us == 687 and rows[0].server_queue_us == 217
    assert rows[1].throughput == pytest.approx(7278.03)
    assert rows[1].p99_us == 4398 and rows[1].server_compute_infer_us == 487


def test_parse_csv_accepts_verbose_columns() -> None:
    (row,) = perfcsv.parse_csv((DATA / "perf_c16_verbose.csv").read_text())
    assert (row.concurrency, row.p99_us, row.client_send_us) == (16, 4398, 48)


def test_parse_csv_stops_at_first_blank_line() -> None:
    text = (DATA / "perf_two_rows.csv").read_text() + "\nServer Metrics\ngarbage,1\n"
    assert len(perfcsv.parse_csv(text)) == 2


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty"),
    ("Concurrency,Inferences/Second\n1,2\n", "'p99 latency'"),
    ("Concurrency,Inferences/Second,p99 latency\n", "no rows"),
    ("Concurrency,Inferences/Second,p99 latency\n1,fast,3\n", "'Inferences/Second' is not a number: 'fast'"),
    ("Concurrency,Inferences/Second,p99 latency\n1,5,\n", "no 'p99 latency' value"),
])
def test_parse_csv_rejects_bad_input_clearly(text: str, message: str) -> None:
    with pytest.raises(perfcsv.PerfOutputError, match=message.replace("(", r"\(")):
        perfcsv.parse_csv(text)


def test_server_breakdown_is_read_from_stdout() -> None:
    (block,) = perfcsv.parse_server_breakdown((DATA / "perf_stdout_http_c16.txt").read_text())
    assert block == perfcsv.ServerBreakdown(inference_count=54134, execution_count=8172, success_count=54134,
                                            request_latency_us=1557, overhead_us=4, queue_us=790,
                                            compute_input_us=102, compute_infer_us=487, compute_output_us=173)


def test_server_breakdown_absent_without_statistics() -> None:
    text = (DATA / "perf_stdout_http_c16.txt").read_text()
    client_only = text.split("  Server:")[0]
    assert perfcsv.parse_server_breakdown(client_only) == []


def test_perf_args_carry_the_same_flags_for_every_server() -> None:
    spec = perfcsv.PerfSpec("double_py", "127.0.0.1:8001", "grpc", 16, measurement_interval_ms=2500)
    args = perfcsv.perf_args(spec, "/tmp/x.csv")
    assert args[:6] == ["-m", "double_py", "-u", "127.0.0.1:8001", "-i", "grpc"]
    joined = " ".join(args)
    assert "--concurrency-range 16" in joined and "--measurement-interval 2500" in joined
    assert "--percentile=99" in args and args[args.index("-f") + 1] == "/tmp/x.csv"
    no_pct = perfcsv.perf_args(perfcsv.PerfSpec("m", "h:1", "http", 1, percentile=None, extra=("--async",)), "f")
    assert not any(a.startswith("--percentile") for a in no_pct) and no_pct[-1] == "--async"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"protocol": "udp"}, "protocol must be one of"),
    ({"concurrency": 0}, "concurrency must be >= 1"),
    ({"measurement_interval_ms": 10}, "measurement interval must be >= 100 ms"),
])
def test_perf_spec_rejects_bad_values(kwargs: dict, message: str) -> None:
    base = {"model": "m", "url": "h:1", "protocol": "http", "concurrency": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        perfcsv.PerfSpec(**base)


@pytest.mark.parametrize(("text", "levels"), [
    ("1,16", [1, 16]), ("1..64", [1, 2, 4, 8, 16, 32, 64]), ("1..48", [1, 2, 4, 8, 16, 32, 48]), ("4..4", [4]),
])
def test_concurrency_list(text: str, levels: list[int]) -> None:
    assert perfcsv.concurrency_list(text) == levels


@pytest.mark.parametrize(("text", "message"), [
    ("0", "positive integer, got 0"), ("a", "positive integer, got 'a'"), ("8..4", "start 8 is above end 4"),
    ("", "empty"),
])
def test_concurrency_list_rejects_bad_input(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        perfcsv.concurrency_list(text)


def test_unstable_detects_perf_analyzer_giving_up() -> None:
    assert perfcsv.unstable("Failed to obtain stable measurement within 10 measurement windows for concurrency 16.")
    assert not perfcsv.unstable((DATA / "perf_stdout_http_c16.txt").read_text())


def test_unstable_run_is_estimated_from_its_windows_without_warmup() -> None:
    text = (DATA / "perf_stdout_unstable.txt").read_text()
    assert perfcsv.unstable(text)
    assert perfcsv.parse_passes(text) == [(1118.59, 1077), (1173.94, 1620), (1154.62, 1096), (1171.6, 2662)]
    throughput, p99 = perfcsv.unstable_estimate(text)  # windows 2..4
    assert throughput == pytest.approx(1171.6) and p99 == 1620
    assert perfcsv.unstable_estimate("no windows here") is None
