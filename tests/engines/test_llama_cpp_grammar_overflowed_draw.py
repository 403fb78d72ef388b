"""A constrained lane on llama.cpp whose grammar allows only banned tokens, under a sampler chain
that turns their finite ban into -inf: a temperature of 1e-30 to ~3e-30 (-1e9 / 1e-30 overflows
float32) or a huge repeat penalty on a banned token it has generated (-1e9 * 1e30). Every
candidate the grammar left is then -inf: the seeded draw's softmax is NaN, greedy takes the
first candidate, and either picks a token the grammar rejects; accepting it throws (or aborts)
in llama.cpp's C++ and ends the worker process, every request on it. The reply must instead be
a token the grammar allows, as at any other temperature or penalty.

Each case runs in a child process: the defect aborts the process that meets it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.harness import ROOT

pytestmark = pytest.mark.model

SCRIPT = """
import sys
from scheduler.core.types import SamplingParams
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.engines.models import default_model_path
from testkit.engine_driver import Run, chat, drive, release, text_of

case = sys.argv[1]
with LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=256, n_threads=2, adapt_threads=False) as e:
    prompt = chat(e, "Say a.")
    if case == "temperature":
        # ignore_eos bans the end-of-generation tokens, the only ones the grammar allows after "a"
        runs = [SamplingParams(temperature=t, grammar='root ::= "a"', ignore_eos=True, seed=1) for t in (1e-30, 2e-30)]
    else:
        # every token of only a's banned, the grammar wants six a's: each pick is a banned token, and
        # the repeat penalty multiplies a generated one's -1e9 to -inf
        only_a = tuple((t, -100.0) for t in range(e.vocab_size) if e.token_bytes(t) and set(e.token_bytes(t)) == {ord("a")})
        runs = [SamplingParams(temperature=1.0, grammar='root ::= "aaaaaa"', logit_bias=only_a, repeat_penalty=1e30, seed=s) for s in range(4)]
        # greedy picks the first of all -inf: a token the grammar rejects (llama.cpp aborts on it)
        runs += [SamplingParams(temperature=0.0, grammar=g, logit_bias=only_a, repeat_penalty=1e30) for g in ('root ::= "aaaaaa"', 'root ::= "a" "a" "a"')]
    for sp in runs:
        run = drive(e, [Run(0, prompt, sp, 10, stop_on_eog=True)])[0]
        release(e, 0)
        print(repr(text_of(e, run.output)), run.done, flush=True)
"""


@pytest.mark.parametrize("case", ["temperature", "penalty"])
def test_a_grammar_allowing_only_banned_tokens_under_an_overflowing_chain_gives_an_allowed_token(case: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, case], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-1500:]
    want = ["a"] * 2 if case == "temperature" else ["aaaaaa"] * 5 + ["aaa"]
    assert done.stdout.splitlines() == [f"{text!r} True" for text in want], done.stdout
