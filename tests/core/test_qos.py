"""QoS class names and aliases, X-LlamaSwap-Priority parsing, priority bands and their classes."""

from __future__ import annotations

import pytest

from scheduler.core import qos
from scheduler.core.qos import DEFAULT_CLASS, QosClass, UnknownQosClass


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
        # case and surrounding whitespace do not matter
        ("Interactive-Chat", QosClass.INTERACTIVE),
        ("INLINE-COMPLETION", QosClass.COMPLETION),
        ("Foreground", QosClass.AGENT),
        ("  background-AGENT \t", QosClass.BACKGROUND),
    ],
)
def test_every_class_name_and_alias_resolves_to_its_class_in_any_case(name: str, expected: QosClass) -> None:
    assert qos.parse_qos(name) is expected


@pytest.mark.parametrize("name", ["urgent", "4", "-1", "", "interactive chat", "batch", "normal"])
def test_an_unknown_class_name_raises_unknown_qos_class(name: str) -> None:
    with pytest.raises(UnknownQosClass):
        qos.parse_qos(name)


def test_unknown_qos_class_is_a_value_error_naming_the_bad_value() -> None:
    with pytest.raises(ValueError, match="'urgent'"):
        qos.parse_qos("urgent")


def test_classes_order_from_most_to_least_urgent_and_agent_is_the_default() -> None:
    assert QosClass.INTERACTIVE < QosClass.COMPLETION < QosClass.AGENT < QosClass.BACKGROUND
    assert DEFAULT_CLASS is QosClass.AGENT
    assert [c.label for c in QosClass] == ["interactive", "completion", "agent", "background"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # the aliases
        ("interactive", 100),
        ("normal", 0),
        ("batch", -100),
        # a signed integer
        ("0", 0),
        ("7", 7),
        ("+5", 5),
        ("-98", -98),
        (" -3 ", -3),
        ("101", 101),
        ("-100", -100),
    ],
)
def test_a_priority_is_an_alias_or_a_signed_integer(header: str, expected: int) -> None:
    assert qos.parse_priority(header) == expected


# Python's int() reads "1_00", full-width "１００" and Arabic-Indic "٥٠" too; a header in any of
# them would have picked the interactive class.
@pytest.mark.parametrize("header", [None, "", "   ", "high", "1.5", "0x10", "1e3", "--5", "5 5", "1_00", "１００", "٥٠", "+-1"])
def test_absent_or_unparseable_priority_means_zero(header: str | None) -> None:
    assert qos.parse_priority(header) == 0


@pytest.mark.parametrize("header", ["100000", "-100000", "99999999999999999999"])
def test_priority_is_never_clamped(header: str) -> None:
    assert qos.parse_priority(header) == int(header)


# Leading zeros are no part of a value: "-000…0100" is -100 however many zeros pad it. int()
# counts them against its 4,300-digit limit, which read a padded batch priority as 0 (normal band).
@pytest.mark.parametrize(
    ("header", "expected"),
    [("-" + "0" * 5000 + "100", -100), ("+" + "0" * 4300 + "7", 7), ("0" * 4301, 0), ("0" * 4299 + "1" + "0" * 4, 10000)],
    ids=["padded-batch", "padded-plus", "all-zeros", "padded-ten-thousand"],
)
def test_leading_zeros_do_not_make_a_priority_unparseable(header: str, expected: int) -> None:
    assert qos.parse_priority(header) == expected
    assert qos.band_of(qos.parse_priority(header)) == qos.band_of(expected)


@pytest.mark.parametrize(("header", "band"), [("9" * 5000, "interactive"), ("-" + "9" * 5000, "batch"), ("+1" + "0" * 4400, "interactive")])
def test_a_priority_of_more_digits_than_python_reads_keeps_its_sign_and_band(header: str, band: str) -> None:
    """int() refuses more than 4,300 digits; such a value was read as 0 (normal band), so a
    client's batch priority of 5,000 nines ran as normal work. It is beyond every clamp."""
    assert qos.band_of(qos.parse_priority(header)) == band
    assert abs(qos.parse_priority(header)) >= 10**4300


@pytest.mark.parametrize(
    ("priority", "band", "qos_class"),
    [
        (100, "interactive", QosClass.INTERACTIVE),
        (50, "interactive", QosClass.INTERACTIVE),
        (49, "normal", QosClass.AGENT),
        (0, "normal", QosClass.AGENT),
        (-49, "normal", QosClass.AGENT),
        (-50, "batch", QosClass.BACKGROUND),
        (-100, "batch", QosClass.BACKGROUND),
        (100000, "interactive", QosClass.INTERACTIVE),
        (-100000, "batch", QosClass.BACKGROUND),
    ],
)
def test_bands_are_100_wide_and_centred_on_the_anchors_and_a_priority_alone_selects_its_bands_class(
    priority: int, band: str, qos_class: QosClass
) -> None:
    assert qos.band_of(priority) == band
    assert qos.class_of_priority(priority) is qos_class


def test_a_tier_offset_orders_work_inside_a_band_without_crossing_it() -> None:
    free, pro, max_ = (qos.parse_priority(str(-100 + offset)) for offset in (0, 1, 2))
    assert free < pro < max_ < qos.parse_priority("normal")
    assert {qos.band_of(p) for p in (free, pro, max_)} == {"batch"}
    assert {qos.class_of_priority(p) for p in (free, pro, max_)} == {QosClass.BACKGROUND}
