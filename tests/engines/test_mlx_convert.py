"""A GGUF file converted to an MLX model folder: the folder mlx-lm itself loads and answers
with, whose tokenizer gives llama.cpp's token ids, which the MLX engine serves with its
quantised weights (the engine contract runs on the float32 conversion), and whose float32
conversion holds the values the quantised weights stand for."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.model

TEXTS = [
    "What is the capital of France?",
    "  leading spaces, trailing space ",
    "Numbers 1234567 and 3.14159, dates 2026-11-30.",
    "héllo 你好 🙂 naïve café",
    "def f(x):\n\treturn x**2  # squares\n\n\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "don't we'll they've I'm",
]


def test_the_folder_records_the_ggufs_hyper_parameters_and_quantisation(mlx_model_dir: Path) -> None:
    config = json.loads((mlx_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rope_traditional"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert config["tie_word_embeddings"] is True  # SmolLM2 has no output.weight
    assert config["quantization"] == {
        "group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}
    }
    tok_config = json.loads((mlx_model_dir / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>" in tok_config["chat_template"]


def test_the_tokenizer_gives_llama_cpps_token_ids(mlx_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    tok = Tokenizer.from_file(str(mlx_model_dir / "tokenizer.json"))
    with LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=256, max_step_tokens=64) as llama:
        for text in TEXTS:
            assert tok.encode(text, add_special_tokens=False).ids == llama.tokenize(text), text


def test_mlx_lm_loads_the_folder_and_answers_like_llama_cpp(mlx_model_dir: Path) -> None:
    from mlx_lm import generate, load

    model, tokenizer = load(str(mlx_model_dir))
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert generate(model, tokenizer, prompt, max_tokens=12).strip() == "The capital of France is Paris."


def test_an_existing_folder_is_kept_unless_forced_and_a_foreign_one_refused(mlx_model_dir: Path, tmp_path: Path) -> None:
    from scheduler.engines.mlx_convert import ConversionError, convert_gguf
    from scheduler.engines.models import default_model_path

    stamp = (mlx_model_dir / "config.json").stat().st_mtime_ns
    assert convert_gguf(default_model_path(), mlx_model_dir) == mlx_model_dir
    assert (mlx_model_dir / "config.json").stat().st_mtime_ns == stamp
    (tmp_path / "other").mkdir()
    with pytest.raises(ConversionError, match="not an MLX model directory"):
        convert_gguf(default_model_path(), tmp_path / "other")
    with pytest.raises(FileNotFoundError):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")


def test_the_mlxconvert_command_writes_a_folder_mlx_serves(tmp_path: Path) -> None:
    out = StringIO()
    call_command("mlxconvert", "--out", str(tmp_path / "smol"), stdout=out)
    assert f"serve --model {tmp_path / 'smol'}" in out.getvalue()
    from scheduler.engines.models import engine_for

    assert engine_for(tmp_path / "smol") == "mlx"
    assert sorted(p.name for p in (tmp_path / "smol").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]


def test_the_mlx_engine_serves_the_quantised_folder_and_parks_and_restores_a_lane_exactly(mlx_model_dir: Path) -> None:
    from scheduler.core.types import LaneBind, LaneRestore, TickPlan
    from scheduler.engines.mlx import MlxEngine
    from testkit.engine_driver import GREEDY, Run, chat, drive, generate, never, release, text_of

    with MlxEngine(mlx_model_dir, n_lanes=2, lane_ctx=256) as engine:
        prompt = chat(engine, "What is the capital of France?")
        reference = generate(engine, 0, prompt, max_tokens=8)
        release(engine, 0)
        assert text_of(engine, reference).startswith("The capital of France is Paris")
        run = Run(0, prompt, max_tokens=8)
        drive(engine, [run], ticks=4)
        parked = engine.execute(TickPlan(tick=5, park=[(0, "a")]), never).parked["a"]
        assert parked.n_tokens == run.computed
        run.lane = 1
        plan = TickPlan(tick=6, restore=[LaneRestore(1, "a", parked)], bind=[LaneBind(1, "a", GREEDY, list(run.output))], feeds=[run.feed()])
        run.commit(engine.execute(plan, never))
        drive(engine, [run])
        assert run.output == reference


def test_a_float32_conversion_holds_the_dequantised_weights(mlx_model_dir: Path, mlx_float_dir: Path) -> None:
    import mlx.core as mx

    config = json.loads((mlx_float_dir / "config.json").read_text())
    assert "quantization" not in config
    quantised = mx.load(str(mlx_model_dir / "model.safetensors"))
    floats = mx.load(str(mlx_float_dir / "model.safetensors"))
    assert not any(name.endswith((".scales", ".biases")) for name in floats)
    assert {n for n in quantised if not n.endswith((".scales", ".biases"))} == set(floats)
    name = "model.layers.0.mlp.down_proj"
    expected = mx.dequantize(quantised[f"{name}.weight"], quantised[f"{name}.scales"], quantised[f"{name}.biases"], group_size=32, bits=4)
    assert floats[f"{name}.weight"].dtype == mx.float32
    assert mx.array_equal(floats[f"{name}.weight"], expected.astype(mx.float32))
    from scheduler.engines.mlx_convert import ConversionError, convert_gguf
    from scheduler.engines.models import default_model_path

    with pytest.raises(ConversionError, match="dtype must be one of"):
        convert_gguf(default_model_path(), mlx_float_dir.parent / "int8", dtype="int8")


@pytest.mark.parametrize("kind", ["Q5_0", "MXFP4"])
def test_a_gguf_with_a_tensor_type_mlx_cannot_read_is_refused(tmp_path: Path, kind: str) -> None:
    """MLX's GGUF reader fails on some types (Q5_0, Q5_1, IQ4_NL, ...: a RuntimeError, which
    the mlxconvert command printed as a traceback) and silently stops at others (MXFP4, TQ1_0,
    ...), returning only the tensors before it: the converter wrote a folder missing weights,
    or tied the embeddings in place of a missing output.weight."""
    import gguf
    import numpy as np

    from scheduler.engines.mlx_convert import ConversionError, convert_gguf

    path = tmp_path / f"{kind}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    quant = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[quant]
    writer.add_tensor("output.weight", np.zeros((4, size * 32 // block), dtype=np.uint8), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError, match=f"MLX cannot read {kind}.gguf"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
