"""QoS classes, their aliases, and request priority bands.

Pure: no Django, no engine imports. Lower class value = more urgent.
"""

from __future__ import annotations

import enum
import re


class QosClass(enum.IntEnum):
    INTERACTIVE = 0
    COMPLETION = 1
    AGENT = 2
    BACKGROUND = 3

    @property
    def label(self) -> str:
        return self.name.lower()


DEFAULT_CLASS = QosClass.AGENT
# Every class, best first, as a tuple: iterating the enum itself runs a generator of its own
# each time, and the scheduler walks the classes several times a decode round.
QOS_CLASSES: tuple[QosClass, ...] = tuple(QosClass)

_ALIASES: dict[str, QosClass] = {
    "interactive": QosClass.INTERACTIVE,
    "interactive-chat": QosClass.INTERACTIVE,
    "0": QosClass.INTERACTIVE,
    "completion": QosClass.COMPLETION,
    "inline-completion": QosClass.COMPLETION,
    "1": QosClass.COMPLETION,
    "agent": QosClass.AGENT,
    "foreground": QosClass.AGENT,
    "foreground-agent": QosClass.AGENT,
    "2": QosClass.AGENT,
    "background": QosClass.BACKGROUND,
    "background-agent": QosClass.BACKGROUND,
    "3": QosClass.BACKGROUND,
}


class UnknownQosClass(ValueError):
    pass


def parse_qos(value: str) -> QosClass:
    """Resolve a class name, alias or number; raise UnknownQosClass otherwise."""
    key = value.strip().lower()
    try:
        return _ALIASES[key]
    except KeyError:
        raise UnknownQosClass(
            f"unknown QoS class {value!r}; expected one of interactive, completion, agent, background"
        ) from None


# Request priority (X-LlamaSwap-Priority). The number is the interface.
PRIORITY_ALIASES: dict[str, int] = {"interactive": 100, "normal": 0, "batch": -100}
BAND_SPACING = 100


# A signed integer in ASCII digits: Python's int() also takes "1_00", full-width and other
# scripts' digits, which the seed's "signed integer" does not mean (and which would then pick a class).
_SIGNED_INTEGER = re.compile(r"[+-]?[0-9]+")
# What a value of more significant digits than int() reads stands for: it is larger than this.
LONGEST = 10**4300


def parse_priority(value: str | None) -> int:
    """Signed integer or alias; absent or unparseable means 0. Never clamped, never an error."""
    if value is None:
        return 0
    text = value.strip(" \t").lower()
    if text in PRIORITY_ALIASES:
        return PRIORITY_ALIASES[text]
    if _SIGNED_INTEGER.fullmatch(text) is None:
        return 0
    sign, digits = ("-" if text[0] == "-" else ""), text.lstrip("+-").lstrip("0") or "0"
    try:  # leading zeros are no part of the value: int() would count them against its digit limit
        return int(sign + digits, 10)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits): a value
        return -LONGEST if sign else LONGEST  # beyond every clamp and band, its sign kept


def priority_parses(value: str) -> bool:
    """Whether ``value`` is a priority :func:`parse_priority` reads (an alias or a signed
    integer), not one it takes as 0 because it reads nothing there."""
    text = value.strip(" \t").lower()
    return text in PRIORITY_ALIASES or _SIGNED_INTEGER.fullmatch(text) is not None


def band_of(priority: int) -> str:
    """The band a priority falls in: nearest anchor, bands 100 wide centred on -100/0/+100.

    priority >= 50 is interactive, priority <= -50 is batch, anything between is normal.
    """
    if priority >= BAND_SPACING // 2:
        return "interactive"
    if priority <= -(BAND_SPACING // 2):
        return "batch"
    return "normal"


BAND_CLASS: dict[str, QosClass] = {
    "interactive": QosClass.INTERACTIVE,
    "normal": DEFAULT_CLASS,
    "batch": QosClass.BACKGROUND,
}


def class_of_priority(priority: int) -> QosClass:
    """The class a request gets when it names only X-LlamaSwap-Priority."""
    return BAND_CLASS[band_of(priority)]


# The priority of a request of each class that sends no X-LlamaSwap-Priority: the anchor of the
# band the class runs in (api.admission.class_anchor; docs/scheduling.md, "Three departures from
# the seed"). Class aging re-anchors a lifted job's priority by it (queues.ClassQueues.order).
CLASS_ANCHOR: dict[QosClass, int] = {
    q: max((a for a in PRIORITY_ALIASES.values() if class_of_priority(a) >= q), default=min(PRIORITY_ALIASES.values()))
    for q in QosClass
}
