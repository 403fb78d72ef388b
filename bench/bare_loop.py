"""The physical limit: N greedy streams over llama-cpp-python's low-level API, nothing else.

No server, no scheduler, no superfluid engine code (only its choice of llama.cpp's extra buffer
types, so that all sides load the weights alike: off where the build meets an AMX CPU, as
superfluid's ``--repack auto`` and the peer's ``--no-repack``): one context with per-sequence KV streams
(as llama-server and the superfluid engine run it), every prompt prefilled, then all sequences
decoded together one token each per ``llama_decode`` until each has ``max_tokens``. End-of-
generation tokens are ignored so every stream produces exactly ``max_tokens``; the numbers are
what a perfect server could reach on this machine with this model.

    python bench/bare_loop.py --streams 8 --max-tokens 128
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp

# Run as a script from anywhere: the repository root holds the ``scheduler`` package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scheduler.engines.llama_cpp import repack_here  # noqa: E402
from scheduler.engines.models import default_model_path  # noqa: E402

SEQ_CTX = 4096  # context per sequence, the server's default lane_ctx


@llama_cpp.llama_log_callback
def _quiet(level: int, text: bytes | None, user: ctypes.c_void_p) -> None:
    """llama.cpp writes every load step to stderr otherwise."""


def _tokenize(vocab: Any, text: str) -> list[int]:
    data = text.encode("utf-8")
    size = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * size)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, size, False, True)
        if n >= 0:
            tokens = list(buf[:n])
            break
        size = -n
    if llama_cpp.llama_vocab_get_add_bos(vocab):
        bos = llama_cpp.llama_vocab_bos(vocab)
        if not tokens or tokens[0] != bos:
            tokens.insert(0, bos)
    return tokens


def run_bare_loop(
    model_path: str | Path,
    prompts: list[str],
    max_tokens: int,
    n_threads: int | None = None,
    n_batch: int = 512,
    prompt_limit: int | None = None,
    seqs: int | None = None,
) -> dict[str, Any]:
    """Prefill every prompt (one batch per sequence), then decode all sequences together.

    Returns streams, prompt_tokens, completion_tokens, seconds (prefill + decode wall time),
    tokens_per_s (completion tokens over that whole time), decode_tokens_per_s (completion
    tokens over decode time alone), prefill_tokens_per_s and exact_length (every stream
    produced exactly max_tokens, EOG ignored). ``prompt_limit`` cuts every tokenized prompt to
    that many tokens (for a prompt of an exact length). ``seqs``: sequences the context holds
    (default: one per prompt; a server's lane count, for its context's shape)."""
    if not prompts:
        raise ValueError("need at least one prompt")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    L = llama_cpp
    L.llama_log_set(_quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    threads = n_threads or os.cpu_count() or 1
    n = len(prompts)

    mparams = L.llama_model_default_params()
    mparams.use_extra_bufts = repack_here("auto")[0]
    model = L.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        raise RuntimeError(f"could not load {model_path}")
    # one sequence per prompt, each with a context of its own; no timing kept by llama.cpp
    n_seq = max(n, seqs or n)
    fields = {"n_ctx": SEQ_CTX * n_seq, "n_seq_max": n_seq, "n_batch": n_batch, "n_ubatch": n_batch}
    fields |= {"n_threads": threads, "n_threads_batch": threads, "kv_unified": False, "no_perf": True}
    cparams = L.llama_context_default_params()
    for name, value in fields.items():
        setattr(cparams, name, value)
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        L.llama_model_free(model)
        raise RuntimeError("could not create context")
    vocab = L.llama_model_get_vocab(model)
    sampler = L.llama_sampler_init_greedy()
    batch = L.llama_batch_init(max(n_batch, n), 0, 1)
    try:
        tokenized = [_tokenize(vocab, p)[:prompt_limit] for p in prompts]
        for toks in tokenized:
            if len(toks) + max_tokens > SEQ_CTX:
                raise ValueError("prompt + max_tokens exceeds the per-sequence context")

        def put(i: int, token: int, pos: int, seq: int, logits: bool) -> None:
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits

        t_start = time.perf_counter()
        last: list[int] = []
        for seq, toks in enumerate(tokenized):
            # One sequence per call, in chunks of n_batch; logits only for the last token.
            for start in range(0, len(toks), n_batch):
                chunk = toks[start : start + n_batch]
                for j, tok in enumerate(chunk):
                    put(j, tok, start + j, seq, start + j == len(toks) - 1)
                batch.n_tokens = len(chunk)
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("prefill decode failed")
            last.append(L.llama_sampler_sample(sampler, ctx, len(chunk) - 1))
        t_prefill = time.perf_counter()

        produced = [1] * n  # the token sampled after prefill is the first completion token
        pos = [len(t) for t in tokenized]
        while min(produced) < max_tokens:
            active = [s for s in range(n) if produced[s] < max_tokens]
            for j, seq in enumerate(active):
                put(j, last[seq], pos[seq], seq, True)
            batch.n_tokens = len(active)
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("decode failed")
            for j, seq in enumerate(active):
                last[seq] = L.llama_sampler_sample(sampler, ctx, j)
                pos[seq] += 1
                produced[seq] += 1
        t_end = time.perf_counter()
    finally:
        L.llama_batch_free(batch)
        L.llama_sampler_free(sampler)
        L.llama_free(ctx)
        L.llama_model_free(model)

    prompt_tokens = sum(len(t) for t in tokenized)
    completion = sum(produced)
    seconds = t_end - t_start
    decode_s = t_end - t_prefill
    # The first token of each stream comes out of prefill; decode made the rest.
    decode_tokens = completion - n
    return {
        "streams": n,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "exact_length": all(p == max_tokens for p in produced),
        "seconds": seconds,
        "prefill_s": t_prefill - t_start,
        "prefill_tokens_per_s": prompt_tokens / max(t_prefill - t_start, 1e-9),
        "tokens_per_s": completion / max(seconds, 1e-9),
        "decode_tokens_per_s": decode_tokens / max(decode_s, 1e-9) if decode_tokens else 0.0,
    }


QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in simple terms.",
    "List three prime numbers and explain why they are prime.",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Describe how a bicycle works.",
]


def chatml(question: str) -> str:
    """SmolLM2's chat template, written out so the bench needs no template engine."""
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


def default_prompts(streams: int) -> list[str]:
    return [chatml(QUESTIONS[i % len(QUESTIONS)]) for i in range(streams)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    model = args.model or default_model_path()
    header = (
        f"{'streams':>7} {'prompt':>7} {'compl':>7} {'seconds':>8} {'tok/s':>8}"
        f" {'decode tok/s':>13} {'prefill tok/s':>14}"
    )
    print(f"model {model}  max_tokens {args.max_tokens}  threads {args.threads or os.cpu_count()}")
    print(header)
    for streams in args.streams:
        r = run_bare_loop(model, default_prompts(streams), args.max_tokens, args.threads)
        print(
            f"{r['streams']:>7} {r['prompt_tokens']:>7} {r['completion_tokens']:>7} "
            f"{r['seconds']:>8.2f} {r['tokens_per_s']:>8.1f} {r['decode_tokens_per_s']:>13.1f} "
            f"{r['prefill_tokens_per_s']:>14.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
