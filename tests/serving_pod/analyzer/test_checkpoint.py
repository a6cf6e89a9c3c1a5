"""The checkpoint file: round trip, replacement of failed attempts, refusal to mix settings."""

from __future__ import annotations

import json
import math

import pytest

from serving_pod.analyzer.checkpoint import FILENAME, Checkpoint
from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.measure import Measurement, failed

SETTINGS = {"load_generator": "builtin", "window": "http/200ms/50%/3"}


def test_round_trip_and_find(tmp_path) -> None:
    ck = Checkpoint.open(tmp_path, settings=SETTINGS)
    ck.add_config("m", "i1-b8-nodb", {"instance_count": 1}, {"name": "m"})
    ck.record(failed("m", "i1-b8-nodb", 4, "perf_analyzer exited 1", "w"))
    assert ck.find("m", "i1-b8-nodb", 4) is None  # failed attempts are measured again on resume
    good = Measurement("m", "i1-b8-nodb", 4, 123.4, 5.6, queue_us=7.0, rss_mb=80.0)
    ck.record(good)
    again = Checkpoint.open(tmp_path, settings=SETTINGS)
    assert again.measurements("m") == [good]  # the failed attempt was replaced
    assert again.find("m", "i1-b8-nodb", 4) == good
    assert json.loads((tmp_path / FILENAME).read_text())["format"] == "ferry-analyzer-checkpoint/1"


def test_nan_survives_as_null(tmp_path) -> None:
    ck = Checkpoint.open(tmp_path, settings=SETTINGS)
    ck.record(failed("m", "k", 1, "boom", "w"))
    loaded = Checkpoint.open(tmp_path).measurements("m")[0]
    assert math.isnan(loaded.throughput) and loaded.error == "boom"


def test_other_settings_are_refused(tmp_path) -> None:
    Checkpoint.open(tmp_path, settings=SETTINGS).save()
    with pytest.raises(InputError, match="measured with other settings"):
        Checkpoint.open(tmp_path, settings={**SETTINGS, "window": "http/600ms/50%/6"})


def test_missing_and_foreign_files(tmp_path) -> None:
    with pytest.raises(InputError, match="no checkpoint in"):
        Checkpoint.open(tmp_path / "nothing", create=False)
    (tmp_path / FILENAME).write_text('{"hello": 1}')
    with pytest.raises(InputError, match="not a ferry-analyzer checkpoint"):
        Checkpoint.open(tmp_path)
    (tmp_path / FILENAME).write_text("{")
    with pytest.raises(InputError, match="unreadable"):
        Checkpoint.open(tmp_path)
