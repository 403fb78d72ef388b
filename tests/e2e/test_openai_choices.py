"""Several choices in one request (``n``), several prompts in one completions request, and
completions ``echo``, through the unmodified ``openai`` client against the real server and model."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
import openai
import pytest

from .server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]


def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server.base)


def test_chat_n_gives_n_different_choices_indexed_in_order_with_summed_usage(server: RunningServer) -> None:
    reply = client(server).chat.completions.create(model=MODEL, messages=STORY, n=3, max_tokens=24, temperature=1.0, seed=11)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert all(texts) and len(set(texts)) > 1  # sampled with seeds 11, 12, 13: not one answer three times
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert reply.usage is not None
    single = client(server).chat.completions.create(model=MODEL, messages=STORY, max_tokens=1)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the one prompt counted once
    assert reply.usage.completion_tokens <= 3 * 24 and reply.usage.completion_tokens >= 3
    again = client(server).chat.completions.create(model=MODEL, messages=STORY, n=3, max_tokens=24, temperature=1.0, seed=11)
    assert [c.message.content for c in again.choices] == texts  # the same seed, the same choices


def test_chat_n_streams_every_choice_to_its_finish_reason_then_one_usage_chunk(server: RunningServer) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL, messages=STORY, n=2, max_tokens=20, temperature=0.8, stream=True, stream_options={"include_usage": True}
    )
    text: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    roles: set[int] = set()
    ids, usage = set(), None
    for chunk in stream:
        ids.add(chunk.id)
        if not chunk.choices:
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        assert choice.index not in finish  # nothing after a choice's finish_reason
        if choice.delta.role:
            roles.add(choice.index)
        text[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finish[choice.index] = choice.finish_reason
    assert len(ids) == 1 and roles == {0, 1} and set(finish) == {0, 1}
    assert text[0] and text[1]
    assert usage is not None and usage.completion_tokens >= 2


def test_completions_n_streamed_and_not(server: RunningServer) -> None:
    c = client(server)
    reply = c.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=12, temperature=0)
    assert [ch.index for ch in reply.choices] == [0, 1]
    assert reply.choices[0].text and reply.choices[0].text == reply.choices[1].text  # greedy: the same text
    text: dict[int, str] = defaultdict(str)
    for chunk in c.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=12, temperature=0, stream=True):
        for ch in chunk.choices:
            text[ch.index] += ch.text
    assert set(text) == {0, 1} and text[0] == text[1] == reply.choices[0].text


def test_n_above_16_is_a_clear_400(server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(model=MODEL, messages=STORY, n=17, max_tokens=4)
    assert info.value.body["param"] == "n" and "16" in info.value.body["message"]  # type: ignore[index]


def test_several_prompts_give_one_choice_each_times_n_in_openai_order(server: RunningServer) -> None:
    c = client(server)
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    reply = c.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=8, temperature=0)
    assert [ch.index for ch in reply.choices] == [0, 1, 2, 3]
    texts = [ch.text for ch in reply.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]
    singles = [c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0) for p in prompts]
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)  # each prompt once
    streamed: dict[int, str] = defaultdict(str)
    for chunk in c.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=8, temperature=0, stream=True):
        for ch in chunk.choices:
            streamed[ch.index] += ch.text
    assert [streamed[i] for i in range(4)] == texts


def test_several_token_id_prompts_are_accepted(server: RunningServer) -> None:
    tokens = httpx.post(server.base + "/tokenize", json={"content": "The capital of France is"}, timeout=30).json()["tokens"]
    c = client(server)
    by_text = c.completions.create(model=MODEL, prompt=["The capital of France is", "Hello"], max_tokens=6, temperature=0)
    by_ids = c.completions.create(model=MODEL, prompt=[tokens, tokens[:2]], max_tokens=6, temperature=0)
    assert len(by_ids.choices) == 2 and by_ids.choices[0].text == by_text.choices[0].text


def test_echo_prepends_the_prompt_streamed_and_not(server: RunningServer) -> None:
    c = client(server)
    prompt = "Once upon a time, in a café,"
    plain = c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    echoed = c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    chunks = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, echo=True, stream=True) if ch.choices]
    assert chunks[0] == prompt and "".join(chunks) == echoed.choices[0].text
    tokens = httpx.post(server.base + "/tokenize", json={"content": prompt}, timeout=30).json()["tokens"]
    by_ids = c.completions.create(model=MODEL, prompt=tokens, max_tokens=8, temperature=0, echo=True)
    assert by_ids.choices[0].text == echoed.choices[0].text  # token ids echo as their text


def test_a_disconnect_cancels_every_choice(server: RunningServer) -> None:
    body = {"model": MODEL, "messages": STORY, "max_tokens": 1500, "ignore_eos": True, "n": 3, "stream": True}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=60) as r:
        seen: set[str] = set()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                seen.add(line.split('"index":', 1)[1][:1])
            if len(seen) == 3:
                # all three choices generate side by side (asked while the stream is still read
                # from: leaving the loop drops the line iterator, which closes the response)
                server.wait_for(lambda: server.state()["lanes_active"] == 3, timeout_s=30)
                break
    assert len(seen) == 3, seen  # the stream was left with all three choices generating, not read to its end
    # every lane is freed, long before 1500 tokens each could have been generated
    server.wait_for(lambda: server.state()["lanes_active"] == 0, timeout_s=10)


def test_the_n_choices_share_the_prompts_kv_instead_of_prefilling_it_n_times(server: RunningServer) -> None:
    nonce = str(time.time_ns())  # a prompt no earlier request shares a prefix with
    prompt = f"{nonce} " + "The quick brown fox jumps over the lazy dog. " * 6
    before = server.state()["counters"]["prefix_tokens_reused"]
    reply = client(server).completions.create(model=MODEL, prompt=prompt, n=4, max_tokens=4, temperature=0.7)
    assert len(reply.choices) == 4 and reply.usage is not None
    prompt_tokens = reply.usage.prompt_tokens
    assert prompt_tokens > 40
    reused = server.state()["counters"]["prefix_tokens_reused"] - before
    # three of the four lanes took the first lane's prefilled prompt (all but its last token)
    assert reused >= 3 * (prompt_tokens - 1)


def test_echo_with_logprobs_scores_the_prompt_tokens_as_the_model_would_generate_them(server: RunningServer) -> None:
    c = client(server)
    prompt = "The capital of France is"
    plain = c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    generated = plain.choices[0].text
    assert plain.choices[0].logprobs is not None
    n_prompt = plain.usage.prompt_tokens  # type: ignore[union-attr]
    # score the prompt followed by the greedy continuation: its tokens get the logprobs the
    # model gave them while generating (up to float noise of a different batch shape)
    scored = c.completions.create(model=MODEL, prompt=prompt + generated, max_tokens=1, temperature=0, echo=True, logprobs=2)
    lp = scored.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs is not None
    assert scored.choices[0].text.startswith(prompt + generated)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token: nothing before it
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert len(lp.tokens) == scored.usage.prompt_tokens + scored.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(lp.tokens) == scored.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    first_generated = plain.choices[0].logprobs.token_logprobs[0]
    assert lp.token_logprobs[n_prompt] == pytest.approx(first_generated, abs=0.05)
    # the two most likely, and the prompt's token where they lack it (OpenAI's logprobs + 1)
    assert all(len(alts) in (2, 3) and tok in alts for tok, alts in zip(lp.tokens[1:], lp.top_logprobs[1:], strict=True))
    # streamed: the prompt and its scores come first, then the completion's
    chunks = [ch.choices[0] for ch in c.completions.create(model=MODEL, prompt=prompt + generated, max_tokens=1, temperature=0,
                                                          echo=True, logprobs=2, stream=True) if ch.choices]
    assert chunks[0].text == prompt + generated
    streamed = [v for ch in chunks if ch.logprobs for v in ch.logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)
