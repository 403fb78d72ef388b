"""serve --config reads plain values as llama-swap does (Go, gopkg.in/yaml.v3: YAML 1.2), not as
PyYAML's YAML 1.1 did: there ``no`` was false, ``1:08:16`` was 4096 (base 60) and ``0o10`` no
number. A value the two readings disagree on is read as llama-swap reads it, or, where that is
no number it could mean safely, refused naming the key and line; never a different number."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.models_config import ConfigError, parse_config


def parsed(text: str):  # type: ignore[no-untyped-def]
    return parse_config(text, "f.yaml", Path("/"), check_path=lambda _p: None)


def one_model(key: str, written: str) -> str:
    return f"models:\n  a:\n    model: a.gguf\n    {key}: {written}\n"


@pytest.mark.parametrize(
    ("key", "written", "message"),
    [
        ("ttl", "1:08:16", "must be a finite number, got '1:08:16'"),
        ("ttl", "1:30.5", "must be a finite number, got '1:30.5'"),
        ("max_batch", "1:04", "must be an integer, got '1:04'"),
        ("ctx_size", "-1:30", "must be an integer, got '-1:30'"),
    ],
)
def test_a_base_60_value_is_no_number(key: str, written: str, message: str) -> None:
    """YAML 1.1 read ``ttl: 1:08:16`` as 4096 seconds; to llama-swap it is a string."""
    with pytest.raises(ConfigError) as err:
        parsed(one_model(key, written))
    assert str(err.value) == f"f.yaml:4: models.a.{key}: {message}"


@pytest.mark.parametrize(("key", "written"), [("ttl", "010"), ("max_batch", "010"), ("ctx_size", "0100"), ("ttl", "09"), ("priority", "-010"), ("ttl", "0_10")])
def test_a_leading_zero_integer_is_refused(key: str, written: str) -> None:
    """``010`` is 8 (octal) to llama-swap and to YAML 1.1, and 10 to YAML 1.2's core schema: read
    as 8 it surprised whoever meant 10, so it is refused, naming both and the ways to write them."""
    with pytest.raises(ConfigError) as err:
        parsed(one_model(key, written))
    message = str(err.value)
    assert message.startswith(f"f.yaml:4: models.a.{key}: "), message
    assert "leading zero" in message and "0o" in message, message


@pytest.mark.parametrize(
    ("key", "written", "value"),
    [
        ("max_batch", "0o10", 8),
        ("max_batch", "0O10", 8),
        ("max_batch", "0x10", 16),
        ("max_batch", "0X1_0", 16),
        ("max_batch", "0b1000", 8),
        ("max_batch", "0B10_00", 8),
        ("ctx_size", "0x1000", 4096),
        ("priority", "-0o10", -8),
        ("priority", "+0x10", 16),
        ("ttl", "0x3c", 60.0),
        ("ttl", "0o74", 60.0),
        ("ttl", "0b111100", 60.0),
        ("ttl", "0", 0.0),
        ("ttl", "-0", 0.0),
    ],
)
def test_0o_0x_and_0b_integers_read_as_llama_swap_reads_them(key: str, written: str, value: float) -> None:
    """YAML 1.2 writes octal as ``0o10``; YAML 1.1 read it as a string, so ``max_batch: 0o10``
    stopped serve though llama-swap reads 8."""
    model = parsed(one_model(key, written)).models[0]
    assert getattr(model, "ttl_s" if key == "ttl" else key) == value


@pytest.mark.parametrize(("key", "written", "value"), [("ctx_size", "32_768", 32768), ("ttl", "3_600", 3600.0), ("max_batch", "1_6", 16), ("priority", "-1_000", -1000)])
def test_underscores_grouping_an_integers_digits_read_as_llama_swap_reads_them(key: str, written: str, value: float) -> None:
    model = parsed(one_model(key, written)).models[0]
    assert getattr(model, "ttl_s" if key == "ttl" else key) == value


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("1_000.5", 1000.5), ("1_0e2", 1000.0), ("1.000_5", 1.0005), ("2_5.", 25.0), ("1e_1", 10.0), ("+_1.5", 1.5), ("1_0", 10.0), ("+_0x1_0", 16.0), ("0_x10", 16.0), ("-0_o10", None), ("0_b1_1", 3.0)],
)
def test_underscores_in_a_number_starting_with_a_digit_or_sign_read_as_llama_swap_reads_them(written: str, seconds: float | None) -> None:
    """yaml.v3 drops every ``_`` of a plain value that starts with a digit or a sign before it
    reads the number: ``ttl: 1_000.5`` is 1000.5 seconds to llama-swap (serve refused it)."""
    if seconds is None:  # a number, below 0
        with pytest.raises(ConfigError, match=r"^f.yaml:4: models.a.ttl: must be 0 or more \(or -1: globalTTL\), got -8"):
            parsed(one_model("ttl", written))
        return
    assert parsed(one_model("ttl", written)).models[0].ttl_s == seconds


@pytest.mark.parametrize("written", ["_100", "._5", ".5_", "1e_", "1_e", "0x_g"])
def test_underscores_where_llama_swap_reads_no_number_are_refused(written: str) -> None:
    """``_100`` and ``._5`` are strings to both readings (a value starting with ``_`` or ``.`` keeps
    its underscores); ``1e_`` is ``1e`` once they are gone, no number."""
    with pytest.raises(ConfigError, match=r"^f.yaml:4: models.a.ttl: must be a finite number"):
        parsed(one_model("ttl", written))


@pytest.mark.parametrize(("key", "written"), [(k, w) for k in ("ttl", "max_batch", "ctx_size", "priority") for w in ("yes", "no", "on", "Off", "y", "N", "true", "False")])
def test_a_boolean_word_is_no_number(key: str, written: str) -> None:
    """``ttl: yes`` is never read as 1 second (nor ``on`` as 1 lane): a boolean, or to llama-swap a
    string, is no number."""
    kind = "a finite number" if key == "ttl" else "an integer"
    with pytest.raises(ConfigError) as err:
        parsed(one_model(key, written))
    assert str(err.value) == f"f.yaml:4: models.a.{key}: must be {kind}, got {written!r}"


def test_a_model_id_path_or_alias_written_as_a_yaml_1_1_boolean_is_a_name() -> None:
    """A model ``no`` whose file is ``on``, with aliases ``yes``, ``off``, ``y``, ``N``: YAML 1.1
    made each one false or true, and serve stopped with "must be a non-empty string, got 'no'"."""
    cfg = parsed("models:\n  no:\n    model: on\n    aliases: [yes, off, y, N, Yes, OFF]\n")
    (model,) = cfg.models
    assert model.id == "no" and model.path == Path("/on")
    assert model.aliases == ("yes", "off", "y", "N", "Yes", "OFF")
    assert cfg.resolve("yes") == "no" and cfg.resolve("off") == "no"


@pytest.mark.parametrize("written", ["true", "False", "8", "010", "0o10", "1:30", "3e2", "1.50", ".inf", ".NaN", "2024-01-01", "1_000"])
def test_a_name_is_the_text_as_written_whatever_it_would_read_as(written: str) -> None:
    """llama-swap reads a name (a string field) as the text written: an alias ``1:30`` is "1:30",
    not 90, and ``1.50`` is "1.50", not 1.5 written back."""
    cfg = parsed(f"models:\n  a:\n    model: {written}\n    aliases: [{written}]\n")
    (model,) = cfg.models
    assert model.path == Path("/") / written
    assert model.aliases == (written,)


@pytest.mark.parametrize("written", ["~", "null", "Null", "NULL"])
def test_a_null_name_is_still_refused(written: str) -> None:
    with pytest.raises(ConfigError, match=rf"^f.yaml:3: models.a.model: must be a non-empty string, got '{written}'$"):
        parsed(f"models:\n  a:\n    model: {written}\n")


def test_a_scheduler_written_as_a_yaml_1_1_boolean_is_named_as_written() -> None:
    with pytest.raises(ConfigError, match=r"^f.yaml:6: routing.scheduler.use: must be serial or fifo, got 'no'$"):
        parsed("models:\n  a:\n    model: a.gguf\nrouting:\n  scheduler:\n    use: no\n")


@pytest.mark.parametrize(("key", "written"), [(k, w) for k in ("ttl", "max_batch") for w in (".inf", "-.inf", "+.INF", ".nan", ".NaN", "1e400")])
def test_infinity_and_nan_are_refused(key: str, written: str) -> None:
    kind = "a finite number" if key == "ttl" else "an integer"
    with pytest.raises(ConfigError) as err:
        parsed(one_model(key, written))
    assert str(err.value) == f"f.yaml:4: models.a.{key}: must be {kind}, got {written!r}"


@pytest.mark.parametrize(("written", "seconds"), [("1.5", 1.5), (".5", 0.5), ("5.", 5.0), ("-.5", None), ("+1.5", 1.5), ("010.5", 10.5)])
def test_decimal_floats_read_as_llama_swap_reads_them(written: str, seconds: float | None) -> None:
    """``-.5`` was a string to YAML 1.1 and is -0.5 to YAML 1.2: refused as below 0 either way."""
    if seconds is None:
        with pytest.raises(ConfigError, match=r"^f.yaml:4: models.a.ttl: must be 0 or more \(or -1: globalTTL\), got -0.5$"):
            parsed(one_model("ttl", written))
        return
    assert parsed(one_model("ttl", written)).models[0].ttl_s == seconds


@pytest.mark.parametrize("written", ["!!float 1:30", "!!int 1:30", "!!int 010", "!!int 1e3"])
def test_an_explicit_tag_reads_no_other_number_than_llama_swap_either(written: str) -> None:
    """``!!float 1:30`` was 90.0 through YAML 1.1's constructor; llama-swap refuses it."""
    with pytest.raises(ConfigError, match=r"^f.yaml:4: models.a.ttl: cannot be read"):
        parsed(one_model("ttl", written))


@settings(max_examples=150, deadline=None)
@given(
    ttl=st.integers(0, 10**15),
    max_batch=st.integers(1, 64),
    ctx_size=st.integers(64, 10**12),
    priority=st.integers(-(10**12), 10**12),
    grouped=st.booleans(),
)
def test_an_integer_written_in_decimal_reads_back_the_same(ttl: int, max_batch: int, ctx_size: int, priority: int, grouped: bool) -> None:
    """Decimal integers, plain or with ``_`` grouping their digits (``32_768``), read back as the
    same number, in integer and in seconds fields alike."""
    fmt = "{:_}" if grouped else "{}"
    text = "models:\n  a:\n    model: a.gguf\n" + "".join(
        f"    {key}: {fmt.format(value)}\n" for key, value in (("ttl", ttl), ("max_batch", max_batch), ("ctx_size", ctx_size), ("priority", priority))
    )
    model = parsed(text).models[0]
    assert (model.ttl_s, model.max_batch, model.ctx_size, model.priority) == (ttl, max_batch, ctx_size, priority)


@settings(max_examples=150, deadline=None)
@given(
    seconds=st.floats(0, 1e12, allow_nan=False, allow_infinity=False),
    exponent=st.booleans(),
    cuts=st.lists(st.integers(1, 40), max_size=4),
)
def test_a_decimal_float_with_underscores_inserted_reads_as_without_them(seconds: float, exponent: bool, cuts: list[int]) -> None:
    """yaml.v3's rule, held against any decimal float: a value that starts with a digit, with
    ``_`` put anywhere after its first character, reads as the value without them."""
    written = f"{seconds:e}" if exponent else repr(seconds)
    for cut in sorted(cuts, reverse=True):
        at = min(cut, len(written))
        written = written[:at] + "_" + written[at:]
    assert parsed(one_model("ttl", written)).models[0].ttl_s == float(written.replace("_", ""))
