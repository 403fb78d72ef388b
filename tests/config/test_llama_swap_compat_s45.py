"""serve --config read as llama-swap reads the same keys: a llama-swap file's fifo priorities
(``routing.scheduler.settings.fifo.priority``) and its ``healthCheckTimeout`` below 15."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.router import Router
from scheduler.models_config import ConfigError, parse_config

TWO = "models:\n  a:\n    model: a.gguf\n    aliases: [alpha]\n  b:\n    model: b.gguf\n"


def parsed(text: str):
    return parse_config(text, "f.yaml", Path("/"), check_path=lambda p: None)


FIFO = TWO + "routing:\n  scheduler:\n    use: fifo\n    settings:\n      fifo:\n        priority:\n          b: 10\n          alpha: -5\n"


def test_llama_swaps_fifo_priorities_are_the_models_priorities() -> None:
    """llama-swap configures the fifo scheduler's per-model priority as
    ``routing.scheduler.settings.fifo.priority: {model: N}``; that file was refused ("unknown key
    (expected one of serial)"), so a llama-swap user's fifo order could not be carried over."""
    cfg = parsed(FIFO)
    assert {m.id: m.priority for m in cfg.models} == {"a": -5, "b": 10}  # an alias names its model
    assert cfg.scheduler == "fifo"


def test_the_fifo_priorities_order_the_router_as_the_seed_says() -> None:
    """A model at 10 with a ``batch`` header queues at -90: ahead of a normal request (-5 + 0)
    for a model at -5 only when the header does not pull it below."""
    cfg = parsed(FIFO)
    router = Router([m.spec() for m in cfg.models], cfg.router_config(), clock=lambda: 0.0)
    router.submit("a-normal", "a", 0)
    router.submit("b-normal", "b", 0)
    router.submit("b-batch", "b", -100)
    assert [w.request_id for w in router.order()] == ["b-normal", "a-normal", "b-batch"]
    assert [router.score(w, 0.0) for w in router.order()] == [10, -5, -90]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("          c: 1\n", ":12: routing.scheduler.settings.fifo.priority: names no configured model: 'c'"),
        ("          a: 1\n          alpha: 2\n", ":13: routing.scheduler.settings.fifo.priority: 'alpha' and 'a' both name model 'a'"),
        ("          a: high\n", ":12: routing.scheduler.settings.fifo.priority.a: must be an integer, got 'high'"),
    ],
)
def test_a_bad_fifo_priority_is_named_by_line_and_key(tail: str, expected: str) -> None:
    text = TWO + "routing:\n  scheduler:\n    settings:\n      fifo:\n        priority:\n" + tail
    with pytest.raises(ConfigError) as err:
        parsed(text)
    assert expected in str(err.value)


def test_a_model_given_two_different_priorities_is_refused() -> None:
    text = TWO.replace("    aliases: [alpha]\n", "    aliases: [alpha]\n    priority: 3\n")
    text += "routing:\n  scheduler:\n    settings:\n      fifo:\n        priority:\n          a: 4\n"
    with pytest.raises(ConfigError, match="model 'a' has priority 3 in models.a.priority already"):
        parsed(text)
    same = text.replace("a: 4", "a: 3")
    assert parsed(same).get("a").priority == 3
    with pytest.raises(ConfigError, match="model 'a' has priority 0 in models.a.priority already"):
        parsed(text.replace("priority: 3", "priority: 0"))


def test_an_unknown_fifo_setting_is_still_an_error() -> None:
    text = TWO + "routing:\n  scheduler:\n    settings:\n      fifo:\n        priorty:\n          a: 1\n"
    with pytest.raises(ConfigError, match="fifo.priorty: unknown key"):
        parsed(text)


@pytest.mark.parametrize(("written", "seconds"), [("5", 15.0), ("0", 15.0), ("-1", 15.0), ("15", 15.0), ("16", 16.0)])
def test_a_health_check_timeout_below_15_is_15_as_llama_swap_reads_it(written: str, seconds: float) -> None:
    """llama-swap raises a ``healthCheckTimeout`` below 15 to 15; its file with
    ``healthCheckTimeout: 5`` stopped serve here ("must be 15 or more")."""
    assert parsed(TWO + f"healthCheckTimeout: {written}\n").load_timeout_s == seconds


def test_global_ttl_is_the_ttl_of_a_model_that_gives_none_or_minus_1() -> None:
    """llama-swap's ``globalTTL`` is the ``ttl`` of every model that gives none, and ``ttl: -1``
    (its default) means "the global one"; both stopped serve here (``globalTTL: unknown key``,
    ``ttl: must be 0 or more, got -1``), so a llama-swap file's idle unloads could not be kept."""
    text = "globalTTL: 300\nmodels:\n  a:\n    model: a.gguf\n  b:\n    model: b.gguf\n    ttl: -1\n  c:\n    model: c.gguf\n    ttl: 0\n  d:\n    model: d.gguf\n    ttl: 60\n"
    cfg = parsed(text)
    assert {m.id: m.ttl_s for m in cfg.models} == {"a": 300.0, "b": 300.0, "c": 0.0, "d": 60.0}
    router = Router([m.spec() for m in cfg.models], cfg.router_config(), clock=lambda: 0.0)
    assert router.models["a"].spec.ttl_s == 300.0
    # without globalTTL, -1 is llama-swap's default of 0: never unloaded
    assert parsed("models:\n  a:\n    model: a.gguf\n    ttl: -1\n").models[0].ttl_s == 0.0
    with pytest.raises(ConfigError, match=r":1: globalTTL: must be 0 or more, got -5"):
        parsed("globalTTL: -5\n" + TWO)


def test_a_merge_key_shares_settings_between_models_as_llama_swap_reads_it() -> None:
    """llama-swap's files share settings with YAML anchors and merge keys (``<<: *base``, which
    yaml.v3 honours); serve stopped at ``models.b.<<: unknown key``."""
    text = (
        "models:\n"
        "  a: &base\n    model: a.gguf\n    ttl: 300\n    max_batch: 2\n    ctx_size: 1024\n"
        "  b:\n    <<: *base\n    model: b.gguf\n    max_batch: 4\n"
        "  c:\n    model: c.gguf\n    <<: [{ttl: 60, ctx_size: 512}, *base]\n"
    )
    a, b, c = parsed(text).models
    assert (a.path.name, a.ttl_s, a.max_batch, a.ctx_size) == ("a.gguf", 300.0, 2, 1024)
    # the model's own keys win, wherever the merge key stands
    assert (b.path.name, b.ttl_s, b.max_batch, b.ctx_size) == ("b.gguf", 300.0, 4, 1024)
    # among merged mappings, the first that has a key
    assert (c.path.name, c.ttl_s, c.max_batch, c.ctx_size) == ("c.gguf", 60.0, 2, 512)


@pytest.mark.parametrize(
    "text",
    [
        "models:\n  a: &x\n    <<: *x\n    model: a.gguf\n",  # a mapping merged into itself
        "models:\n  a:\n    model: a.gguf\n    <<: 5\n",
        "models:\n  a:\n    model: a.gguf\n    <<: [5]\n",
    ],
)
def test_a_merge_key_naming_no_other_mapping_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"models\.a\.<<: must be a mapping"):
        parsed(text)


def test_a_merged_key_is_checked_as_a_written_one() -> None:
    with pytest.raises(ConfigError, match=r"models\.b\.max_batch: must be between 1 and 64, got 0"):
        parsed("models:\n  a: &base\n    model: a.gguf\n  b:\n    <<: {max_batch: 0}\n    model: b.gguf\n")
    with pytest.raises(ConfigError, match=r"models\.b\.batch: unknown key"):
        parsed("models:\n  a:\n    model: a.gguf\n  b:\n    <<: {batch: 2}\n    model: b.gguf\n")


def test_hooks_on_startup_preload_loads_the_models_as_serve_starts() -> None:
    """llama-swap's ``hooks.on_startup.preload`` loads models as it starts; serve stopped at
    ``hooks: unknown key``, so the first request after a start paid the load again."""
    text = TWO + "hooks:\n  on_startup:\n    preload: [alpha, b, a]\n"
    cfg = parsed(text)
    assert cfg.preload == ("a", "b")  # an alias names its model; once each
    assert parsed(TWO + "hooks:\n  on_startup:\n    preload: []\n").preload == ()
    # the pool asks the router for each as the admin's Load does: into the free slot
    router = Router([m.spec() for m in cfg.models], cfg.router_config(), clock=lambda: 0.0)
    for model in cfg.preload:
        router.request_load(model)
    assert router.schedule().load == ["a"]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("hooks:\n  on_startup:\n    preload: [c]\n", ":9: hooks.on_startup.preload: names no configured model: 'c'"),
        ("hooks:\n  on_startup:\n    preload: a\n", ":9: hooks.on_startup.preload: must be a list of model names"),
        ("hooks:\n  on_start:\n    preload: [a]\n", ":8: hooks.on_start: unknown key"),
    ],
)
def test_a_bad_preload_is_named_by_line_and_key(tail: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parsed(TWO + tail)
    assert expected in str(err.value)
