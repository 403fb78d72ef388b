"""A repetition whose maximum is below its minimum (``x{3,1}``): llama.cpp's grammar parser took
max - min as a count of copies and allocated until the worker was killed (measured: the process
aborted, "cannot allocate memory"). It comes from a client's own grammar, or from a schema whose
``minLength`` is above its ``maxLength`` (``minItems``/``maxItems``, a pattern's ``{m,n}``): a
schema no value fits. Each is a 400 before llama.cpp parses anything."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.engines.grammar import GrammarError, check_bounds, schema_grammar, tool_grammar


def test_a_grammar_repeating_at_least_more_than_at_most_is_refused() -> None:
    for grammar in ('root ::= "a"{3,1}', "root ::= x{ 5 , 4 }\nx ::= [a-z]", 'root ::= ("a" "b"){2,0}'):
        with pytest.raises(GrammarError, match="at least"):
            check_bounds(grammar)
    for grammar in ('root ::= "a"{3,3}', 'root ::= "a"{3,}', 'root ::= "a"{0,0} "b"', 'root ::= "a"{3}'):
        check_bounds(grammar)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": 3, "maxLength": 1},
        {"type": ["string", "null"], "minLength": 3, "maxLength": 1},
        {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
        {"type": "array", "minItems": 3, "maxItems": 1},
        {"type": "string", "pattern": "^a{3,1}$"},
    ],
)
def test_a_schema_whose_minimum_is_above_its_maximum_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError, match="minimum of 3 is above the maximum of 1"):
        check_bounds(schema_grammar(schema))
    tool = {"name": "f", "description": "", "parameters": {"type": "object", "properties": {"v": schema}, "required": ["v"]}}
    with pytest.raises(GrammarError, match="minimum of 3"):
        tool_grammar([tool], "required", False)
