"""``benchmarks.hostprobe``: the loopback send and round trip, measured with a real child process."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks import hostprobe


def test_probe_measures_both_placements_and_restores_the_affinity() -> None:
    before = os.sched_getaffinity(0)
    cost = hostprobe.probe(count=200)
    assert os.sched_getaffinity(0) == before  # pinned only while measuring
    assert 0 < cost.send_same_us < cost.roundtrip_same_us
    if len(before) > 1:
        assert 0 < cost.send_cross_us < cost.roundtrip_cross_us
    else:
        assert math.isnan(cost.send_cross_us)
    text = cost.describe()
    assert "on another CPU" in text and "on the same CPU" in text
    assert set(cost.as_dict()) == {"send_cross_us", "roundtrip_cross_us", "send_same_us", "roundtrip_same_us"}


def test_measure_pins_the_echoing_child_where_asked() -> None:
    cpu = max(os.sched_getaffinity(0))
    send_us, roundtrip_us = hostprobe.measure(cpu, cpu, 50)
    assert 0 < send_us < roundtrip_us


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="count must be at least 1"):
        hostprobe.probe(count=0)
    with pytest.raises(SystemExit) as exit_info:
        hostprobe.main(["--count", "0"])
    assert exit_info.value.code == 2 and "--count must be at least 1" in capsys.readouterr().err
