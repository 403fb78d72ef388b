"""A client's GBNF grammar on the MLX engine: a rule made a terminal (one lexeme) whose text may go
on with the characters that begin what follows it. llguidance's lexer is greedy and does not
back up, so it read what follows as more of that lexeme and refused every text that ends the
grammar: ``root ::= "{" val "}"`` with ``val ::= [^\\n]+`` could never close its ``}`` (a reply
ran to max_tokens), where llama.cpp's sampler takes it."""

from __future__ import annotations

import pytest

from tests.engines.test_grammar_extra_keys import llama_fits
from tests.engines.test_grammar_keywords import fits

CASES = [
    ('root ::= "{" val "}"\nval ::= [^\\n]+', "{ab}", "{ab"),
    ('root ::= word "end"\nword ::= [a-z]+', "abcend", "abcen"),
    ('root ::= word " " word\nword ::= [a-z ]+', "ab cd", "ab"),
    ('root ::= pair ";" pair\npair ::= ("a" | "ab") "x"?', "abx;a", "ab;"),
    # a rule that is never empty but may end after any character, where "<" may go on (a tagged
    # tool format's text of a least length, then its closing): its "<" lexeme read "</a>"
    pytest.param(
        'root ::= "[" t0 "</a>"\nt0 ::= [^<] t1 | "<" t2\nt1 ::= | [^<] t1 | "<" t2\nt2 ::= | [^/<] t1 | "<" t2 | "/" t3\nt3 ::= | [^a<] t1 | "<" t2',
        "[<</x</a>",
        "[</a>",
        id="text-of-a-least-length-then-a-closing",
    ),
]


@pytest.mark.parametrize(("gbnf", "good", "bad"), CASES)
def test_a_terminal_that_may_go_on_into_what_follows_it_fits_as_on_llama_cpp(gbnf: str, good: str, bad: str) -> None:
    assert llama_fits(gbnf, good) and not llama_fits(gbnf, bad)
    assert fits(gbnf, good), f"{good!r} fits {gbnf!r} on llama.cpp but not on the MLX engine"
    assert not fits(gbnf, bad)


def test_an_object_of_hundreds_of_optional_properties_converts_for_the_mlx_engine() -> None:
    """Each optional property's rule names the next one's: the check above, walking that chain
    one rule within another, went past Python's stack, and the grammar "did not parse" (a 400 on
    MLX for a schema llama.cpp takes)."""
    from scheduler.engines.grammar import schema_grammar

    # (480: from about 500, llguidance's parser holds more than its 2,000 items a row, on the
    # converter's own rule too)
    grammar = schema_grammar({"type": "object", "properties": {f"q{i}": {"type": "integer"} for i in range(480)}})
    assert fits(grammar, '{"q0": 1, "q479": 2}') and not fits(grammar, '{"q479": 2, "q0": 1}')
