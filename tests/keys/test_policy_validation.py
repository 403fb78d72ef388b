"""What the admin refuses: a best class worse than the default, a tier offset that could cross a
band, a class-lane cap outside 1..--max-batch."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from keys.models import MAX_PRIORITY_OFFSET, SWAP_AFFINITY_BONUS, ClassLaneCap, KeyPolicy
from scheduler.core.qos import PRIORITY_ALIASES, QosClass, band_of


def policy(**fields: object) -> KeyPolicy:
    return KeyPolicy(name="p", **fields)  # type: ignore[arg-type]


def test_the_best_class_may_equal_or_beat_the_default() -> None:
    policy(default_class=QosClass.AGENT, max_class=QosClass.AGENT).clean()
    policy(default_class=QosClass.BACKGROUND, max_class=QosClass.INTERACTIVE).clean()


def test_a_best_class_worse_than_the_default_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        policy(default_class=QosClass.AGENT, max_class=QosClass.BACKGROUND).clean()
    assert "max_class" in err.value.message_dict


@pytest.mark.parametrize("offset", [-MAX_PRIORITY_OFFSET, -1, 0, 2, MAX_PRIORITY_OFFSET])
def test_offsets_up_to_39_either_way_are_accepted(offset: int) -> None:
    policy(priority_offset=offset).clean()


@pytest.mark.parametrize("offset", [MAX_PRIORITY_OFFSET + 1, -(MAX_PRIORITY_OFFSET + 1), 100])
def test_larger_offsets_are_refused(offset: int) -> None:
    with pytest.raises(ValidationError) as err:
        policy(priority_offset=offset).clean()
    assert "priority_offset" in err.value.message_dict


def test_no_allowed_offset_plus_swap_affinity_moves_an_anchor_out_of_its_band() -> None:
    assert MAX_PRIORITY_OFFSET == 39
    for anchor in PRIORITY_ALIASES.values():
        for offset in (-MAX_PRIORITY_OFFSET, MAX_PRIORITY_OFFSET):
            for bonus in (0, SWAP_AFFINITY_BONUS):
                assert band_of(anchor + offset + bonus) == band_of(anchor)


def test_allowed_models_are_split_on_commas_and_newlines() -> None:
    assert policy(allowed_models="a, b\nc,,").model_list == ["a", "b", "c"]
    assert policy(allowed_models="").model_list == []


@override_settings(SUPERFLUID_MAX_BATCH=4)
@pytest.mark.parametrize(("lanes", "ok"), [(1, True), (4, True), (0, False), (5, False)])
def test_a_class_lane_cap_must_be_between_1_and_max_batch(lanes: int, ok: bool) -> None:
    cap = ClassLaneCap(qos_class=QosClass.BACKGROUND, max_lanes=lanes)
    if ok:
        cap.clean()
    else:
        with pytest.raises(ValidationError):
            cap.clean()
