"""An ``X-LlamaSwap-Priority`` that is no priority (``high``, ``1_00``, empty) is as if not sent,
as the seed groups them ("absent/unparseable means 0"; here absent is the anchor of the class's
band, docs/scheduling.md). It used to count as 0, which alone picked the agent class: a
background key's batch client that sent ``X-LlamaSwap-Priority: high`` ran its work as agent, and
beside ``x-superfluid-qos: interactive`` it ran at 0 instead of 100, behind agents in the router."""

from __future__ import annotations

import pytest

from keys.runtime import Policy
from scheduler.core.qos import QosClass, priority_parses

from .test_admission import IP, admit, bearer, chat, key, runtime

pytestmark = pytest.mark.django_db

UNPARSEABLE = ["high", "", "  ", "1_00", "１００", "0x10", "1e3", "+", "NaN"]


@pytest.mark.parametrize("raw", UNPARSEABLE)
async def test_an_unparseable_priority_leaves_a_keys_default_class_and_its_band(raw: str) -> None:
    rt = runtime(key("sf-k", "k", Policy(name="jobs", default_class=QosClass.BACKGROUND, max_class=QosClass.AGENT)))
    admission = await admit(bearer("sf-k", **{"x-llamaswap-priority": raw}), IP, chat(), runtime=rt)
    assert (admission.qos, admission.priority, admission.band) == (QosClass.BACKGROUND, -100, "batch")


@pytest.mark.parametrize("raw", UNPARSEABLE)
async def test_beside_a_class_header_an_unparseable_priority_is_the_class_anchor(raw: str) -> None:
    admission = await admit({"x-superfluid-qos": "interactive", "x-llamaswap-priority": raw}, IP, chat(), runtime=runtime())
    assert (admission.qos, admission.priority, admission.band) == (QosClass.INTERACTIVE, 100, "interactive")


@pytest.mark.parametrize(("raw", "qos", "priority"), [("0", QosClass.AGENT, 0), ("-7", QosClass.AGENT, -7), (" batch ", QosClass.BACKGROUND, -100), ("+120", QosClass.INTERACTIVE, 120)])
async def test_a_priority_that_parses_still_picks_the_class_of_its_band(raw: str, qos: QosClass, priority: int) -> None:
    admission = await admit({"x-llamaswap-priority": raw}, IP, chat(), runtime=runtime())
    assert (admission.qos, admission.priority) == (qos, priority)
    assert priority_parses(raw)
