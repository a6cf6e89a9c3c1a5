"""``ferry-server``'s command line parsed in-process: options from flags, and the message of a refusal."""

from __future__ import annotations

from typing import Any

import pytest

from serving_pod.cli import build_parser, options_from_args


def cli_options(*argv: str) -> Any:
    """The ``ServerOptions`` the flags give, as ``ferry-server`` builds them."""
    parser = build_parser()
    return options_from_args(parser.parse_args(list(argv)), parser)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What the parser prints when it refuses the flags; fails unless it exits with code 2."""
    with pytest.raises(SystemExit) as exited:
        cli_options(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err
