"""Build an MLX model directory (mlx-lm's llama layout) from a llama-architecture GGUF file.

``mlx.core.load(gguf, return_metadata=True)`` reads Q4_0/Q4_1/Q8_0 tensors as MLX affine-quantised
weights (group size 32) with scales and biases, other tensors as plain arrays, and the GGUF
metadata. This module renames the tensors to mlx-lm's names, writes ``config.json`` from the
GGUF hyper-parameters and a ``tokenizer.json`` built with the ``tokenizers`` library from the
GGUF vocabulary, so ``mlx_lm.load(dir)`` (and the MLX engine) serve the same model that
llama.cpp serves from the file. Nothing is re-quantised: the weights are the GGUF's own, or,
with ``dtype``, those same values dequantised to plain float arrays (faster on MLX's CPU
backend, which multiplies float weights through BLAS: ``scheduler.engines.mlx_runtime``).

Limits: llama architecture, GPT-2 style byte-level BPE vocabularies (``tokenizer.ggml.model``
``gpt2``) with the pre-tokenizers listed in ``_PRE_TOKENIZERS``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from scheduler.engines.models import is_mlx_model_dir

GROUP_SIZE = 32  # the block size of GGUF's Q4_0, Q4_1 and Q8_0
# llama.cpp token types (llama_token_type): 1 normal, 2 unknown, 3 control, 4 user defined,
# 5 unused, 6 byte.
_CONTROL, _USER_DEFINED = 3, 4

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# tokenizer.ggml.pre -> the regular expressions llama.cpp splits text with before BPE
# (llama-vocab.cpp), each applied in turn as in its pre-tokenizer.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS: dict[str, list[str]] = {
    "gpt2": [_GPT2_REGEX],
    "default": [_GPT2_REGEX],
    "smollm": [r"\p{N}", _GPT2_REGEX],
    "llama-bpe": [_LLAMA3_REGEX],
    "llama3": [_LLAMA3_REGEX],
}

# the pre-tokenizers for which llama.cpp adds a BOS when the GGUF has no add_bos_token (llama-vocab.cpp)
_BOS_FIRST = frozenset({"llama-bpe", "llama3"})


class ConversionError(Exception):
    """The GGUF file is not one this converter can turn into an MLX model directory."""


def _scalar(value: Any) -> Any:
    """GGUF numbers arrive as 0-d mx.arrays; plain Python values otherwise."""
    return value.item() if hasattr(value, "item") else value


def _rename(name: str) -> str:
    stem, _, kind = name.rpartition(".")  # kind: weight, scales or biases
    if stem in _TOP_TENSORS:
        return f"{_TOP_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    raise ConversionError(f"unexpected tensor {name!r} in a llama GGUF")


def _quantization(weights: dict[str, Any]) -> dict[str, Any] | None:
    """mlx-lm's ``quantization`` entry: a default (the most common bits) and one entry per
    module that differs (in SmolLM2 the 8-bit token embedding beside 4-bit layers)."""
    bits_of: dict[str, int] = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            module = name[: -len(".scales")]
            packed = weights[module + ".weight"]
            # uint32 words per row * 32 bits = in_features * bits; in_features = groups * 32
            bits_of[module] = packed.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)
    if not bits_of:
        return None
    counts: dict[int, int] = {}
    for bits in bits_of.values():
        counts[bits] = counts.get(bits, 0) + 1
    default = max(counts, key=lambda b: counts[b])
    quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default}
    for module, bits in sorted(bits_of.items()):
        if bits != default:
            quant[module] = {"group_size": GROUP_SIZE, "bits": bits}
    return quant


def _config(meta: dict[str, Any], weights: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ConversionError(f"the GGUF has no llama.{key}")
        return _scalar(value)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(f"{get('attention.layer_norm_rms_epsilon'):.7g}"),  # a float32 in the GGUF
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        # convert_hf_to_gguf.py permutes q/k rows for llama.cpp's interleaved ("normal") RoPE;
        # mlx-lm's traditional RoPE is that same pairing.
        "rope_traditional": True,
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": _scalar(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": _end_tokens(meta, vocab_size),
    }
    quant = _quantization(weights)
    if quant is not None:
        config["quantization"] = quant
        config["quantization_config"] = quant
    return config


def _end_tokens(meta: dict[str, Any], vocab_size: int) -> int | list[int]:
    """config.json's ``eos_token_id``: the GGUF's EOS, and with it the end-of-turn and
    end-of-message tokens its metadata names (llama.cpp ends generation on them too; an id
    outside the vocabulary, as it, not)."""
    ids = [int(_scalar(meta.get("tokenizer.ggml.eos_token_id", 2)))]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        token = int(_scalar(meta[key])) if key in meta else -1
        if 0 <= token < vocab_size and token not in ids:
            ids.append(token)
    return ids[0] if len(ids) == 1 else ids


def _tokenizer(meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(tokenizers.Tokenizer, tokenizer_config.json contents) from the GGUF vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConversionError(f"only GPT-2 style BPE vocabularies convert; this GGUF's is {kind!r}")
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE_TOKENIZERS:
        raise ConversionError(f"unsupported pre-tokenizer {pre!r} (known: {', '.join(sorted(_PRE_TOKENIZERS))})")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges: list[str] = list(meta.get("tokenizer.ggml.merges") or [])
    types = [int(t) for t in meta["tokenizer.ggml.token_type"].tolist()] if "tokenizer.ggml.token_type" in meta else [1] * len(tokens)

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    splits = [
        pre_tokenizers.Split(Regex(expr), behavior="isolated", invert=False) for expr in _PRE_TOKENIZERS[pre]
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
        for i in range(len(tokens))
        if types[i] in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_tokens(added)  # AddedToken(special=...) decides whether decoding skips it

    def token_text(key: str) -> str | None:
        value = meta.get(key)
        return None if value is None else tokens[int(_scalar(value))]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(_scalar(meta.get("llama.context_length", 2048))),
        "clean_up_tokenization_spaces": False,
        # llama.cpp's default where the GGUF does not say: a BOS first for Llama 3's pre-tokenizer
        "add_bos_token": bool(_scalar(meta.get("tokenizer.ggml.add_bos_token", pre in _BOS_FIRST))),
        "add_eos_token": False,
    }
    for gguf_name, hf_name in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
        text = token_text(f"tokenizer.ggml.{gguf_name}_token_id")
        if text is not None:
            config[f"{hf_name}_token"] = text
    template = meta.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    return tok, config


def _tensor_count(path: Path) -> int:
    """The number of tensors a GGUF file's header declares."""
    with path.open("rb") as f:
        head = f.read(16)  # magic, version (uint32), tensor count (uint64), little-endian
    if len(head) < 16 or head[:4] != b"GGUF":
        raise ConversionError(f"{path.name} is not a GGUF file")
    return int.from_bytes(head[8:16], "little")


DTYPES = ("float32", "float16", "bfloat16")


def _dequantized(mx: Any, weights: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """Every weight as a plain ``dtype_name`` array: quantised ones through ``mx.dequantize``
    (exactly the values the quantised model multiplies by), their scales and biases dropped."""
    dtype = getattr(mx, dtype_name)
    quant = _quantization(weights) or {}
    out: dict[str, Any] = {}
    for name, value in weights.items():
        if name.endswith((".scales", ".biases")):  # a quantised module's (a plain bias is .bias)
            continue
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module + ".scales" in weights:
            bits = quant.get(module, quant)["bits"]
            value = mx.dequantize(value, weights[module + ".scales"], weights.get(module + ".biases"), group_size=GROUP_SIZE, bits=bits, dtype=dtype)
        out[name] = value.astype(dtype)
    return out


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, force: bool = False, dtype: str | None = None) -> Path:
    """Write an MLX model directory for ``gguf_path`` at ``out_dir`` and return it.

    ``dtype`` (one of ``DTYPES``) writes every weight dequantised to that type; by default the
    GGUF's quantised weights are kept as they are. The directory appears whole or not at all
    (built beside it, then renamed), so a reader never sees half a model. An existing directory
    is kept unless ``force``."""
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    from scheduler.engines.mlx_runtime import mlx_core

    mx = mlx_core()

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    if out_dir.exists() and not force:
        if is_mlx_model_dir(out_dir):
            return out_dir
        raise ConversionError(f"{out_dir} exists and is not an MLX model directory")
    declared = _tensor_count(gguf_path)
    try:
        tensors, meta = mx.load(str(gguf_path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:  # a tensor type its reader cannot convert
        raise ConversionError(f"MLX cannot read {gguf_path.name}: {exc}") from None
    read = [name for name in tensors if not name.endswith((".scales", ".biases"))]
    if len(read) != declared:
        # MLX's GGUF reader stops at a tensor type it does not know (MXFP4, TQ1_0, ...) and
        # returns the tensors before it: a model missing weights, or one whose missing
        # output.weight would pass for tied embeddings
        raise ConversionError(
            f"MLX cannot read {gguf_path.name}: it read {len(read)} of its {declared} tensors "
            "(a tensor type MLX's GGUF reader does not know)"
        )
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ConversionError(f"only llama-architecture GGUFs convert; this one is {arch!r}")
    weights = {_rename(name): value for name, value in tensors.items()}
    if dtype is not None:
        weights = _dequantized(mx, weights, dtype)
    tokenizer, tok_config = _tokenizer(meta)
    config = _config(meta, weights, vocab_size=len(meta["tokenizer.ggml.tokens"]))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        mx.save_safetensors(str(build / "model.safetensors"), weights, metadata={"format": "mlx"})
        (build / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tokenizer.save(str(build / "tokenizer.json"))
        (build / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
        if force and out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(build, out_dir)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out_dir


def default_mlx_dir(gguf_path: str | Path) -> Path:
    """Where a GGUF converts to by default: ``<name>-mlx`` in a per-user cache folder."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "superfluid" / "mlx" / f"{Path(gguf_path).stem}-mlx"
