"""Which token-mask library for the MLX engine's constrained sampling? llguidance, xgrammar and
outlines-core on the same JSON Schema and the bundled SmolLM2's vocabulary (49152 tokens).

For each library: the time to build its tokenizer view once (cached by the engine), the time to
compile the schema (the engine compiles once per request), and the time per token of computing
the allowed-token mask and advancing the matcher, walking the tokens of one valid reply. Where
a library takes a grammar, the same is timed for the GBNF that ``scheduler.engines.grammar``
makes from the schema (what the llama.cpp engine is given, and so what the MLX engine gets).
Median of ``--repeat`` runs; prints a Markdown table (docs/engines.md quotes it).

    pip install llguidance xgrammar outlines-core
    python bench/token_masks.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.engines.grammar import schema_grammar  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string"},
        "likes": {"type": "array", "items": {"type": "string", "enum": ["tea", "coffee", "books", "music"]}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "likes"],
    "additionalProperties": False,
}
# the schema's property order is the GBNF's (llama-cpp-python's converter puts name first, then
# sorts), so one reply fits every library's reading of it
REPLY = '{"name": "Ada Lovelace", "age": 36, "city": "London, the capital", "likes": ["tea", "books"]}'


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def tokenizer_json() -> tuple[str, Path]:
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    folder = convert_gguf(default_model_path(), Path(tempfile.mkdtemp()) / "smollm2-mlx")
    return (folder / "tokenizer.json").read_text(encoding="utf-8"), folder


def run_llguidance(tok_json: str, eos: int, n_vocab: int, tokens: list[int], grammar: str) -> tuple[float, float, float]:
    import llguidance
    import llguidance.numpy as lnp

    t_tok, tokenizer = timed(lambda: llguidance.LLTokenizer(tok_json, n_vocab=n_vocab, eos_token=eos))
    if grammar == "schema":
        text = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": True})
    else:
        text = llguidance.grammar_from("lark", llguidance.gbnf_to_lark.gbnf_to_lark(schema_grammar(SCHEMA)))
    t_compile, matcher = timed(lambda: llguidance.LLMatcher(tokenizer, text))
    assert not matcher.is_error(), matcher.get_error()
    mask = lnp.allocate_token_bitmask(1, n_vocab)
    t = time.perf_counter()
    for token in tokens:
        lnp.fill_next_token_bitmask(matcher, mask, 0)
        assert mask[0, token // 32] >> (token % 32) & 1, f"llguidance refused token {token}"
        assert matcher.consume_token(token), matcher.get_error()
    per_token = (time.perf_counter() - t) / len(tokens)
    return t_tok, t_compile, per_token


def run_xgrammar(folder: Path, eos: int, n_vocab: int, tokens: list[int], grammar: str) -> tuple[float, float, float]:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))  # type: ignore[no-untyped-call]
    t_tok, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=n_vocab, stop_token_ids=[eos]))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    if grammar == "schema":
        t_compile, compiled = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True))
    else:
        t_compile, compiled = timed(lambda: compiler.compile_grammar(schema_grammar(SCHEMA)))
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, n_vocab)
    t = time.perf_counter()
    for token in tokens:
        matcher.fill_next_token_bitmask(mask)
        assert int(mask[0, token // 32]) >> (token % 32) & 1, f"xgrammar refused token {token}"
        assert matcher.accept_token(token)
    per_token = (time.perf_counter() - t) / len(tokens)
    return t_tok, t_compile, per_token


def run_outlines(tok_json: str, eos: int, n_vocab: int, tokens: list[int]) -> tuple[float, float, float]:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    from scheduler.engines.hf_vocab import byte_decoder

    model = json.loads(tok_json)["model"]["vocab"]
    bytes_of = byte_decoder()

    def vocabulary() -> Any:
        table: dict[bytes, list[int]] = {}
        for piece, i in model.items():
            if i != eos:
                table.setdefault(bytes(bytes_of[c] for c in piece), []).append(i)
        return outlines_core.Vocabulary(eos, table)

    t_tok, vocab = timed(vocabulary)
    regex = build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")
    t_compile, index = timed(lambda: outlines_core.Index(regex, vocab))
    guide = outlines_core.Guide(index)
    mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    t = time.perf_counter()
    for token in tokens:
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        assert int(mask[token // 32]) >> (token % 32) & 1, f"outlines-core refused token {token}"
        guide.advance(token)
    per_token = (time.perf_counter() - t) / len(tokens)
    return t_tok, t_compile, per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tok_json, folder = tokenizer_json()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tok_json)
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None, "SmolLM2's <|im_end|> is its end of turn"
    tokens = tok.encode(REPLY, add_special_tokens=False).ids + [eos]
    cases: list[tuple[str, Callable[[], tuple[float, float, float]]]] = [
        ("llguidance, JSON Schema", lambda: run_llguidance(tok_json, eos, n_vocab, tokens, "schema")),
        ("llguidance, our GBNF", lambda: run_llguidance(tok_json, eos, n_vocab, tokens, "gbnf")),
        ("xgrammar, JSON Schema", lambda: run_xgrammar(folder, eos, n_vocab, tokens, "schema")),
        ("xgrammar, our GBNF", lambda: run_xgrammar(folder, eos, n_vocab, tokens, "gbnf")),
        ("outlines-core, JSON Schema (regex)", lambda: run_outlines(tok_json, eos, n_vocab, tokens[:-1])),
    ]
    print(f"SmolLM2 vocabulary: {n_vocab} tokens; reply: {len(tokens)} tokens; median of {args.repeat}\n")
    print("| library, input | tokenizer setup ms | compile ms | mask + advance µs/token |")
    print("|---|--:|--:|--:|")
    for name, fn in cases:
        try:
            runs = [fn() for _ in range(args.repeat)]
        except Exception as exc:  # a library missing or refusing the input is a row, not a crash
            print(f"| {name} | {type(exc).__name__}: {str(exc)[:60]} | | |")
            continue
        setup, compile_s, per = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"| {name} | {setup * 1e3:.1f} | {compile_s * 1e3:.1f} | {per * 1e6:.0f} |")


if __name__ == "__main__":
    main()
