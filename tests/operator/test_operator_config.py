"""Operator settings from the environment, and the ferry-operator entry point's bad-input paths."""

from __future__ import annotations

import pytest

from ferry_operator.config import OperatorConfig
from ferry_operator.main import main


def test_defaults() -> None:
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig()
    assert (config.server_image, config.storage_image, config.queue_metric) == (
        "ferry/server:0.1.0", "ferry/server:0.1.0", "avg_time_queue_us")
    assert config.finalizer == "serving.ferry.dev/finalizer"


def test_from_env() -> None:
    config = OperatorConfig.from_env({
        "FERRY_SERVER_IMAGE": "reg/ferry:2", "FERRY_INITIALIZER_IMAGE": "reg/init:2", "FERRY_QUEUE_TARGET_US": "80",
        "FERRY_RESYNC_SECONDS": "2.5", "FERRY_NAMESPACES": "a, b", "FERRY_TRAFFIC_MODE": "gateway",
        "FERRY_LIVENESS_ENDPOINT": "",
    })
    assert (config.server_image, config.storage_image, config.queue_target_us) == ("reg/ferry:2", "reg/init:2", 80)
    assert (config.resync_seconds, config.namespaces, config.traffic_mode) == (2.5, ("a", "b"), "gateway")
    assert config.liveness_endpoint is None


@pytest.mark.parametrize(
    ("env", "message"),
    [({"FERRY_QUEUE_TARGET_US": "fast"}, "FERRY_QUEUE_TARGET_US: expected int, got 'fast'"),
     ({"FERRY_TRAFFIC_MODE": "istio"}, "FERRY_TRAFFIC_MODE must be one of auto, gateway, replicas")],
)
def test_bad_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorConfig.from_env(env)


def test_main_refuses_bad_settings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FERRY_RESYNC_SECONDS", "soon")
    assert main([]) == 2
    assert "FERRY_RESYNC_SECONDS: expected float" in capsys.readouterr().err
