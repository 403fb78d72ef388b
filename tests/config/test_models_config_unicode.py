"""A model id or alias must be Unicode text: a lone surrogate (``"\\ud800"`` in a double-quoted
YAML string) was served, and /metrics, which labels every model's state with its id, failed with
UnicodeEncodeError for as long as the server ran. It is refused with the file, line and key, as
the --key-policy file refuses one."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from scheduler.models_config import ConfigError, parse_config


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_config(text, "f.yaml", Path("/tmp"), lambda p: None)


def test_such_a_name_breaks_the_metrics_exposition() -> None:
    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            family = GaugeMetricFamily("superfluid_model_state", "h", labels=["model"])
            family.add_metric(["\ud800"], 1)
            yield family

    with pytest.raises(UnicodeEncodeError):
        generate_latest(Collector())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('models:\n  "a\\ud800":\n    model: a.gguf\n', "f.yaml:2: models: model id 'a\\ud800' holds a lone surrogate"),
        ('models:\n  a:\n    model: a.gguf\n    aliases: ["\\udcff"]\n', "f.yaml:4: models.a.aliases: '\\udcff' holds a lone surrogate"),
    ],
)
def test_a_lone_surrogate_in_a_name_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert str(err.value).startswith(message)


def test_other_unicode_names_are_served() -> None:
    cfg = parse('models:\n  "smöl-😀":\n    model: a.gguf\n    aliases: ["小"]\n')
    assert cfg.resolve("小") == "smöl-😀"
