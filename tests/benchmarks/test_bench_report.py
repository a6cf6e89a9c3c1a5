"""Medians, ratios, tables and result files of the benchmark harness (benchmarks/report.py, soak.rss_at)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.soak import rss_at

M = report.Measurement
NAN = math.nan


def _measurements() -> list[report.Measurement]:
    return [
        M("triton", "http", 1, 1, 1000, 3000), M("ferry", "http", 1, 1, 1500, 2000),
        M("triton", "http", 1, 2, 900, 3400), M("ferry", "http", 1, 2, 1300, 2600),
        M("triton", "http", 1, 3, 950, 5000), M("ferry", "http", 1, 3, NAN, NAN),  # a failed point
        M("triton", "grpc", 16, 1, 4000, 9000), M("ferry", "grpc", 16, 1, 4400, 9900),
    ]


def test_summarize_takes_medians_of_successful_rounds() -> None:
    by_key = {(s.server, s.protocol, s.concurrency): s for s in report.summarize(_measurements())}
    triton = by_key["triton", "http", 1]
    assert (triton.throughput, triton.p99_us, triton.rounds) == (950, 3400, 3)
    ferry = by_key["ferry", "http", 1]
    assert (ferry.throughput, ferry.p99_us, ferry.rounds) == (1400, 2300, 2)


def test_summarize_counts_unstable_rounds_and_table_flags_them() -> None:
    (s,) = report.summarize([M("ferry", "grpc", 1, 1, 10, 10, stable=False), M("ferry", "grpc", 1, 2, 12, 12)])
    assert (s.rounds, s.unstable, s.throughput) == (2, 1, 11)
    assert "2 (1 unstable)" in report.format_table([s], [])


def test_summarize_marks_points_without_any_success() -> None:
    (s,) = report.summarize([M("ferry", "grpc", 1, 1, NAN, NAN)])
    assert s.rounds == 0 and math.isnan(s.throughput)


def test_ratios_against_baseline_with_target_verdicts() -> None:
    rows = {(r.protocol, r.concurrency): r for r in report.ratios(report.summarize(_measurements()), "triton")}
    http = rows["http", 1]
    assert http.throughput_ratio == pytest.approx(1400 / 950) and http.p99_ratio == pytest.approx(2300 / 3400)
    assert http.throughput_ok and http.p99_ok
    grpc = rows["grpc", 16]
    assert grpc.throughput_ratio == pytest.approx(1.1) and not grpc.throughput_ok
    assert grpc.p99_ratio == pytest.approx(1.1) and not grpc.p99_ok
    assert all(r.server == "ferry" and r.baseline == "triton" for r in rows.values())


def test_ratios_skip_points_the_baseline_lacks_and_nan_on_failure() -> None:
    summaries = report.summarize([M("ferry", "http", 64, 1, 10, 10), M("triton", "http", 1, 1, NAN, NAN),
                                  M("ferry", "http", 1, 1, 5, 5)])
    (only,) = report.ratios(summaries, "triton")
    assert only.concurrency == 1 and math.isnan(only.throughput_ratio) and not only.throughput_ok


def test_round_by_round_ratios_pair_the_same_round_and_skip_failed_ones() -> None:
    measurements = _measurements()
    rows = {(r.protocol, r.concurrency): r for r in report.ratios(report.summarize(measurements), "triton",
                                                                   measurements)}
    http = rows["http", 1]
    # rounds 1 and 2 paired; round 3 has no ferry figure (failed), so it has no ratio
    assert http.throughput_rounds == pytest.approx((1500 / 1000, 1300 / 900))
    assert http.p99_rounds == pytest.approx((2000 / 3000, 2600 / 3400))
    assert rows["grpc", 16].throughput_rounds == pytest.approx((1.1,))
    # a round the baseline lacks is skipped, not paired with another round
    lone = [M("triton", "http", 1, 1, 100, 10), M("ferry", "http", 1, 1, 150, 10), M("ferry", "http", 1, 2, 90, 10)]
    (only,) = report.ratios(report.summarize(lone), "triton", lone)
    assert only.throughput_rounds == pytest.approx((1.5,))
    # without measurements the ratios stand alone and the table has no round column
    assert report.ratios(report.summarize(measurements), "triton")[0].throughput_rounds == ()
    table = report.format_table(report.summarize(measurements), list(rows.values()))
    assert "round by round" in table and "1.50 1.44 | 0.67 0.76" in table


def test_format_table_shows_figures_ratios_and_verdicts() -> None:
    summaries = report.summarize(_measurements())
    table = report.format_table(summaries, report.ratios(summaries, "triton"))
    assert "1400.0" in table and "2.30" in table  # ferry http c=1: infer/s and p99 in ms
    assert "ferry/triton" in table and "1.47" in table and "0.68" in table
    assert "thr OK, p99 OK" in table and "thr MISS, p99 MISS" in table


def test_cpu_per_inference_medians_skip_unmeasured_rounds_and_show_in_the_table() -> None:
    (s,) = report.summarize([M("ferry", "http", 16, 1, 100, 10, True, 70.0, 50.0, (("server", 70.0),), 0.8),
                             M("ferry", "http", 16, 2, 110, 10, True, 80.0, 56.0),
                             M("ferry", "http", 16, 3, 120, 10, True, NAN, NAN)])
    assert (s.server_cpu_us, s.client_cpu_us) == (75.0, 53.0)
    header, line = report.format_table([s], []).splitlines()
    assert "server CPU us/inf" in header and "client CPU us/inf" in header
    assert line.split()[-2:] == ["75", "53"]


def test_growth() -> None:
    assert report.growth(100.0, 105.0) == pytest.approx(0.05)
    assert math.isnan(report.growth(0.0, 5.0))


def test_json_writes_nan_as_null_and_csv_has_header(tmp_path: Path) -> None:
    summaries = report.summarize(_measurements() + [M("ferry", "grpc", 1, 1, NAN, NAN)])
    report.write_json(tmp_path / "r.json", {"summary": [s.__dict__ for s in summaries], "x": (1.0, NAN)})
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert loaded["x"] == [1.0, None] and loaded["summary"][-1]["throughput"] is None
    report.write_csv(tmp_path / "r.csv", summaries)
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert rows[0] == {"server": "triton", "protocol": "http", "concurrency": "1", "throughput": "950",
                       "p99_us": "3400", "rounds": "3", "unstable": "0", "server_cpu_us": "nan",
                       "client_cpu_us": "nan"}


def test_rss_at_picks_the_nearest_sample() -> None:
    samples = ((5.0, 100.0), (58.0, 110.0), (63.0, 111.0), (300.0, 112.0))
    assert rss_at(samples, 60.0) == 110.0
    assert math.isnan(rss_at((), 60.0))
