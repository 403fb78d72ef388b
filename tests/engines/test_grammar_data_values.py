"""An ``enum``'s or a ``const``'s value is data, not a schema: one that looks like an integer's
schema with bounds (a tool that takes field definitions, a schema about schemas) was rewritten
into the enum of the integers in range, so the value the schema fixes no longer fitted."""

from __future__ import annotations

import pytest

from scheduler.engines.grammar import GrammarError, schema_grammar
from tests.engines.test_grammar_keywords import assert_schema

FIELD = {"type": "integer", "minimum": 1, "maximum": 3}


def test_a_const_or_enum_value_shaped_like_a_bounded_integer_is_kept() -> None:
    assert_schema({"const": FIELD}, good=[FIELD], bad=[1, 2, [1, 2, 3]])
    assert_schema({"enum": [FIELD, "none"]}, good=[FIELD, "none"], bad=[1])
    assert_schema(
        {"type": "object", "properties": {"field": {"const": FIELD}}, "required": ["field"], "additionalProperties": False},
        good=[{"field": FIELD}],
        bad=[{"field": 2}],
    )


def test_properties_named_like_the_data_keywords_keep_their_bounds() -> None:
    assert_schema(
        {"type": "object", "properties": {"enum": FIELD, "const": FIELD}, "required": ["enum", "const"], "additionalProperties": False},
        good=[{"enum": 1, "const": 3}],
        bad=[{"enum": 0, "const": 1}, {"enum": 1, "const": 4}],
    )


def test_enum_and_const_values_hold_to_the_type_beside_them() -> None:
    """The converter wrote every enum value whatever the ``type`` beside it: ``1`` fitted
    ``{"type": "string", "enum": ["a", 1]}``."""
    assert_schema({"type": "string", "enum": ["a", 1]}, good=["a"], bad=[1])
    assert_schema({"type": ["string", "null"], "enum": ["a", 1, None, True]}, good=["a", None], bad=[1, True])
    assert_schema({"type": "integer", "enum": [1, 1.5, "2", True]}, good=[1], bad=[1.5, "2", True])
    with pytest.raises(GrammarError, match="enum"):
        schema_grammar({"type": "integer", "enum": ["a"]})
    with pytest.raises(GrammarError, match="const"):
        schema_grammar({"type": "integer", "const": "a"})
