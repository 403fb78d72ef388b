"""Fuzz: whatever class and priority headers a keyed request sends, it never runs above its
policy's best class nor at a priority in a band above it, and a refusal is only ever 403
``qos_class_forbidden`` or 400 ``invalid_qos_class``."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.admission import PRIORITY_LIMIT, admit
from api.errors import ApiError
from keys.runtime import Policy
from scheduler.core.qos import QosClass, class_of_priority
from tests.keys.test_admission import IP, bearer, chat, key, runtime

classes = st.sampled_from(list(QosClass))
header_values = st.one_of(
    st.sampled_from(["interactive", "normal", "batch", "0", "1", "2", "3", "agent", "background", "completion", " 100 ", "+50", "-50", "49", "-49", "1e2", ""]),
    st.integers(-(10**12), 10**12).map(str),
    st.text(st.characters(max_codepoint=0xFF), max_size=8),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    default=classes, best=classes, offset=st.integers(-39, 39),
    qos=st.none() | header_values, priority=st.none() | header_values,
)
def test_a_key_never_runs_above_its_best_class_or_band(default: QosClass, best: QosClass, offset: int, qos: str | None, priority: str | None) -> None:
    import asyncio

    if best > default:
        best = default
    policy = Policy(name="p", default_class=default, max_class=best, priority_offset=offset)
    headers = {}
    if qos is not None:
        headers["x-superfluid-qos"] = qos
    if priority is not None:
        headers["x-llamaswap-priority"] = priority

    async def run() -> None:
        rt = runtime(key("sf-k", "k", policy))
        try:
            admission = await admit(bearer("sf-k", **headers), IP, chat(), runtime=rt)
        except ApiError as exc:
            assert exc.code in ("qos_class_forbidden", "invalid_qos_class"), exc
            assert rt.slots.held == {} and rt.in_flight.held == {}
            return
        assert admission.qos >= best, (admission.qos, best)
        assert class_of_priority(admission.priority) >= best, (admission.priority, best)
        assert -PRIORITY_LIMIT - 39 <= admission.priority <= PRIORITY_LIMIT + 39
        await admission.release()
        assert rt.slots.held == {} and rt.in_flight.held == {}

    asyncio.run(run())
