"""``ferry-server``'s garbage collector settings (``ServerOptions.gc_freeze``, which the CLI sets): start-up objects
frozen out of its reach and a young-generation threshold of ``GC_YOUNG_THRESHOLD``, so many requests in flight do not
trigger young collections that find nothing; an embedder that leaves the option off keeps the collector as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from serving_pod.server import GC_YOUNG_THRESHOLD
from support.server import ServerThread, make_options


@pytest.fixture
def collector() -> Iterator[None]:
    """The process's collector as it was, back after the test (the server changes it for the whole process)."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize("freeze", [True, False])
def test_gc_settings_follow_the_option(tmp_path, collector, freeze: bool) -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    gc.unfreeze()
    thread = ServerThread(make_options([tmp_path], gc_freeze=freeze))
    thread.start()
    try:
        assert gc.get_threshold() == ((GC_YOUNG_THRESHOLD, 10, 10) if freeze else (700, 10, 10))
        assert (gc.get_freeze_count() > 0) is freeze
    finally:
        thread.stop()
