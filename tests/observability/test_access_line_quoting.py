"""The access log's line for one request stays one line with one value per field, whatever the
key's or the model's name holds (a newline, a space, a quote, an ``=``, a Unicode line break)."""

from __future__ import annotations

import json
import re

import pytest

from api.records import RequestRecord, access_line

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')


@pytest.mark.parametrize(
    "name",
    ["team a", "x\nchat forged status=200 key=admin", 'say "hi"', "a=b", "tab\there", "line\u2028sep", "nel\x85x", "back\\slash", "ctrl\x1b[2J"],
)
def test_a_key_or_model_name_with_hostile_text_stays_one_field_of_one_line(name: str) -> None:
    line = access_line(RequestRecord(endpoint="chat", request_id="r1", key_name=name, model=name, status=200, usage={"prompt_tokens": 3}))
    assert len(line.splitlines()) == 1
    fields = dict(FIELD.findall(line))
    assert " ".join(f"{k}={v}" for k, v in FIELD.findall(line)) == line.split(" ", 2)[2]  # nothing else on the line
    assert json.loads(fields["key"]) == name and json.loads(fields["model"]) == name
    assert fields["status"] == "200" and fields["prompt"] == "3" and fields["preemptions"] == "-"


def test_plain_names_are_written_as_they_are() -> None:
    line = access_line(RequestRecord(endpoint="chat", request_id="abc", key_name="élodie", model="SmolLM2-1.7B", status=200))
    assert line.startswith("chat abc status=200 key=élodie model=SmolLM2-1.7B class=- ")
