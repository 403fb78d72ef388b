"""Structured output: additional keys never a declared name, property names any JSON string (MLX too)."""

from __future__ import annotations

import ctypes
import functools
import json
import math
from typing import Any

from scheduler.engines.grammar import schema_grammar
from tests.engines.test_grammar_keywords import assert_schema


def test_additional_properties_do_not_let_a_declared_name_through_with_the_wrong_type() -> None:
    """``additionalProperties`` (true or a schema) allowed a declared property's name as an
    extra key, so its declared type did not hold: ``{"n": "x"}`` fitted ``n: integer``.
    llama.cpp's own converter keeps the declared names out of the extra-key rule."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert_schema(schema, good=[{}, {"n": 1}, {"m": "x"}, {"n": 1, "m": "x"}, {"nn": "x"}, {"": "x"}], bad=[{"n": "x"}, {"n": 1, "n2": 2}])
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["n"],
        "additionalProperties": True,
    }
    assert_schema(
        schema,
        good=[{"n": 1}, {"n": 1, "name": "a"}, {"n": 1, "na": [1]}, {"n": 1, "names": None}, {"n": 1, "x": {}}],
        bad=[{"n": "x"}, {"n": 1, "name": 2}],
    )


def test_declared_names_with_grammar_special_characters_are_kept_out_of_extra_keys() -> None:
    schema = {
        "type": "object",
        "properties": {'a"b': {"type": "integer"}, "c]-^\\": {"type": "integer"}, "é": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    assert_schema(
        schema,
        good=[{'a"b': 1}, {"c]-^\\": 2}, {"é": 3}, {"a": "x"}, {"c]": "x"}, {"x": "y"}],
        bad=[{'a"b': "x"}, {"c]-^\\": "x"}, {"é": "x"}],
    )


@functools.cache
def _llama_vocab() -> Any:
    import llama_cpp

    from scheduler.engines.models import default_model_path

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(default_model_path()).encode(), params)
    assert model
    return model, llama_cpp.llama_model_get_vocab(model)


def llama_fits(gbnf: str, text: str) -> bool:
    """Whether llama.cpp's own grammar sampler takes ``text`` (the bundled model's tokens of it)
    and may then end."""
    import llama_cpp

    _, vocab = _llama_vocab()
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    assert smpl, "llama.cpp does not parse the grammar"
    data = text.encode("utf-8")
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), False, False)
    one = (llama_cpp.llama_token_data * 1)()
    array = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)

    def allows(token: int) -> bool:
        one[0] = llama_cpp.llama_token_data(token, 1.0, 0.0)
        array.data, array.size, array.selected, array.sorted = one, 1, -1, False
        llama_cpp.llama_sampler_apply(smpl, ctypes.pointer(array))
        return not math.isinf(one[0].logit)

    try:
        for token in tokens[:n]:
            if not allows(token):
                return False
            llama_cpp.llama_sampler_accept(smpl, token)
        return allows(llama_cpp.llama_vocab_eos(vocab))
    finally:
        llama_cpp.llama_sampler_free(smpl)


def test_llama_cpp_parses_the_extra_key_rule_and_enforces_it() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, 'q"]-\\': {"type": "integer"}, "é": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    grammar = schema_grammar(schema)
    for value in ({"n": 1}, {"m": "x"}, {'q"]-\\': 1}, {"é": 2}, {"q": "x"}, {"é2": "x"}, {"n": 1, "-": "y"}):
        assert llama_fits(grammar, json.dumps(value)), value
    assert llama_fits(grammar, '{"\\u00e8": "x"}')
    for value in ({"n": "x"}, {'q"]-\\': "x"}, {"é": "x"}):
        assert not llama_fits(grammar, json.dumps(value)), value
    assert not llama_fits(grammar, '{"é": "x"}')  # the raw form of a declared name too


def test_properties_named_with_a_digit_or_a_non_ascii_letter_first_compile_for_mlx() -> None:
    """The converter names a property's rule after it (``é`` -> ``--kv``, ``1st`` -> ``1st-kv``),
    which is no Lark name: llguidance refused the grammar, so on MLX a schema with a property
    ``名前``, ``é`` or ``1st`` was a 400 (llama.cpp took it)."""
    for name in ("名前", "é", "1st", "_x"):
        schema = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name], "additionalProperties": False}
        assert_schema(schema, good=[{name: 1}], bad=[{name: "x"}, {}])


def test_long_and_many_declared_names_beside_additional_properties_compile_on_both_engines() -> None:
    """The extra-key rule is a trie of the declared names: it must stay within llguidance's
    nesting limit (a 31-character name) and llama.cpp's repetition limit (hundreds of names)."""
    long_name = "customer_billing_address_line_1"
    schema = {"type": "object", "properties": {long_name: {"type": "integer"}, "x" * 300: {"type": "integer"}}, "additionalProperties": True}
    assert_schema(schema, good=[{long_name: 1}, {long_name[:-1]: "s"}, {"x" * 300: 2, "x" * 301: "s"}], bad=[{long_name: "s"}, {"x" * 300: "s"}])
    grammar = schema_grammar(schema)
    assert llama_fits(grammar, json.dumps({long_name: 1})) and not llama_fits(grammar, json.dumps({long_name: "s"}))
    many = {"type": "object", "properties": {f"prop_{i}_name": {"type": "integer"} for i in range(400)}, "additionalProperties": True}
    grammar = schema_grammar(many)
    assert llama_fits(grammar, json.dumps({"prop_7_name": 1, "prop_7_nam": "s"})) and not llama_fits(grammar, json.dumps({"prop_7_name": "s"}))
    assert_schema(many, good=[{"prop_399_name": 1, "prop_4000_name": "s"}], bad=[{"prop_399_name": "s"}])


def test_a_property_named_with_the_empty_string_is_a_property_not_the_root() -> None:
    """A top-level property ``""`` got the rule name ``""``, which is the root's: the grammar's
    root became the property's type, so the reply was a bare integer, not the object."""
    schema = {"type": "object", "properties": {"": {"type": "integer"}}, "required": [""], "additionalProperties": False}
    assert_schema(schema, good=[{"": 1}], bad=[1, {"": "x"}, {}])
    grammar = schema_grammar(schema)
    assert llama_fits(grammar, json.dumps({"": 1})) and not llama_fits(grammar, "1")
