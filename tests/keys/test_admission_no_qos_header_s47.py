"""docs/scheduling.md, Classes: under ``--no-http-qos-header`` neither header chooses the class,
without a key too: ``X-LlamaSwap-Priority`` alone, which otherwise picks the class of its band,
leaves the request in ``--http-default-qos``; its value still is the request's priority."""

from __future__ import annotations

import pytest
from django.test import override_settings

from api.admission import admit
from scheduler.core.qos import QosClass

from .test_admission import IP, chat, runtime


@pytest.mark.parametrize(("header", "priority"), [("interactive", 100), ("250", 250), ("batch", -100)])
@override_settings(SUPERFLUID_HTTP_QOS_HEADER=False, SUPERFLUID_HTTP_DEFAULT_QOS="background")
async def test_under_no_http_qos_header_the_priority_header_alone_keeps_the_default_class(header: str, priority: int) -> None:
    admission = await admit({"x-llamaswap-priority": header}, IP, chat(), runtime=runtime())
    assert (admission.qos, admission.priority) == (QosClass.BACKGROUND, priority)


@override_settings(SUPERFLUID_HTTP_QOS_HEADER=True, SUPERFLUID_HTTP_DEFAULT_QOS="background")
async def test_with_the_qos_header_honoured_the_priority_header_alone_picks_its_bands_class() -> None:
    admission = await admit({"x-llamaswap-priority": "interactive"}, IP, chat(), runtime=runtime())
    assert (admission.qos, admission.priority) == (QosClass.INTERACTIVE, 100)
