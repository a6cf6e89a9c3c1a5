"""ModelTimestamp: what counts as newer for a model and for one of its versions (Triton's ModelTimestamp)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from serving_pod.repository.timestamps import ModelTimestamp


def _touch(path: Path) -> None:
    now = time.time_ns() + 1_000_000
    os.utime(path, ns=(now, now))


def _model(tmp_path: Path) -> Path:
    for relative in ("config.pbtxt", "1/model.py", "2/model.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x")
    return tmp_path


def _read(model_dir: Path) -> ModelTimestamp:
    return ModelTimestamp.read(model_dir, model_dir / "config.pbtxt")


def test_config_newer_modifies_the_model_but_no_version(tmp_path):
    before = _read(_model(tmp_path))
    assert not before.modified(_read(tmp_path))
    _touch(tmp_path / "config.pbtxt")
    after = _read(tmp_path)
    assert after.config_entry == "config.pbtxt"
    assert before.modified(after) and not before.version_modified(after, 1) and not before.version_modified(after, 2)


def test_version_file_newer_modifies_that_version_only(tmp_path):
    before = _read(_model(tmp_path))
    _touch(tmp_path / "2" / "model.py")
    after = _read(tmp_path)
    assert before.modified(after) and before.version_modified(after, 2) and not before.version_modified(after, 1)


def test_a_file_beside_the_config_modifies_every_version(tmp_path):
    before = _read(_model(tmp_path))
    (tmp_path / "labels.txt").write_text("a")
    _touch(tmp_path / "labels.txt")
    after = _read(tmp_path)
    assert before.version_modified(after, 1) and before.version_modified(after, 2)


def test_a_config_override_time_hides_older_edits(tmp_path):
    """After a load with a config override the config counts as modified then: a later edit older than that load is
    not newer (tritonserver 2.51 keeps the override)."""
    model = _model(tmp_path)
    overridden = _read(model).with_config_time(time.time_ns() + 10**12)
    _touch(model / "config.pbtxt")
    assert not overridden.modified(_read(model))


def test_an_unreadable_directory_reads_as_never_modified(tmp_path):
    missing = ModelTimestamp.read(tmp_path / "gone", tmp_path / "gone" / "config.pbtxt")
    assert missing.newest() == 0 and not _read(_model(tmp_path)).modified(missing)
