"""``benchmarks.instructions``: instructions per request of the in-process HTTP path, under a real callgrind."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import instructions


@pytest.mark.parametrize(("requests", "message"), [
    ("5", "--requests takes two counts"),
    ("a,b", "--requests takes two counts"),
    ("300,100", "the counts must be positive and the second larger"),
    ("0,100", "the counts must be positive and the second larger"),
])
def test_bad_request_counts_are_refused(requests: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        instructions.main(["--requests", requests])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow  # two interpreters under valgrind: about two minutes
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (Debian: valgrind)")
def test_counts_instructions_per_request_under_callgrind() -> None:
    # two short runs side by side (about a minute: the interpreter starts under valgrind); a request of this
    # path is hundreds of thousands of instructions, start-up (which the difference cancels) billions
    per = instructions.per_request("double_py", 20, 120)
    assert 50_000 < per < 5_000_000
