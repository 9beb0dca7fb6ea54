"""Durations in the kubelet's configuration syntax (Go's time.ParseDuration) and as seconds."""

from __future__ import annotations

import pytest

from nodeagent import config as cfg
from nodeagent import duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("20s", 20.0), ("2m0s", 120.0), ("1h30m", 5400.0), ("300ms", 0.3), ("-1.5h", -5400.0),
    ("0", 0.0), ("1.5us", 1.5e-6), ("1µs", 1e-6), ("4h0m0s", 14400.0), (".5s", 0.5), ("+3s", 3.0),
])
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert duration.parse(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "message"), [
    ("", 'time: invalid duration ""'),
    ("1", 'time: missing unit in duration "1"'),
    ("1x", 'time: unknown unit "x" in duration "1x"'),
    ("abc", 'time: invalid duration "abc"'),
])
def test_bad_durations_are_named_as_go_names_them(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        duration.parse(text)


@pytest.mark.parametrize(("seconds", "text"), [(120.0, "2m0s"), (5400.0, "1h30m0s"), (0.5, "500ms"), (0, "0s"),
                                               (20, "20s"), (14400, "4h0m0s")])
def test_format_is_go_duration_string(seconds: float, text: str) -> None:
    assert duration.format(seconds) == text


def test_config_durations_take_both_forms() -> None:
    config = cfg.AgentConfig.model_validate({"runtimeRequestTimeout": "2m0s", "fileCheckFrequency": 5})
    assert config.kubelet.runtime_request_timeout == 120.0
    assert config.kubelet.file_check_frequency == 5.0
    with pytest.raises(Exception, match="unknown unit"):
        cfg.AgentConfig.model_validate({"nodeStatusUpdateFrequency": "10 s"})
