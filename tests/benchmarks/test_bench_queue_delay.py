"""``benchmarks.queue_delay``: CPU and lateness of a batcher's wait for its queue delay, on a real uvloop."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks import queue_delay
from serving_pod.schedulers import clock


@pytest.mark.parametrize(("argv", "message"), [
    (["--delays-us", "100,abc"], "--delays-us must be a comma list of integers"),
    (["--delays-us", "0"], "every delay must be at least 1"),
    (["--waits", "0"], "--waits and every delay must be at least 1"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        queue_delay.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fine timers use Linux's timerfd")
def test_prints_cpu_and_lateness_per_wait_and_spin_only_costs_the_whole_delay(
        capsys: pytest.CaptureFixture[str]) -> None:
    row = re.compile(r"(\d+) us delay: CPU\s+([\d.]+) us, ended\s+(-?[\d.]+) us late")
    fine_timers = clock.fine_timers
    measured = {}
    for argv in ([], ["--spin-only"]):
        assert queue_delay.main(["--delays-us", "300", "--waits", "50", *argv]) == 0
        rows = row.findall(capsys.readouterr().out)
        assert [delay for delay, _, _ in rows] == ["300"]
        measured[bool(argv)] = float(rows[0][1]), float(rows[0][2])
        assert clock.fine_timers is fine_timers  # --spin-only leaves the module as it found it
    assert all(late >= 0 for _, late in measured.values())  # never ends before the delay
    # re-checking on every loop turn spends the whole delay on CPU; asleep on the timerfd, a fraction of it
    assert measured[False][0] < 0.5 * measured[True][0]
