"""QoS class names and aliases, X-LlamaSwap-Priority parsing, priority bands and their classes."""

from __future__ import annotations

import pytest

from scheduler.core.qos import (
    DEFAULT_CLASS,
    QosClass,
    UnknownQosClass,
    band_of,
    class_of_priority,
    parse_priority,
    parse_qos,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("interactive", QosClass.INTERACTIVE),
        ("interactive-chat", QosClass.INTERACTIVE),
        ("0", QosClass.INTERACTIVE),
        ("completion", QosClass.COMPLETION),
        ("inline-completion", QosClass.COMPLETION),
        ("1", QosClass.COMPLETION),
        ("agent", QosClass.AGENT),
        ("foreground", QosClass.AGENT),
        ("foreground-agent", QosClass.AGENT),
        ("2", QosClass.AGENT),
        ("background", QosClass.BACKGROUND),
        ("background-agent", QosClass.BACKGROUND),
        ("3", QosClass.BACKGROUND),
    ],
)
def test_every_class_name_and_alias_resolves_to_its_class(name: str, expected: QosClass) -> None:
    assert parse_qos(name) is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Interactive-Chat", QosClass.INTERACTIVE),
        ("INLINE-COMPLETION", QosClass.COMPLETION),
        ("Foreground", QosClass.AGENT),
        ("  background-AGENT \t", QosClass.BACKGROUND),
    ],
)
def test_class_names_ignore_case_and_surrounding_whitespace(name: str, expected: QosClass) -> None:
    assert parse_qos(name) is expected


@pytest.mark.parametrize("name", ["urgent", "4", "-1", "", "interactive chat", "batch", "normal"])
def test_an_unknown_class_name_raises_unknown_qos_class(name: str) -> None:
    with pytest.raises(UnknownQosClass):
        parse_qos(name)


def test_unknown_qos_class_is_a_value_error_naming_the_bad_value() -> None:
    with pytest.raises(ValueError, match="'urgent'"):
        parse_qos("urgent")


def test_classes_order_from_most_to_least_urgent_and_agent_is_the_default() -> None:
    assert QosClass.INTERACTIVE < QosClass.COMPLETION < QosClass.AGENT < QosClass.BACKGROUND
    assert DEFAULT_CLASS is QosClass.AGENT
    assert [c.label for c in QosClass] == ["interactive", "completion", "agent", "background"]


@pytest.mark.parametrize(("header", "expected"), [("interactive", 100), ("normal", 0), ("batch", -100)])
def test_priority_aliases_resolve_to_their_numbers(header: str, expected: int) -> None:
    assert parse_priority(header) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [("0", 0), ("7", 7), ("+5", 5), ("-98", -98), (" -3 ", -3), ("101", 101), ("-100", -100)],
)
def test_priority_is_a_signed_integer(header: str, expected: int) -> None:
    assert parse_priority(header) == expected


@pytest.mark.parametrize("header", [None, "", "   ", "high", "1.5", "0x10", "1e3", "--5", "5 5"])
def test_absent_or_unparseable_priority_means_zero(header: str | None) -> None:
    assert parse_priority(header) == 0


@pytest.mark.parametrize("header", ["100000", "-100000", "99999999999999999999"])
def test_priority_is_never_clamped(header: str) -> None:
    assert parse_priority(header) == int(header)


@pytest.mark.parametrize(
    ("priority", "band"),
    [
        (100, "interactive"),
        (50, "interactive"),
        (49, "normal"),
        (0, "normal"),
        (-49, "normal"),
        (-50, "batch"),
        (-100, "batch"),
        (100000, "interactive"),
        (-100000, "batch"),
    ],
)
def test_bands_are_100_wide_and_centred_on_the_anchors(priority: int, band: str) -> None:
    assert band_of(priority) == band


@pytest.mark.parametrize(
    ("priority", "qos"),
    [
        (100, QosClass.INTERACTIVE),
        (50, QosClass.INTERACTIVE),
        (49, QosClass.AGENT),
        (0, QosClass.AGENT),
        (-49, QosClass.AGENT),
        (-50, QosClass.BACKGROUND),
        (-100, QosClass.BACKGROUND),
    ],
)
def test_a_priority_alone_selects_the_class_of_its_band(priority: int, qos: QosClass) -> None:
    assert class_of_priority(priority) is qos


def test_a_tier_offset_orders_work_inside_a_band_without_crossing_it() -> None:
    free, pro, max_ = (parse_priority(str(-100 + offset)) for offset in (0, 1, 2))
    assert free < pro < max_ < parse_priority("normal")
    assert {band_of(p) for p in (free, pro, max_)} == {"batch"}
    assert {class_of_priority(p) for p in (free, pro, max_)} == {QosClass.BACKGROUND}
