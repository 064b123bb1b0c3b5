"""`specdec serve` through the official OpenAI client, against a live server on a free port of
127.0.0.1: every strategy's greedy completions equal offline generate(), a stream's pieces join to the
same text, seeded coupled samples are the same across strategies and runs, and 32 concurrent clients
(half streaming, greedy and sampled, mixed lengths) each get exactly their offline answer."""
from __future__ import annotations

import random
import threading

import openai
import pytest

from conftest import hf_greedy
from serve_helpers import scrape, target, tokenizer
from specdec import Speculator
from specdec.serve import Server
from zoo import strategies

PROMPTS = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "import os\nimport"]
LENGTHS = [24, 9, 17, 31]
SEED = 1234


@pytest.fixture(scope="module")
def model():
    return target()


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def completion(c: openai.OpenAI, server: Server, prompt: str, max_tokens: int, stream: bool = False, **extra):
    """(text, finish reason) of one completion; a stream's pieces joined."""
    extra_body = {k: extra.pop(k) for k in ("sampler", "top_k", "ignore_eos") if k in extra}
    response = c.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, stream=stream,
                                    extra_body=extra_body or None, **extra)
    if not stream:
        return response.choices[0].text, response.choices[0].finish_reason
    pieces, reasons = [], []
    for chunk in response:
        for choice in chunk.choices:
            pieces.append(choice.text)
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
    assert len(reasons) == 1, f"one finish_reason per choice, got {reasons}"
    return "".join(pieces), reasons[0]


def finish(reason: str) -> str:
    return {"eos": "stop", "stop": "stop", "length": "length"}[reason]


@pytest.fixture(scope="module")
def hf_reference(model):
    """Hugging Face generate(do_sample=False)'s texts: what every strategy's greedy answer must be."""
    tok = tokenizer()
    return [tok.decode(hf_greedy(model, tok(p)["input_ids"], n), skip_special_tokens=True)
            for p, n in zip(PROMPTS, LENGTHS)]


@pytest.fixture(scope="module")
def coupled_reference(model):
    """autoregressive's coupled samples (seed SEED) offline: what every strategy must serve."""
    sd = Speculator(model, tokenizer(), strategies(model)["autoregressive"]())
    return [sd.generate(p, max_new_tokens=n, temperature=0.8, top_p=0.95, seed=SEED, sampler="coupled")
            for p, n in zip(PROMPTS, LENGTHS)]


@pytest.mark.parametrize("name", list(strategies(target())))
def test_every_strategy_serves_its_offline_text(model, hf_reference, coupled_reference, name):
    sd = Speculator(model, tokenizer(), strategies(model)[name]())
    greedy = [sd.generate(p, max_new_tokens=n, temperature=0) for p, n in zip(PROMPTS, LENGTHS)]
    assert [g.text for g in greedy] == hf_reference
    with Server(sd) as server:
        c = client(server)
        for prompt, n, offline in zip(PROMPTS, LENGTHS, greedy):
            assert completion(c, server, prompt, n, temperature=0) == (offline.text, finish(offline.finish_reason))
        # a stream's pieces join to the same text
        assert completion(c, server, PROMPTS[0], LENGTHS[0], stream=True, temperature=0) == \
            (greedy[0].text, finish(greedy[0].finish_reason))
        # the coupled sampler: a seed means one text, whatever the strategy, and again on a second run
        for run in range(2):
            for prompt, n, offline in list(zip(PROMPTS, LENGTHS, coupled_reference))[run::2]:
                text, reason = completion(c, server, prompt, n, stream=run == 1, temperature=0.8, top_p=0.95,
                                          seed=SEED, sampler="coupled")
                assert (text, reason) == (offline.text, finish(offline.finish_reason)), (name, run, prompt)


def test_chat_uses_the_chat_template(model):
    sd = Speculator(model, tokenizer(), strategies(model)["prompt_lookup"]())
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    prompt = tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    offline = sd.generate(tokenizer()(prompt, add_special_tokens=False)["input_ids"], max_new_tokens=12, temperature=0)
    with Server(sd) as server:
        c = client(server)
        out = c.chat.completions.create(model=server.model, messages=messages, max_completion_tokens=12, temperature=0)
        assert out.choices[0].message.content == offline.text
        assert out.choices[0].message.role == "assistant"
        assert out.usage.completion_tokens == len(offline.token_ids)
        assert out.model_extra["specdec"]["strategy"] == "prompt_lookup"
        chunks = list(c.chat.completions.create(model=server.model, messages=messages, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == offline.text
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
            [finish(offline.finish_reason)]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(offline.token_ids)


def test_n_choices_and_stop_strings(model):
    sd = Speculator(model, tokenizer(), strategies(model)["draft chain"]())
    offline = [sd.generate(PROMPTS[0], max_new_tokens=20, temperature=0.9, seed=SEED + j, sampler="coupled")
               for j in range(3)]
    with Server(sd) as server:
        c = client(server)
        out = c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=20, temperature=0.9, seed=SEED,
                                   n=3, extra_body={"sampler": "coupled"})
        assert [ch.text for ch in sorted(out.choices, key=lambda ch: ch.index)] == [o.text for o in offline]
        assert out.usage.completion_tokens == sum(len(o.token_ids) for o in offline)
        # a stop string ends the text before it, as OpenAI's
        stop = offline[0].text[5:7]
        cut = offline[0].text[:offline[0].text.find(stop)]
        for stream in (False, True):
            assert completion(c, server, PROMPTS[0], 20, stream=stream, temperature=0.9, seed=SEED, stop=[stop],
                              sampler="coupled") == (cut, "stop")


def test_32_concurrent_clients_each_get_their_offline_answer(model):
    sd = Speculator(model, tokenizer(), strategies(model)["draft tree"]())
    rng = random.Random(0)
    jobs = [dict(prompt=rng.choice(PROMPTS), max_tokens=rng.randint(3, 40), stream=i % 2 == 0,
                 sampling=dict(temperature=0) if i % 3 else dict(temperature=0.9, seed=rng.randint(0, 10 ** 6),
                                                                 sampler="coupled"))
            for i in range(32)]
    offline = []
    for job in jobs:
        out = sd.generate(job["prompt"], max_new_tokens=job["max_tokens"], **job["sampling"])
        offline.append((out.text, finish(out.finish_reason)))
    answers: list = [None] * len(jobs)
    with Server(sd, max_batch=8) as server:
        c = client(server)
        start = threading.Barrier(len(jobs))

        def run(i):
            job = jobs[i]
            start.wait()
            try:
                answers[i] = completion(c, server, job["prompt"], job["max_tokens"], stream=job["stream"],
                                        **job["sampling"])
            except Exception as exc:  # noqa: BLE001 - reported below
                answers[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        metrics = scrape(server.url)
    wrong = [(i, answers[i], offline[i]) for i in range(len(jobs)) if answers[i] != offline[i]]
    assert not wrong, f"{len(wrong)} of {len(jobs)} answers differ from their offline answer: {wrong[:3]}"
    assert metrics["specdec:num_requests_running"] == 0 and metrics["specdec:num_requests_waiting"] == 0
    assert sum(v for k, v in metrics.items() if k.startswith("specdec:request_success_total")) == len(jobs)
